"""KV blocks' contents read from one paged storage, packed into one flat array, unpacked
and written into another storage's blocks arrive position for position; layouts a flat
array cannot carry are refused."""

from __future__ import annotations

import re

import mlx.core as mx
import pytest

from mlxcel_core.cache.paged import LayerGeometry, PagedKVStorage
from mlxcel_distributed import block_layout, pack_blocks, unpack_blocks

BLOCK_SIZE = 4
LAYERS = (
    LayerGeometry(num_kv_heads=2, key_dim=8, value_dim=8, dtype=mx.float32),
    LayerGeometry(num_kv_heads=1, key_dim=16, value_dim=4, dtype=mx.float32),
)


def make_storage(cache_type_v: str = "auto") -> PagedKVStorage:
    storage = PagedKVStorage(LAYERS, BLOCK_SIZE, 16, cache_type_v=cache_type_v)
    storage.ensure_capacity(16)
    return storage


def test_blocks_travel_into_other_block_ids_unchanged() -> None:
    source = make_storage()
    slots = mx.arange(3 * BLOCK_SIZE, 9 * BLOCK_SIZE)
    for layer, geometry in enumerate(LAYERS):
        keys = mx.random.normal((len(slots), geometry.num_kv_heads, geometry.key_dim))
        values = mx.random.normal((len(slots), geometry.num_kv_heads, geometry.value_dim))
        source.write(layer, slots, keys, values)
    layout = block_layout(source)
    flat = pack_blocks(source.read_blocks([4, 7]))
    assert flat.ndim == 1 and flat.size == layout.num_elements(2)

    target = make_storage()
    target.write_blocks([11, 2], unpack_blocks(flat, layout, 2))
    for layer in range(len(LAYERS)):
        for src, dst in ((4, 11), (7, 2)):
            src_slots = mx.arange(src * BLOCK_SIZE, (src + 1) * BLOCK_SIZE)[None]
            dst_slots = mx.arange(dst * BLOCK_SIZE, (dst + 1) * BLOCK_SIZE)[None]
            for sent, arrived in zip(
                source.gather(layer, src_slots), target.gather(layer, dst_slots), strict=True
            ):
                assert mx.array_equal(sent, arrived)
                assert mx.abs(sent).sum() > 0


def test_a_flat_array_of_another_size_or_dtype_is_refused() -> None:
    layout = block_layout(make_storage())
    flat = mx.zeros((layout.num_elements(2),), mx.float32)
    with pytest.raises(ValueError, match="elements for 3 blocks"):
        unpack_blocks(flat, layout, 3)
    with pytest.raises(ValueError, match="float16"):
        unpack_blocks(flat.astype(mx.float16), layout, 2)


def test_contents_of_the_wrong_shape_are_not_written() -> None:
    storage = make_storage()
    contents = storage.read_blocks([1, 2])
    with pytest.raises(ValueError, match="block contents must be"):
        storage.write_blocks([1], contents)


def test_pools_of_mixed_dtypes_have_no_flat_layout() -> None:
    expected = "pools of one dtype, got mlx.core.float16, mlx.core.float32"
    with pytest.raises(ValueError, match=re.escape(expected)):
        block_layout(make_storage(cache_type_v="f16"))
