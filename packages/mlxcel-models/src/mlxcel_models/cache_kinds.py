"""mlx-lm's cache classes as mlxcel's cache kinds, and mlxcel's caches as mlx-lm's.

An mlx-lm model says what each layer keeps through the caches its `make_cache()` makes
(`mlx_lm/models/cache.py`): `KVCache` for full attention, `RotatingKVCache(max_size=W)`
for a window of W positions, `ChunkedKVCache(W)` for attention within chunks of W
positions, `ArraysCache(size=N)` for a recurrent state of N arrays, and `CacheList` for
a layer holding several. `mlx_lm_caches` reads them into a `CacheLayout`. The engine then
hands the model its own caches in that shape; `MlxLmCaches.as_mlx_lm` shows them as the
model's layers expect mlx-lm's: state caches as `ArraysCache`s (Mamba's layer writes its
state only into one), a `CacheList` where the model made one, and the interface a
layer reads off its cache beyond the cache protocol.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from mlxcel_core.cache.layout import CacheKind, CacheLayout, LayerCache, LayerCacheKind
from mlxcel_core.cache.protocol import AttentionCache, AttentionMask
from mlxcel_core.cache.state import CompositeCache, StateCache
from mlxcel_models.errors import ModelLoadError


class UnsupportedCacheError(ModelLoadError):
    """An mlx-lm model keeps a cache mlxcel's engine has no kind for."""

    def of_model(self, path: str | Path, model_type: str) -> UnsupportedCacheError:
        """The same refusal, naming the model's files and type."""
        return UnsupportedCacheError(f"{path}: mlxcel cannot run this {model_type} model: {self}")


# The mlx-lm cache class of each kind. Exact types: a subclass may keep something else
# (a chunked or quantized cache).
_CLASS_OF_KIND = {
    CacheKind.ATTENTION: KVCache,
    CacheKind.SLIDING_WINDOW: RotatingKVCache,
    CacheKind.CHUNKED: ChunkedKVCache,
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
    if isinstance(cache, ChunkedKVCache):
        return LayerCacheKind.chunked(cache.chunk_size)
    if isinstance(cache, ArraysCache):
        return LayerCacheKind.state(len(cache.cache))
    return LayerCacheKind.attention()


@dataclass(frozen=True)
class MlxLmCaches:
    """The shape of an mlx-lm model's caches.

    Attributes:
        layout: what each layer keeps.
        lists: the layers whose cache is a `CacheList` (of one part or several), which
            the model indexes (`cache[0]`) however many parts it holds.
    """

    layout: CacheLayout
    lists: frozenset[int] = frozenset()

    @property
    def fit_as_they_are(self) -> bool:
        """Whether the engine's caches reach the model unwrapped: every layer keeps one
        full or windowed attention cache, in no `CacheList`."""
        kinds = self.layout.kinds
        return self.layout.is_plain and not self.lists and CacheKind.CHUNKED not in kinds

    def as_mlx_lm(self, caches: Sequence[object]) -> list[object]:
        """The engine's per-layer caches (in the layout's shape) as mlx-lm's layers expect
        them: state caches as `ArraysCache`s, composite ones and those of the layers in
        `lists` as `CacheList`s, chunked ones as `ChunkedKVCache`s, the attention parts
        of a `CacheList` with their `keys` and `values`, other attention caches (and
        mlx-lm's own) as they are."""
        return [
            _as_mlx_lm_cache(cache, parts, index in self.lists)
            for index, (cache, parts) in enumerate(zip(caches, self.layout.layers, strict=True))
        ]


def mlx_lm_caches(module: nn.Module) -> MlxLmCaches:
    """The shape of the caches mlx-lm would make for an mlx-lm model (its `make_cache()`,
    else one `KVCache` per layer, as `make_prompt_cache` does).

    Raises:
        UnsupportedCacheError: a layer keeps a cache with no kind here (a quantized cache,
            one the model defines itself, a window that also keeps its first positions, a
            `CacheList` inside a `CacheList`).
    """
    layers, lists = [], set()
    for index, cache in enumerate(make_prompt_cache(module)):
        if type(cache) is CacheList:
            lists.add(index)
            parts = cache.caches
            if any(type(part) is CacheList for part in parts):
                raise UnsupportedCacheError(f"layer {index} nests a CacheList in a CacheList")
            layers.append(tuple(_part_kind(part, index) for part in parts))
        else:
            layers.append((_part_kind(cache, index),))
    return MlxLmCaches(CacheLayout(tuple(layers)), frozenset(lists))


def mlx_lm_cache_layout(module: nn.Module) -> CacheLayout:
    """What each layer of an mlx-lm model keeps (`mlx_lm_caches`).

    Raises:
        UnsupportedCacheError: as `mlx_lm_caches`.
    """
    return mlx_lm_caches(module).layout


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


class _KVCacheView:
    """An engine attention cache as mlx-lm's `KVCache` shows it: the cache protocol and
    `attention` (`AttentionCache`, declined when the wrapped cache computes none) handed
    to it, and `keys` and `values` holding what the last `update_and_fetch` returned, as
    models with an indexer read them off the cache (DeepSeek V3.2's and MiniMax-M3's
    indexers, which also set them, to shed their values or keep them in the graph: the
    engine's cache has already stored them)."""

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

    def attention(
        self,
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        *,
        scale: float,
        mask: AttentionMask,
    ) -> mx.array | None:
        if not isinstance(self._cache, AttentionCache):
            return None
        return self._cache.attention(queries, keys, values, scale=scale, mask=mask)


class _ChunkedKVCacheView(_KVCacheView):
    """A chunked-attention layer's cache as mlx-lm's `ChunkedKVCache` shows it (Llama 4):
    the engine keeps every position of the chunk-aligned window, so nothing is trimmed
    from the front: `start_position` stays 0, and the model's chunk mask, which it builds
    from that, hides the positions before each query's chunk."""

    start_position = 0

    def maybe_trim_front(self) -> None:
        """Nothing to trim (see the class)."""


def _as_mlx_lm_part(cache: object, part: LayerCacheKind) -> object:
    if isinstance(cache, StateCache):
        return _StateArraysCache(cache)
    if part.kind is CacheKind.CHUNKED:
        return _ChunkedKVCacheView(cache)
    return _KVCacheView(cache)


# mlx-lm's own caches (`MlxLmLanguageModel.make_cache` for a single sequence) pass as
# they are.
_MLX_LM_CACHES = (KVCache, RotatingKVCache, ChunkedKVCache, ArraysCache, CacheList)


def _as_mlx_lm_cache(cache: object, parts: LayerCache, listed: bool) -> object:
    if isinstance(cache, _MLX_LM_CACHES):
        return cache
    if isinstance(cache, CompositeCache) or listed:
        members = cache.parts if isinstance(cache, CompositeCache) else (cache,)
        return CacheList(*map(_as_mlx_lm_part, members, parts))
    if isinstance(cache, StateCache) or parts[0].kind is CacheKind.CHUNKED:
        return _as_mlx_lm_part(cache, parts[0])
    return cache
