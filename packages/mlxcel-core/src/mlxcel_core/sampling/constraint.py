"""Token constraints: a per-request rule on which tokens may come next (structured output).

mlxcel-core only applies the rule; what implements it (a grammar matcher over the model's
tokenizer) lives in a higher layer.
"""

from __future__ import annotations

from typing import Protocol

import mlx.core as mx


class TokenConstraint(Protocol):
    """Which tokens may follow the ones generated so far, e.g. a JSON-schema grammar.

    A constraint is stateful and owned by one request. The generation loop asks for the mask
    before each draw and reports the token drawn; once the constraint is complete it allows
    only end-of-sequence tokens, so generation ends with a stop token.
    """

    def allowed_mask(self, vocab_size: int) -> mx.array:
        """The tokens allowed next.

        Args:
            vocab_size: V, the width of the model's logits (may exceed the tokenizer's).

        Returns:
            (V,) bool, True where the token is allowed; at least one entry is True.
        """
        ...

    def advance(self, token_id: int) -> None:
        """Record the token drawn (one `allowed_mask` allowed).

        Raises:
            ValueError: the constraint does not allow `token_id`.
        """
        ...

    def rollback(self, num_tokens: int) -> None:
        """Undo the latest `num_tokens` advances (speculative decoding verifies draft
        tokens by advancing through them, then returns to where it was).

        Raises:
            ValueError: fewer than `num_tokens` advances can be undone.
        """
        ...


def apply_constraint(logits: mx.array, allowed: mx.array) -> mx.array:
    """Ban the tokens a constraint does not allow.

    Args:
        logits: (V,) float logits.
        allowed: (V,) bool from `TokenConstraint.allowed_mask`.

    Returns:
        (V,) logits with -inf where `allowed` is False.
    """
    return mx.where(allowed, logits, mx.array(-mx.inf, dtype=logits.dtype))
