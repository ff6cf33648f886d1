"""Cache kinds, the cache layout the engine reads from a model, and the state slots."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.cache.block_groups import BlockGroups
from mlxcel_core.cache.layout import (
    CacheKind,
    CacheLayout,
    LayerCacheKind,
    joint_kv_window,
    model_cache_layout,
)
from mlxcel_core.cache.state import (
    SlotStateCache,
    StateArrayGeometry,
    StatePool,
    state_bytes_per_sequence,
)

ATTENTION = LayerCacheKind.attention()
STATE = LayerCacheKind.state(2)


def window(size: int) -> LayerCacheKind:
    return LayerCacheKind.sliding_window(size)


def test_kinds_take_only_their_own_settings():
    assert window(8).kind is CacheKind.SLIDING_WINDOW and window(8).window_size == 8
    with pytest.raises(ValueError, match="window_size >= 1, got 0"):
        window(0)
    with pytest.raises(ValueError, match="num_arrays >= 1, got 0"):
        LayerCacheKind.state(0)
    with pytest.raises(ValueError, match="a attention layer takes no num_arrays"):
        LayerCacheKind(CacheKind.ATTENTION, num_arrays=2)
    with pytest.raises(ValueError, match="a state layer takes no window_size"):
        LayerCacheKind(CacheKind.STATE, window_size=4, num_arrays=1)
    with pytest.raises(ValueError, match="layer 1 has no cache parts"):
        CacheLayout(((ATTENTION,), ()))


def test_a_hybrid_layout_numbers_its_attention_and_state_parts():
    layout = CacheLayout.of([[STATE], [ATTENTION], [STATE, window(4)]])
    assert layout.attention_parts == (ATTENTION, window(4))
    assert layout.state_parts == (STATE, STATE)
    assert layout.has_state and not layout.is_plain
    assert not layout.supports_prefix_caching
    assert not layout.supports_speculative_decoding
    assert layout.kv_window is None  # a full-attention layer reads every position


def test_the_window_to_free_behind_is_the_largest_when_every_layer_is_windowed():
    assert CacheLayout.of([[window(4)], [window(16)]]).kv_window == 16
    assert CacheLayout.of([[STATE], [window(8)]]).kv_window == 8
    assert CacheLayout.of([[window(4)], [ATTENTION]]).kv_window is None
    assert CacheLayout.of([[STATE]]).kv_window is None
    plain = CacheLayout.all_attention(3)
    assert plain.is_plain and plain.supports_prefix_caching and plain.kv_window is None
    windowed = CacheLayout.of([[window(8)]])
    assert joint_kv_window([windowed, CacheLayout.of([[window(12)]])]) == 12
    assert joint_kv_window([windowed, plain]) is None


def test_chunked_layers_keep_every_block_in_the_full_attention_group():
    chunked = LayerCacheKind.chunked(8)
    assert chunked.kv_window is None and window(8).kv_window == 8
    assert CacheLayout.of([[chunked], [chunked]]).kv_window is None
    layout = CacheLayout.of([[chunked], [window(4)], [ATTENTION]])
    groups = BlockGroups.of([layout])
    assert groups.windows == (None, 4)
    assert groups.layer_groups(layout) == (0, 1, 0)
    assert BlockGroups.of([CacheLayout.of([[chunked]])]).windows == (None,)


class _PlainModel:
    def make_cache(self) -> list[object]:
        return [object(), object()]


class _LayeredModel(_PlainModel):
    cache_layout = CacheLayout.of([[STATE], [ATTENTION]])


def test_a_model_without_a_layout_is_all_full_attention():
    assert model_cache_layout(_PlainModel()) == CacheLayout.all_attention(2)
    assert model_cache_layout(_LayeredModel()) == _LayeredModel.cache_layout


def make_pool() -> StatePool:
    layers = [
        (StateArrayGeometry((3, 4), mx.float32), StateArrayGeometry((2,), mx.float16)),
        (None, StateArrayGeometry((5,), mx.float32)),
    ]
    return StatePool(layers, num_slots=4)


def test_state_bytes_count_every_array_of_a_slot():
    pool = make_pool()
    assert pool.bytes_per_slot == 3 * 4 * 4 + 2 * 2 + 5 * 4
    assert pool.nbytes == 4 * pool.bytes_per_slot == sum(a.nbytes for a in pool.arrays())
    assert state_bytes_per_sequence(pool.layers) == pool.bytes_per_slot
    with pytest.raises(ValueError, match="num_slots must be >= 1, got 0"):
        StatePool(pool.layers, 0)


def test_a_pass_reads_its_rows_slots_and_writes_them_back():
    pool = make_pool()
    slots = mx.array([2, 0], dtype=mx.int32)
    fresh = SlotStateCache(pool, 0, slots, fresh=True)
    assert fresh[0] is None and fresh[1] is None
    new = mx.arange(24, dtype=mx.float32).reshape(2, 3, 4)
    fresh[0] = new
    assert fresh[0] is new  # a later read in the same pass sees the write
    later = SlotStateCache(pool, 0, mx.array([0, 2, 1], dtype=mx.int32), fresh=False)
    expected = np.stack([np.array(new[1]), np.array(new[0]), np.zeros((3, 4))])
    np.testing.assert_array_equal(np.array(later[0]), expected)
    assert SlotStateCache(pool, 1, slots, fresh=False)[0] is None  # never written


def test_a_fork_copies_its_parents_slot_in_every_layer():
    pool = make_pool()
    SlotStateCache(pool, 1, mx.array([1]), fresh=True)[1] = mx.full((1, 5), 7.0)
    SlotStateCache(pool, 0, mx.array([1]), fresh=True)[1] = mx.ones((1, 2), mx.float16)
    pool.copy_slots([(1, 3)])
    child = [SlotStateCache(pool, layer, mx.array([3]), fresh=False) for layer in (0, 1)]
    np.testing.assert_array_equal(np.array(child[1][1]), np.full((1, 5), 7.0))
    np.testing.assert_array_equal(np.array(child[0][1]), np.ones((1, 2)))
    with pytest.raises(ValueError, match=r"slot must be in \[0, 4\), got 4"):
        pool.copy_slots([(1, 4)])


def test_a_state_of_another_shape_or_dtype_is_refused():
    pool = make_pool()
    view = SlotStateCache(pool, 0, mx.array([0]), fresh=False)
    with pytest.raises(ValueError, match=r"must be \(B, 3, 4\) mlx.core.float32, got \(1, 3, 5\)"):
        view[0] = mx.zeros((1, 3, 5))
    with pytest.raises(ValueError, match="float16"):
        view[1] = mx.zeros((1, 2), mx.float32)
    with pytest.raises(ValueError, match="index 2 is outside"):
        view[2] = mx.zeros((1, 2))
    with pytest.raises(ValueError, match="not written by the recording pass"):
        SlotStateCache(pool, 1, mx.array([0]), fresh=False)[0] = mx.zeros((1, 1))
    assert view.make_mask(3) is None and view.lengths is None
