"""mlx-lm model classes behind mlxcel-core's `LanguageModel` protocol."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from mlxcel_core.cache import DenseKVCache, KVCache
from mlxcel_models.cache_attention import route_attention_through_caches


class MlxLmLanguageModel:
    """An mlx-lm decoder (`model.model` body, then a tied or separate LM head).

    Runs the body on all positions but the LM head only where logits are needed: during
    prefill that saves a (L, hidden) x (hidden, vocab) matmul per chunk. Its attention
    layers let caches that compute attention do so (`route_attention_through_caches`).

    Args:
        module: an mlx-lm `Model` whose `model` attribute is the decoder body and whose
            `args.tie_word_embeddings` says where the head lives.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._body = module.model
        self._tied = bool(module.args.tie_word_embeddings)
        route_attention_through_caches(module)

    @property
    def num_layers(self) -> int:
        return len(self._body.layers)

    def make_cache(self) -> list[KVCache]:
        return [DenseKVCache() for _ in range(self.num_layers)]

    def __call__(
        self, tokens: mx.array, cache: Sequence[KVCache], *, last_only: bool = False
    ) -> mx.array:
        hidden = self._body(tokens, cache=cache)
        if last_only:
            hidden = hidden[:, -1:, :]
        if self._tied:
            return self._body.embed_tokens.as_linear(hidden)
        return self.module.lm_head(hidden)
