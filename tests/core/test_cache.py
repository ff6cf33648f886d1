import mlx.core as mx
import pytest

from mlxcel_core.cache import DenseKVCache
from mlxcel_core.cache.dense import make_causal_mask


def _kv(num_tokens: int, start: int = 0) -> tuple[mx.array, mx.array]:
    positions = mx.arange(start, start + num_tokens, dtype=mx.float32)
    keys = mx.broadcast_to(positions[None, None, :, None], (1, 2, num_tokens, 3))
    return keys, keys * 10


def test_update_and_fetch_returns_everything_stored_across_growth():
    cache = DenseKVCache(step=4)
    stored_keys = None
    for start, length in ((0, 3), (3, 1), (4, 6), (10, 1)):
        stored_keys, stored_values = cache.update_and_fetch(*_kv(length, start))
    assert cache.offset == 11
    assert stored_keys.shape == (1, 2, 11, 3)
    assert stored_keys[0, 0, :, 0].tolist() == list(range(11))
    assert mx.array_equal(stored_values, stored_keys * 10)
    assert cache.keys.shape[2] == 12


def test_trim_drops_the_latest_positions_and_later_writes_overwrite_them():
    cache = DenseKVCache(step=4)
    cache.update_and_fetch(*_kv(5))
    assert cache.trim(2) == 2
    assert cache.trim(10) == 3
    cache.update_and_fetch(*_kv(2, start=7))
    keys, _ = cache.update_and_fetch(*_kv(1, start=9))
    assert keys[0, 0, :, 0].tolist() == [7, 8, 9]


def test_masks_follow_mlx_lm_conventions():
    cache = DenseKVCache()
    cache.update_and_fetch(*_kv(2))
    assert cache.make_mask(1) is None
    assert cache.make_mask(3) == "causal"
    mask = cache.make_mask(3, return_array=True)
    assert mask.tolist() == make_causal_mask(3, 2).tolist()
    assert mask.tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, False],
        [True, True, True, True, True],
    ]
    windowed = make_causal_mask(2, 2, window_size=2)
    assert windowed.tolist() == [[False, True, True, False], [False, False, True, True]]


def test_step_must_be_positive():
    with pytest.raises(ValueError, match="step"):
        DenseKVCache(step=0)
