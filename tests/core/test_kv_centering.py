"""TurboQuant keys past a row's first block are stored relative to that block's mean.

The decoded vector must be exactly the mean plus the decoded difference (so the centering
changes only the quantization error), must not depend on how the row was split into
passes or batched with other rows, and must shrink the error of keys that share a large
common part, as real keys do.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.cache.paged import BatchRow, BlockCopy, LayerGeometry, PagedBatch, PagedKVStorage
from mlxcel_core.cache.quant import make_kv_codec

BLOCK_SIZE = 4
HEADS, DIM = 2, 64
GEOMETRY = LayerGeometry(num_kv_heads=HEADS, key_dim=DIM, value_dim=DIM, dtype=mx.float32)


def make_storage(cache_type: str = "turbo4") -> PagedKVStorage:
    storage = PagedKVStorage(
        [GEOMETRY], BLOCK_SIZE, 32, cache_type_k=cache_type, cache_type_v=cache_type
    )
    storage.ensure_capacity(32)
    return storage


def keys_with_a_common_part(num: int, seed: int) -> mx.array:
    """(num, H, D) float32 keys shaped as SmolLM2's: a per-head mean with a few large
    channels, holding most of the energy, plus a smaller part that varies by position."""
    rng = np.random.default_rng(seed)
    mean = rng.standard_normal((1, HEADS, DIM))
    mean[..., :3] *= 8.0
    varying = 0.6 * rng.standard_normal((num, HEADS, DIM))
    return mx.array((mean + varying).astype(np.float32))


def write_rows(storage: PagedKVStorage, rows: list[BatchRow], sources: list[mx.array]) -> None:
    """Write one pass of `rows` as keys and values, row b taking its new positions'
    vectors from `sources[b]` (T, H, D) by position."""
    batch = PagedBatch(rows, BLOCK_SIZE)
    L = batch.num_queries
    chunks = []
    for row, source in zip(rows, sources, strict=True):
        chunk = source[row.offset : row.offset + row.num_new_tokens]
        padding = mx.zeros((L - row.num_new_tokens, HEADS, DIM))
        chunks.append(mx.concatenate([chunk, padding]))
    new = mx.concatenate(chunks)
    storage.write(0, batch.write_slots, new, new, batch.anchors)


def read_row(storage: PagedKVStorage, block_table: list[int], length: int) -> mx.array:
    """(length, H, D) keys of one row as the storage gives them back."""
    batch = PagedBatch([BatchRow(block_table, length - 1, 1)], BLOCK_SIZE)
    keys, _ = storage.gather(0, batch.read_slots, batch.anchors)
    return keys[0].transpose(1, 0, 2)


@pytest.mark.parametrize("cache_type", ["turbo2", "turbo3", "turbo4"])
def test_positions_past_the_first_block_decode_to_its_mean_plus_the_decoded_difference(
    cache_type,
):
    storage, codec = make_storage(cache_type), make_kv_codec(cache_type, DIM)
    keys = keys_with_a_common_part(10, seed=1)
    write_rows(storage, [BatchRow([3, 7, 5], 0, 10)], [keys])
    got = read_row(storage, [3, 7, 5], 10)
    first = codec.decode(codec.encode(keys[:BLOCK_SIZE]), mx.float32)
    mean = mx.mean(first[1:], axis=0)  # position 0, the sink, left out
    rest = codec.decode(codec.encode(keys[BLOCK_SIZE:] - mean), mx.float32) + mean
    # Decoding multiplies by the rotation, and a BLAS may round a product over another
    # number of rows differently (OpenBLAS on AMD EPYC does).
    assert mx.allclose(got[:BLOCK_SIZE], first, rtol=0, atol=1e-5)
    assert mx.allclose(got[BLOCK_SIZE:], rest, rtol=0, atol=1e-5)


def test_centering_shrinks_the_error_of_keys_that_share_a_large_common_part():
    storage, codec = make_storage("turbo4"), make_kv_codec("turbo4", DIM)
    keys = keys_with_a_common_part(64, seed=2)
    write_rows(storage, [BatchRow(list(range(1, 17)), 0, 64)], [keys])
    later = keys[BLOCK_SIZE:]
    centered_error = mx.linalg.norm(read_row(storage, list(range(1, 17)), 64)[BLOCK_SIZE:] - later)
    plain_error = mx.linalg.norm(codec.decode(codec.encode(later), mx.float32) - later)
    assert centered_error.item() < 0.5 * plain_error.item()


def test_a_row_reads_the_same_however_its_positions_were_split_into_passes_and_batched():
    keys, other = keys_with_a_common_part(11, seed=3), keys_with_a_common_part(6, seed=4)
    table = [2, 9, 4]
    whole = make_storage()
    write_rows(whole, [BatchRow(table, 0, 11)], [keys])

    pieces = make_storage()
    write_rows(pieces, [BatchRow(table, 0, 2)], [keys])  # inside the first block
    # Fills the first block and goes past it, batched with a second row.
    write_rows(pieces, [BatchRow(table, 2, 5), BatchRow([11, 12], 0, 5)], [keys, other])
    for offset in range(7, 11):  # decode steps, one position each, beside the other row
        write_rows(pieces, [BatchRow([11, 12], 5, 1), BatchRow(table, offset, 1)], [other, keys])

    assert mx.array_equal(read_row(pieces, table, 11), read_row(whole, table, 11))


def test_rows_sharing_a_first_block_and_a_copy_of_it_read_alike():
    storage = make_storage()
    keys = keys_with_a_common_part(8, seed=5)
    write_rows(storage, [BatchRow([1, 2], 0, 8)], [keys])
    storage.copy_blocks([BlockCopy(src_block_id=1, dst_block_id=20)])
    storage.copy_blocks([BlockCopy(src_block_id=2, dst_block_id=21)])
    original = read_row(storage, [1, 2], 8)
    assert mx.array_equal(read_row(storage, [20, 21], 8), original)
    # A row that shares the cached first block writes its own second block alike.
    write_rows(storage, [BatchRow([1, 22], 4, 4)], [keys])
    assert mx.array_equal(read_row(storage, [1, 22], 8), original)


def test_a_row_inside_its_first_block_reads_what_the_codec_decodes():
    storage, codec = make_storage(), make_kv_codec("turbo4", DIM)
    keys = keys_with_a_common_part(3, seed=6)
    write_rows(storage, [BatchRow([6], 0, 3)], [keys])
    expected = codec.decode(codec.encode(keys), mx.float32)
    assert mx.array_equal(read_row(storage, [6], 3), expected)


@pytest.mark.parametrize("cache_type", ["f16", "q8_0", "q4_0"])
def test_other_types_store_every_position_on_its_own(cache_type):
    storage, codec = make_storage(cache_type), make_kv_codec(cache_type, DIM)
    keys = keys_with_a_common_part(9, seed=7)
    write_rows(storage, [BatchRow([1, 2, 3], 0, 9)], [keys])
    expected = codec.decode(codec.encode(keys), mx.float32)
    assert mx.array_equal(read_row(storage, [1, 2, 3], 9), expected)


def test_values_are_never_centered():
    storage, codec = make_storage(), make_kv_codec("turbo4", DIM)
    values = keys_with_a_common_part(9, seed=8)
    write_rows(storage, [BatchRow([1, 2, 3], 0, 9)], [values])
    batch = PagedBatch([BatchRow([1, 2, 3], 8, 1)], BLOCK_SIZE)
    _, got = storage.gather(0, batch.read_slots, batch.anchors)
    expected = codec.decode(codec.encode(values), mx.float32)
    assert mx.array_equal(got[0].transpose(1, 0, 2), expected)
