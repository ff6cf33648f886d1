"""mlx-lm's cache classes as mlxcel's cache kinds, and mlxcel's caches as mlx-lm's.

An mlx-lm model says what each layer keeps through the caches its `make_cache()` makes
(`mlx_lm/models/cache.py`): `KVCache` for full attention, `RotatingKVCache(max_size=W)`
for a window of W positions, `ArraysCache(size=N)` for a recurrent state of N arrays,
and `CacheList` for a layer holding several. `mlx_lm_cache_layout` reads them into a
`CacheLayout`. The engine then hands the model its own caches in that shape;
`as_mlx_lm_caches` wraps the state ones as `ArraysCache`s (Mamba's layer writes its state
only into an `ArraysCache`) and the several parts of a layer as a `CacheList`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from mlxcel_core.cache.layout import CacheKind, CacheLayout, LayerCacheKind
from mlxcel_core.cache.protocol import AttentionCache, AttentionMask
from mlxcel_core.cache.state import CompositeCache, StateCache
from mlxcel_models.errors import ModelLoadError


class UnsupportedCacheError(ModelLoadError):
    """An mlx-lm model keeps a cache mlxcel's engine has no kind for."""


# The mlx-lm cache class of each kind. Exact types: a subclass may keep something else
# (a chunked or quantized cache).
_CLASS_OF_KIND = {
    CacheKind.ATTENTION: KVCache,
    CacheKind.SLIDING_WINDOW: RotatingKVCache,
    CacheKind.STATE: ArraysCache,
}
_KIND_OF_CLASS = {cache_class: kind for kind, cache_class in _CLASS_OF_KIND.items()}


def kind_of_cache_class(cache_class: type) -> CacheKind | None:
    """The kind of part an mlx-lm cache class keeps; None for a class with no kind here.
    `CacheList` is no kind of its own: its parts each have theirs."""
    return _KIND_OF_CLASS.get(cache_class)


def _part_kind(cache: object, layer: int) -> LayerCacheKind:
    if kind_of_cache_class(type(cache)) is None:
        raise UnsupportedCacheError(
            f"layer {layer} keeps a {type(cache).__name__}, which mlxcel's engine has no "
            "cache kind for"
        )
    if isinstance(cache, RotatingKVCache):
        if cache.keep:
            raise UnsupportedCacheError(
                f"layer {layer} keeps its first {cache.keep} positions beside a window "
                "of the last ones (RotatingKVCache with keep > 0), which the paged cache "
                "does not"
            )
        return LayerCacheKind.sliding_window(cache.max_size)
    if isinstance(cache, ArraysCache):
        return LayerCacheKind.state(len(cache.cache))
    return LayerCacheKind.attention()


def mlx_lm_cache_layout(module: nn.Module) -> CacheLayout:
    """What each layer of an mlx-lm model keeps, from the caches mlx-lm would make for it
    (its `make_cache()`, else one `KVCache` per layer, as `make_prompt_cache` does).

    Raises:
        UnsupportedCacheError: a layer keeps a cache with no kind here (a chunked or
            quantized cache, a window that also keeps its first positions, a `CacheList`
            inside a `CacheList`).
    """
    layers = []
    for index, cache in enumerate(make_prompt_cache(module)):
        if type(cache) is CacheList:
            parts = cache.caches
            if any(type(part) is CacheList for part in parts):
                raise UnsupportedCacheError(f"layer {index} nests a CacheList in a CacheList")
            layers.append(tuple(_part_kind(part, index) for part in parts))
        else:
            layers.append((_part_kind(cache, index),))
    return CacheLayout(tuple(layers))


def mlx_lm_cache_lists(module: nn.Module) -> frozenset[int]:
    """The layers of an mlx-lm model whose cache is a `CacheList` (one part or several),
    which the model indexes (`cache[0]`) however many parts it holds."""
    return frozenset(
        index for index, cache in enumerate(make_prompt_cache(module)) if type(cache) is CacheList
    )


class _StateArraysCache(ArraysCache):
    """An mlxcel `StateCache` behind mlx-lm's `ArraysCache` interface: indexing, unpacking,
    `lengths`, `advance` and `make_mask` go to the wrapped cache."""

    def __init__(self, state: StateCache) -> None:
        self._state = state
        self.lengths = state.lengths
        self.left_padding = None

    def __len__(self) -> int:
        return len(self._state)

    def __iter__(self) -> Iterator[mx.array | None]:
        return (self._state[index] for index in range(len(self._state)))

    def __getitem__(self, index: int) -> mx.array | None:
        return self._state[index]

    def __setitem__(self, index: int, value: mx.array) -> None:
        self._state[index] = value

    def advance(self, num_tokens: int) -> None:
        self._state.advance(num_tokens)

    def make_mask(self, num_queries: int) -> mx.array | None:
        return self._state.make_mask(num_queries)


class _ListedKVCache:
    """An attention part of a `CacheList` as mlx-lm's `KVCache` shows it: besides the
    cache protocol (handed to the wrapped cache), `keys` and `values` hold what the last
    `update_and_fetch` returned, as models with an indexer read them off the cache
    (DeepSeek V3.2's and MiniMax-M3's indexers, which also set them to shed their values
    or keep them in the graph: a paged cache has already stored them)."""

    def __init__(self, cache: Any) -> None:
        self._cache = cache
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    @property
    def offset(self) -> Any:
        return self._cache.offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.keys, self.values = self._cache.update_and_fetch(keys, values)
        return self.keys, self.values

    def make_mask(self, *args: Any, **kwargs: Any) -> Any:
        return self._cache.make_mask(*args, **kwargs)


class _ListedAttentionCache(_ListedKVCache):
    """A `_ListedKVCache` over a cache that computes attention (`AttentionCache`)."""

    def attention(
        self,
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        *,
        scale: float,
        mask: AttentionMask,
    ) -> mx.array | None:
        return self._cache.attention(queries, keys, values, scale=scale, mask=mask)


def _as_mlx_lm_part(cache: object) -> object:
    if isinstance(cache, StateCache):
        return _StateArraysCache(cache)
    if isinstance(cache, AttentionCache):
        return _ListedAttentionCache(cache)
    return _ListedKVCache(cache)


def _as_mlx_lm_cache(cache: object, listed: bool) -> object:
    if isinstance(cache, StateCache):
        return _StateArraysCache(cache)
    if isinstance(cache, CompositeCache):
        return CacheList(*(_as_mlx_lm_part(part) for part in cache.parts))
    return CacheList(_as_mlx_lm_part(cache)) if listed else cache


def as_mlx_lm_caches(caches: Sequence[object], lists: frozenset[int] = frozenset()) -> list[object]:
    """The engine's per-layer caches as mlx-lm's layers expect them: state caches as
    `ArraysCache`s, composite ones and those of the layers in `lists`
    (`mlx_lm_cache_lists`) as `CacheList`s, other attention caches as they are."""
    return [_as_mlx_lm_cache(cache, index in lists) for index, cache in enumerate(caches)]
