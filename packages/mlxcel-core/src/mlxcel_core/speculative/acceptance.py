"""Acceptance rules of speculative decoding: which draft tokens the target model keeps.

A step verifies k draft tokens d_1..d_k with the target's distributions p_0..p_k (p_j is
the distribution of the token after d_1..d_j). Each rule returns, lazily, which drafts pass
and the token to emit at every position where the chain may stop; the emitted tokens are
d_1..d_a then `tokens[a]`, where a is the number of leading passes. Both rules leave the
distribution of the emitted text exactly the target's:

- `REJECTION`: speculative sampling (Leviathan et al., "Fast Inference from Transformers via
  Speculative Decoding", 2023; Chen et al., "Accelerating Large Language Model Decoding with
  Speculative Sampling", 2023). d_j passes with probability min(1, p(d_j) / q(d_j)); at the
  first rejection the token is drawn from norm(max(p - q, 0)); after k passes, from p_k.
- `EXACT`: a token is drawn from each p_j and d_j passes when it equals that draw. The
  emitted tokens are the target's own draws, so the rule is exact by construction; it
  accepts less often than `REJECTION` at temperature > 0 and is the same at temperature 0,
  where the draw is the argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import mlx.core as mx


class AcceptanceRule(StrEnum):
    """How draft tokens are accepted (see the module docstring)."""

    REJECTION = "rejection"
    EXACT = "exact"


@dataclass(frozen=True)
class Verdict:
    """One row's verification, not yet evaluated.

    Attributes:
        accepted: (k,) bool, whether draft j passes (only the leading run counts).
        tokens: (k + 1,) int32, the token emitted if the chain stops at position j.
    """

    accepted: mx.array
    tokens: mx.array

    def arrays(self) -> tuple[mx.array, mx.array]:
        return self.accepted, self.tokens


def num_leading_accepted(accepted: Sequence[bool]) -> int:
    """The number of drafts kept: the passes before the first failure."""
    for position, passed in enumerate(accepted):
        if not passed:
            return position
    return len(accepted)


def exact_match(target_tokens: mx.array, draft_tokens: mx.array) -> Verdict:
    """The `EXACT` rule.

    Args:
        target_tokens: (k + 1,) int32, a token drawn from each of p_0..p_k.
        draft_tokens: (k,) int32 drafts.
    """
    k = draft_tokens.shape[0]
    return Verdict(draft_tokens == target_tokens[:k], target_tokens.astype(mx.int32))


def rejection_sample(
    target_probs: mx.array,
    draft_tokens: mx.array,
    draft_probs: mx.array | None,
    key: mx.array,
) -> Verdict:
    """The `REJECTION` rule (speculative sampling).

    Args:
        target_probs: (k + 1, V) float32 target distributions p_0..p_k.
        draft_tokens: (k,) int32 drafts, d_j drawn from draft_probs[j].
        draft_probs: (k, V) float32 draft distributions q, or None when each draft was
            chosen deterministically (q is then one-hot on d_j, as for prompt lookup).
        key: the random key of this verification.

    Returns:
        The verdict; `tokens[j]` for j < k is drawn from norm(max(p_j - q_j, 0)) (p_j itself
        where that vanishes, which only happens when p_j = q_j and d_j always passes).
    """
    k = draft_tokens.shape[0]
    accept_key, draw_key = mx.random.split(key)
    p = target_probs[:k]
    p_draft = mx.take_along_axis(p, draft_tokens[:, None], axis=1)[:, 0]
    if draft_probs is None:
        q_draft = mx.ones_like(p_draft)
        one_hot = mx.arange(p.shape[1])[None, :] == draft_tokens[:, None]
        residual = mx.where(one_hot, 0.0, p)
    else:
        q_draft = mx.take_along_axis(draft_probs, draft_tokens[:, None], axis=1)[:, 0]
        residual = mx.maximum(p - draft_probs, 0.0)
    # u < p/q, written without dividing by q.
    accepted = mx.random.uniform(shape=(k,), key=accept_key) * q_draft < p_draft
    residual = mx.where(residual.sum(axis=1, keepdims=True) > 0, residual, p)
    rows = mx.concatenate([residual, target_probs[k:]], axis=0)
    tokens = mx.random.categorical(mx.log(rows), axis=-1, key=draw_key).astype(mx.int32)
    return Verdict(accepted, tokens)
