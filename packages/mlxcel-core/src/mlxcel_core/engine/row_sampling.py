"""Sampling one row of a batched step with its own request's chain, constraint and stream."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.engine.sequence import Sequence
from mlxcel_core.logprobs import PendingLogprobs, make_logprobs
from mlxcel_core.sampling.constraint import apply_constraint


@dataclass(frozen=True)
class Draw:
    """A row's sampled token and log probabilities, not yet evaluated.

    Attributes:
        sequence: the row's sequence.
        token: () int32 token id.
        logprobs: its log probabilities when the request asked for them, else None.
    """

    sequence: Sequence
    token: mx.array
    logprobs: PendingLogprobs | None


def draw_next_token(sequence: Sequence, logits: mx.array) -> Draw:
    """Sample `sequence`'s next token from its row's (V,) logits, lazily.

    The request's constraint masks the logits first; log probabilities are those of the raw
    logits. The penalties see the sequence's whole history (prompt and generated).
    """
    request = sequence.request
    allowed = logits
    if request.constraint is not None:
        allowed = apply_constraint(logits, request.constraint.allowed_mask(logits.shape[-1]))
    token = sequence.sampler(allowed, mx.array(sequence.token_ids, dtype=mx.int32))
    k = request.generation.num_top_logprobs
    return Draw(sequence, token, None if k is None else make_logprobs(logits, token, k))
