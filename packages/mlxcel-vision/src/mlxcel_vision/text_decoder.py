"""An mlx-lm text model run on embeddings: the `TextDecoder` of families whose language
model is a plain mlx-lm architecture (positions follow the cache offset, no multimodal RoPE)."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from mlxcel_core.cache import KVCache
from mlxcel_core.images import RowImages


class MlxLmTextDecoder:
    """A `TextDecoder` over an mlx-lm `Model` (`model` body with `embed_tokens` and
    `layers`, then a tied or separate `lm_head`).

    Args:
        module: the mlx-lm `Model`, weights loaded.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._body = module.model
        self._tied = bool(module.args.tie_word_embeddings)

    @property
    def num_layers(self) -> int:
        return len(self._body.layers)

    def embed(self, tokens: mx.array) -> mx.array:
        """(B, L) int32 token ids -> (B, L, hidden) embeddings in the activation dtype."""
        return self._body.embed_tokens(tokens)

    def __call__(
        self,
        embeddings: mx.array,
        cache: Sequence[KVCache],
        *,
        images: Sequence[RowImages] | None = None,
        last_only: bool = False,
    ) -> mx.array:
        """Logits (B, L, V), or (B, 1, V) with `last_only`, for (B, L, hidden) embeddings
        following what `cache` holds; `images` do not change positions here."""
        hidden = self._body(None, cache=cache, input_embeddings=embeddings)
        if last_only:
            hidden = hidden[:, -1:, :]
        if self._tied:
            return self._body.embed_tokens.as_linear(hidden)
        return self.module.lm_head(hidden)
