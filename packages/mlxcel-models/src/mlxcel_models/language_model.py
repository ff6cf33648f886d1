"""mlx-lm model classes behind mlxcel-core's `LanguageModel` protocol."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from mlxcel_core.cache import DenseKVCache, KVCache
from mlxcel_core.cache.layout import CacheLayout
from mlxcel_models.additive_masks import route_additive_masks
from mlxcel_models.cache_attention import route_attention_through_caches
from mlxcel_models.cache_kinds import mlx_lm_cache_layout, mlx_lm_caches
from mlxcel_models.plain_kernels import route_plain_kernels

# Tokens of the probe that checks a body/head split against the module's own forward pass.
_PROBE_TOKENS = (1, 2, 3)


class MlxLmLanguageModel:
    """Any mlx-lm text `Model`, with its LM head run only where logits are needed.

    mlx-lm's families differ in what follows the decoder body (a tied or separate head,
    logit scaling or soft-capping, a `language_model` wrapper), so the model is first run
    as its own `__call__` defines it. Where that forward pass equals the decoder body
    (`model`) followed by the head (`lm_head`, else the tied `embed_tokens`), checked once
    on a few tokens, and every layer keeps one attention cache, prefill computes the head
    on the last position only: that saves a (L, hidden) x (hidden, vocab) matmul and an
    (L, vocab) logits array per chunk. Any other model runs its own `__call__` and keeps
    the last position's logits. Its attention layers let caches that compute attention do
    so (`route_attention_through_caches`), layers that add their mask to their scores get
    it as scores (`route_additive_masks`), and layers mlx-lm runs only as Metal kernels
    get plain-MLX paths on other devices (`route_plain_kernels`). What each layer keeps
    (`cache_layout`) comes from mlx-lm's own caches for it, and the engine's caches for
    layers that keep more than keys and values reach the model as mlx-lm's
    (`MlxLmCaches.as_mlx_lm`).

    Args:
        module: an mlx-lm `Model`, weights loaded.
        batches_rows: whether rows of different contexts may share a forward pass
            (`RowBatchingModel`); False for a family that reads its caches' offset as one
            integer or otherwise assumes one context per pass.

    Raises:
        UnsupportedCacheError: a layer keeps a cache the engine has no kind for.
    """

    def __init__(self, module: nn.Module, *, batches_rows: bool = True) -> None:
        self._adopt(module, batches_rows)
        probe = mx.array([_PROBE_TOKENS], dtype=mx.int32)
        logits = module(probe, cache=make_prompt_cache(module))
        # Evaluating the probe also materializes arrays the model computed lazily when it
        # was built (RoPE tables), which a graph evaluated on another thread (the engine's)
        # could not evaluate: MLX streams belong to the thread that made them.
        mx.eval(logits)
        self.vocab_size = int(logits.shape[-1])
        self._split = _body_and_head(module, probe, logits) if self._plain else None

    @classmethod
    def for_tracing(cls, module: nn.Module) -> MlxLmLanguageModel:
        """The model of `module` without the probe pass: it runs the module's own
        `__call__` and evaluates nothing when built, so a module whose weights are MLX's
        lazy random initialization stays unevaluated (`vocab_size` is unknown: 0). For
        tracing what its caches hold before the real weights are loaded.

        Raises:
            UnsupportedCacheError: a layer keeps a cache the engine has no kind for.
        """
        model = cls.__new__(cls)
        model._adopt(module, batches_rows=True)
        model.vocab_size = 0
        model._split = None
        return model

    def _adopt(self, module: nn.Module, batches_rows: bool) -> None:
        self.module = module
        self.batches_rows = batches_rows
        # The family's, fixed: whether the engine's caches reach the model as they are.
        self._caches = mlx_lm_caches(module)
        self._plain = self._caches.fit_as_they_are
        route_attention_through_caches(module)
        route_additive_masks(module)
        route_plain_kernels(module)

    @property
    def num_layers(self) -> int:
        """Decoder layers (mlx-lm's `layers`)."""
        return len(self.module.layers)

    @property
    def splits_head(self) -> bool:
        """Whether prefill runs the LM head on the last position only."""
        return self._split is not None

    @property
    def cache_layout(self) -> CacheLayout:
        """What each layer keeps (`mlx_lm_cache_layout`), read from the module as it is
        now (weight surgery or a shallow draft may have removed layers)."""
        return mlx_lm_cache_layout(self.module)

    def make_cache(self) -> list[KVCache]:
        """A dense KV cache per layer; mlx-lm's own caches for a model whose caches the
        engine's do not fit as they are (`MlxLmCaches.fit_as_they_are`)."""
        caches = make_prompt_cache(self.module)
        if not self._plain:
            return caches
        return [DenseKVCache() for _ in caches]

    def __call__(
        self, tokens: mx.array, cache: Sequence[KVCache], *, last_only: bool = False
    ) -> mx.array:
        if not self._plain:
            cache = self._caches.as_mlx_lm(cache)  # type: ignore[assignment]
        if self._split is None:
            logits = self.module(tokens, cache=cache)
            return logits[:, -1:, :] if last_only else logits
        body, head = self._split
        hidden = body()(tokens, cache=cache)
        return head(hidden[:, -1:, :] if last_only else hidden)


_Split = tuple[Callable[[], nn.Module], Callable[[mx.array], mx.array]]


def _body_and_head(module: nn.Module, probe: mx.array, logits: mx.array) -> _Split | None:
    """The decoder body and LM head of `module` (its own, or its `language_model`'s) when
    running them in turn gives `logits` on `probe`; None otherwise.

    Both are looked up at each call, so layers replaced later (LoRA, sharding) are used.
    """
    language_model = module
    while isinstance(language_model.get("language_model"), nn.Module):
        language_model = language_model["language_model"]
    body = language_model.get("model")
    if not isinstance(body, nn.Module):
        return None
    lm, body_name = language_model, "model"

    def find_body() -> nn.Module:
        return lm[body_name]

    if isinstance(lm.get("lm_head"), nn.Module):

        def head(hidden: mx.array) -> mx.array:
            return lm["lm_head"](hidden)

    elif isinstance(body.get("embed_tokens"), nn.Embedding | nn.QuantizedEmbedding):

        def head(hidden: mx.array) -> mx.array:
            return lm[body_name]["embed_tokens"].as_linear(hidden)

    else:
        return None
    try:
        split_logits = head(find_body()(probe, cache=make_prompt_cache(module)))
    # A body that is not a plain (tokens, cache) decoder fails in its own way.
    except (TypeError, ValueError, AttributeError, IndexError):
        return None
    if split_logits.shape != logits.shape or not mx.allclose(split_logits, logits).item():
        return None
    return find_body, head
