"""Attention within groups of consecutive tokens (an image's frames, Qwen2.5-VL's windows),
run as one batch of padded groups instead of one (N, N) mask over the whole image."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np


@dataclass(frozen=True)
class AttentionGroups:
    """Where each group's tokens sit in a padded (groups, size) layout.

    Attributes:
        gather: (G, S) int32 token of each slot; a group shorter than S repeats its last
            token in the padding slots.
        key_mask: (G, 1, 1, S) bool, False on padding slots; None when no group is padded.
        slot_of_token: (N,) int32 flat slot (g * S + j) holding each token.
    """

    gather: mx.array
    key_mask: mx.array | None
    slot_of_token: mx.array


def make_attention_groups(segments: np.ndarray) -> AttentionGroups | None:
    """The groups of tokens sharing a segment id; None when all N tokens form one group.

    Args:
        segments: (N,) segment id of each token; each segment's tokens are consecutive.

    Raises:
        ValueError: a segment's tokens are not consecutive.
    """
    boundaries = np.flatnonzero(np.diff(segments)) + 1
    starts = np.concatenate([[0], boundaries])
    if len(np.unique(segments)) != len(starts):
        raise ValueError("each attention group's tokens must be consecutive")
    if len(starts) == 1:
        return None
    counts = np.diff(np.concatenate([starts, [len(segments)]]))
    size = int(counts.max())
    slots = np.arange(size)
    gather = starts[:, None] + np.minimum(slots, counts[:, None] - 1)
    valid = slots < counts[:, None]
    slot_of_token = (np.arange(len(starts))[:, None] * size + slots)[valid]
    return AttentionGroups(
        gather=mx.array(gather.astype(np.int32)),
        key_mask=None if valid.all() else mx.array(valid[:, None, None, :]),
        slot_of_token=mx.array(slot_of_token.astype(np.int32)),
    )
