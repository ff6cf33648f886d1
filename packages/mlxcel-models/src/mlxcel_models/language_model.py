"""mlx-lm model classes behind mlxcel-core's `LanguageModel` protocol."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from mlxcel_core.cache import DenseKVCache, KVCache
from mlxcel_core.cache.layout import CacheLayout
from mlxcel_models.cache_attention import route_attention_through_caches
from mlxcel_models.cache_kinds import as_mlx_lm_caches, mlx_lm_cache_layout


class MlxLmLanguageModel:
    """An mlx-lm decoder (`model.model` body, then a tied or separate LM head).

    Runs the body on all positions but the LM head only where logits are needed: during
    prefill that saves a (L, hidden) x (hidden, vocab) matmul per chunk. A model whose
    layers keep more than keys and values (`cache_layout`: recurrent states, several caches
    per layer), or that has no `model` body, runs whole instead, its logits cut afterwards:
    such families put their own touches on the head (soft-capping, multipliers) that the
    split would skip. Its attention layers let caches that compute attention do so
    (`route_attention_through_caches`); what each layer keeps comes from mlx-lm's own
    caches for it.

    Args:
        module: an mlx-lm `Model`; where its layout is plain, its `model` attribute, if
            any, is the decoder body, and its head is its `lm_head` where it has one, else
            the body's embedding (mlx-lm leaves `lm_head` out of a tied model, or, as
            Gemma 3 does, removes it when the checkpoint has none).

    Raises:
        UnsupportedCacheError: a layer keeps a cache the engine has no kind for.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        # Whether a layer keeps more than one attention cache: the family's, fixed.
        self._hybrid = not mlx_lm_cache_layout(module).is_plain
        self._body = None if self._hybrid else module.get("model")
        self._tied = self._body is not None and "lm_head" not in module
        route_attention_through_caches(module)

    @property
    def num_layers(self) -> int:
        return len((self.module if self._body is None else self._body).layers)

    @property
    def cache_layout(self) -> CacheLayout:
        """What each layer keeps (`mlx_lm_cache_layout`), read from the module as it is
        now (weight surgery may have removed layers)."""
        return mlx_lm_cache_layout(self.module)

    def make_cache(self) -> list[KVCache]:
        """A dense KV cache per attention layer; mlx-lm's own caches for a model with
        layers that keep a recurrent state or several caches."""
        if not self._hybrid:
            return [DenseKVCache() for _ in range(self.num_layers)]
        return make_prompt_cache(self.module)

    def __call__(
        self, tokens: mx.array, cache: Sequence[KVCache], *, last_only: bool = False
    ) -> mx.array:
        if self._hybrid:
            cache = as_mlx_lm_caches(cache)  # type: ignore[assignment]
        if self._body is None:
            logits = self.module(tokens, cache=cache)
            return logits[:, -1:, :] if last_only else logits
        hidden = self._body(tokens, cache=cache)
        if last_only:
            hidden = hidden[:, -1:, :]
        if self._tied:
            return self._body.embed_tokens.as_linear(hidden)
        return self.module.lm_head(hidden)
