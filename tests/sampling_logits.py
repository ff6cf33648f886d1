"""A hand-computed distribution over five tokens for the sampler tests, and the set of
tokens a stage leaves finite."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

# Token 0 is the most likely; the others are listed out of order to catch index mix-ups.
PROBS = np.array([0.5, 0.1, 0.2, 0.05, 0.15], dtype=np.float32)
LOGITS = mx.array(np.log(PROBS))


def kept(logits: mx.array) -> set[int]:
    """The token ids whose logits are finite (not removed by a stage)."""
    return {int(i) for i in np.flatnonzero(np.isfinite(np.array(logits)))}
