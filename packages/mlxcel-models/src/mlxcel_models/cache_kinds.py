"""What each layer of an mlx-lm model keeps between tokens, and which of those the engine runs.

mlx-lm says it per layer through the caches its `make_cache()` returns (`KVCache` when a
model defines none): a plain `KVCache` is standard attention, a `RotatingKVCache` sliding-
window attention, `ArraysCache` (Mamba, Mamba-2, gated delta, RWKV, LFM2 convolutions)
recurrent state, `CacheList` several states in one layer, `ChunkedKVCache` chunked local
attention. mlxcel's engine stores attention keys and values in its paged cache; a sliding-
window layer runs there under the paged cache's windowed mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import mlx.nn as nn
from mlx_lm.models import cache as mlx_lm_cache

from mlxcel_models.errors import ModelLoadError


class UnsupportedCacheKindError(ModelLoadError):
    """A model has layers whose state mlxcel's engine cannot store."""


class CacheKind(StrEnum):
    """What one layer keeps between tokens."""

    ATTENTION = "attention"
    SLIDING_WINDOW = "sliding window"
    CHUNKED_ATTENTION = "chunked attention"
    RECURRENT = "recurrent state"
    COMPOSITE = "composite state"
    OTHER = "custom state"


ENGINE_CACHE_KINDS = frozenset({CacheKind.ATTENTION, CacheKind.SLIDING_WINDOW})
"""The kinds mlxcel's engine stores: keys and values in the paged KV cache."""

# Why the engine cannot run a layer of each other kind yet.
_MISSING = {
    CacheKind.CHUNKED_ATTENTION: "chunked local attention needs a chunked KV cache",
    CacheKind.RECURRENT: "needs recurrent state slots beside the paged KV cache",
    CacheKind.COMPOSITE: "keeps several caches in one layer (mlx-lm's CacheList: recurrent "
    "state beside keys and values, or an indexer's keys), which the paged KV cache does not "
    "store",
    CacheKind.OTHER: "keeps state in a cache class of its own",
}

# mlx-lm's cache classes, most specific first: a subclass must come before its base.
_KIND_OF_CLASS: tuple[tuple[type, CacheKind], ...] = (
    (mlx_lm_cache.RotatingKVCache, CacheKind.SLIDING_WINDOW),
    (mlx_lm_cache.ChunkedKVCache, CacheKind.CHUNKED_ATTENTION),
    (mlx_lm_cache.CacheList, CacheKind.COMPOSITE),
    (mlx_lm_cache.ArraysCache, CacheKind.RECURRENT),
    (mlx_lm_cache.KVCache, CacheKind.ATTENTION),
    (mlx_lm_cache.ConcatenateKVCache, CacheKind.ATTENTION),
)


def kind_of_cache_class(cache_class: type) -> CacheKind:
    """The kind of state an mlx-lm cache class holds; `OTHER` for a class mlx-lm's cache
    module does not define."""
    for known, kind in _KIND_OF_CLASS:
        if issubclass(cache_class, known):
            return kind
    return CacheKind.OTHER


def layer_cache_kinds(module: nn.Module) -> tuple[CacheKind, ...]:
    """Per cache entry of an mlx-lm `Model`, its kind (`mlx_lm.models.cache.make_prompt_cache`)."""
    return tuple(
        kind_of_cache_class(type(cache)) for cache in mlx_lm_cache.make_prompt_cache(module)
    )


def check_engine_cache_kinds(model_type: str, kinds: Sequence[CacheKind]) -> None:
    """Refuse a model with layers whose state the engine cannot store.

    Raises:
        UnsupportedCacheKindError: some layer's kind is not in `ENGINE_CACHE_KINDS`; the
            message names the kind, how many layers have it, and what it needs.
    """
    for kind in CacheKind:
        count = sum(layer_kind is kind for layer_kind in kinds)
        if count and kind not in ENGINE_CACHE_KINDS:
            raise UnsupportedCacheKindError(
                f"{model_type} models keep {kind.value} in {count} of their {len(kinds)} "
                f"layers, which mlxcel cannot run yet: it {_MISSING[kind]}"
            )
