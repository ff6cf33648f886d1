"""The model interface the generation loop and the engine run: token ids in, logits out,
over mlxcel KV caches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import mlx.core as mx

from mlxcel_core.cache import KVCache


class LanguageModel(Protocol):
    """A causal language model over mlxcel KV caches."""

    def make_cache(self) -> list[KVCache]:
        """One empty KV cache per attention layer."""
        ...

    def __call__(
        self, tokens: mx.array, cache: Sequence[KVCache], *, last_only: bool = False
    ) -> mx.array:
        """Run the model on new tokens, extending `cache`.

        Args:
            tokens: (B, L) int32 token ids following what `cache` holds.
            cache: the per-layer caches from `make_cache`, updated in place.
            last_only: compute logits for the last position only.

        Returns:
            Logits (B, L, V), or (B, 1, V) with `last_only`.
        """
        ...
