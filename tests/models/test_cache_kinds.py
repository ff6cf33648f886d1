"""mlx-lm's cache classes read as mlxcel cache kinds, and the engine's caches handed back."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache, CacheList, ChunkedKVCache, KVCache, RotatingKVCache

from mlxcel_core.cache.layout import CacheLayout, LayerCacheKind
from mlxcel_core.cache.state import CompositeCache, SlotStateCache, StateArrayGeometry, StatePool
from mlxcel_models.cache_kinds import (
    UnsupportedCacheError,
    as_mlx_lm_caches,
    mlx_lm_cache_layout,
)

ATTENTION = LayerCacheKind.attention()


class _Module:
    """What `mlx_lm_cache_layout` reads of an mlx-lm model: its `make_cache`."""

    def __init__(self, *caches: object) -> None:
        self._caches = caches

    def make_cache(self) -> list[object]:
        return list(self._caches)


def test_each_mlx_lm_cache_class_maps_to_its_kind():
    module = _Module(
        KVCache(),
        RotatingKVCache(max_size=512),
        ArraysCache(size=2),
        CacheList(ArraysCache(size=2), KVCache()),
    )
    assert mlx_lm_cache_layout(module) == CacheLayout.of(
        [
            [ATTENTION],
            [LayerCacheKind.sliding_window(512)],
            [LayerCacheKind.state(2)],
            [LayerCacheKind.state(2), ATTENTION],
        ]
    )


@pytest.mark.parametrize(
    ("cache", "match"),
    [
        (ChunkedKVCache(chunk_size=8), "layer 0 keeps a ChunkedKVCache"),
        (RotatingKVCache(max_size=8, keep=4), "keeps its first 4 positions"),
        (CacheList(CacheList(KVCache())), "nests a CacheList"),
    ],
)
def test_caches_with_no_kind_are_refused_by_name(cache, match):
    with pytest.raises(UnsupportedCacheError, match=match):
        mlx_lm_cache_layout(_Module(cache))


def test_the_engines_state_caches_reach_mlx_lm_as_arrays_caches():
    pool = StatePool([(StateArrayGeometry((2,), mx.float32),)], num_slots=2)
    state = SlotStateCache(pool, 0, mx.array([1]), fresh=True)
    attention = object()
    plain, composite = as_mlx_lm_caches([attention, CompositeCache([state, attention])])
    assert plain is attention
    assert isinstance(composite, CacheList) and composite[1] is attention
    arrays = composite[0]
    assert isinstance(arrays, ArraysCache)  # Mamba writes its state only into one
    assert arrays[0] is None and arrays.lengths is None and arrays.make_mask(3) is None
    arrays[0] = mx.ones((1, 2))
    assert state[0] is arrays[0]
    arrays.advance(3)
