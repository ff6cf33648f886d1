"""The paged KV path by hand: a `PagedBatch`'s slot tables and masks, what a
`PagedLayerCache` writes and gathers, attention over a window's keys or by length groups
against attention over the padded batch, and the gather of the float pools.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
import pytest

from mlxcel_core.cache.paged import (
    BatchRow,
    LayerGeometry,
    PagedBatch,
    PagedKVStorage,
    PagedLayerCache,
)
from mlxcel_core.kernels import cpu_matvec

from paged_attention_checks import BLOCK_SIZE, FLOAT32_TOLERANCE, ON_THE_CPU, count_group_passes

# Slot tables and masks, by hand


def three_rows() -> list[BatchRow]:
    """Rows at different offsets, with different numbers of new tokens.

    row 0: blocks [3, 5], positions 2..4 new (length 5)
    row 1: block [7], position 0 new (length 1)
    row 2: blocks [2, 9, 4], positions 6..7 new (length 8; block 4 not reached yet)
    """
    return [
        BatchRow(block_table=[3, 5], offset=2, num_new_tokens=3),
        BatchRow(block_table=[7], offset=0, num_new_tokens=1),
        BatchRow(block_table=[2, 9, 4], offset=6, num_new_tokens=2),
    ]


def test_slot_tables_map_positions_through_block_tables_and_pad_to_the_null_block():
    batch = PagedBatch(three_rows(), BLOCK_SIZE)
    assert (batch.num_rows, batch.num_queries, batch.num_keys) == (3, 3, 8)
    assert batch.offsets.tolist() == [2, 0, 6]
    assert batch.read_slots.tolist() == [
        [12, 13, 14, 15, 20, 0, 0, 0],
        [28, 0, 0, 0, 0, 0, 0, 0],
        [8, 9, 10, 11, 36, 37, 38, 39],
    ]
    # (B * L,) row-major: row 1's two padding queries and row 2's one go to slot 0.
    assert batch.write_slots.tolist() == [14, 15, 20, 28, 0, 0, 38, 39, 0]


def test_causal_mask_rows_are_exact_and_padding_queries_repeat_the_last_real_one():
    mask = PagedBatch(three_rows(), BLOCK_SIZE).mask()
    assert mask.shape == (3, 1, 3, 8) and mask.dtype == mx.bool_
    assert mask[:, 0].astype(mx.int32).tolist() == [
        [[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]],
        [[1, 0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]],
        [[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]],
    ]


def test_window_mask_keeps_only_the_last_window_size_keys():
    mask = PagedBatch(three_rows(), BLOCK_SIZE).mask(window_size=3)
    assert mask[:, 0].astype(mx.int32).tolist() == [
        [[1, 1, 1, 0, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 0, 0, 0]],
        [[1, 0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]],
        [[0, 0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1, 1]],
    ]


def test_a_windowed_batch_reads_each_rows_window_only():
    """Row 2 (offset 6) under a window of 3 reads positions 4..7 (its first query's
    window back from 6, through its last): block 9's slots; rows 0 and 1 from 0."""
    batch = PagedBatch(three_rows(), BLOCK_SIZE, window=3)
    assert batch.num_keys == 5
    assert batch.read_slots.tolist() == [
        [12, 13, 14, 15, 20],
        [28, 0, 0, 0, 0],
        [36, 37, 38, 39, 0],
    ]
    assert batch.write_slots.tolist() == [14, 15, 20, 28, 0, 0, 38, 39, 0]
    # The window mask of the unwindowed batch, over each row's keys read.
    assert batch.mask()[:, 0].astype(mx.int32).tolist() == [
        [[1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1]],
        [[1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0]],
        [[1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 1, 1, 1, 0]],
    ]
    # No wider than the keys read, as a rotating cache of the window's size.
    assert batch.mask(window_size=4) is batch.mask()
    assert not mx.array_equal(batch.mask(window_size=2), batch.mask())


@pytest.mark.parametrize("cache_type", ["auto", "turbo4"])
def test_a_windowed_batch_attends_as_the_window_mask_over_every_key(cache_type):
    """Chunks and decode rows, past the window: attention over the window's keys only
    equals attention over every key under the window mask; a row's whole table is still
    there, as in a group that frees nothing."""
    rows = [BatchRow([1, 2, 3, 4, 5], 13, 4), BatchRow([6, 7, 8], 10, 1), BatchRow([9], 0, 3)]
    geometry = LayerGeometry(2, 8, 8, mx.float32)
    storages = twin_storages(cache_type, geometry, max_blocks=12)
    outputs = []
    for storage, window in zip(storages, (5, None), strict=True):
        storage.ensure_capacity(10)
        prefill = [BatchRow(row.block_table, 0, row.offset) for row in rows if row.offset]
        batch = PagedBatch(prefill, BLOCK_SIZE, window=window)
        cache = PagedLayerCache(storage, 0, batch)
        B, L = batch.num_rows, batch.num_queries
        fill = [mx.random.normal((B, 2, L, 8), key=mx.random.key(i)) for i in range(2)]
        cache.update_and_fetch(*fill)
        batch = PagedBatch(rows, BLOCK_SIZE, window=window)
        cache = PagedLayerCache(storage, 0, batch)
        queries, keys, values = (
            mx.random.normal((3, 2, 4, 8), key=mx.random.key(10 + i)) for i in range(3)
        )
        keys, values = cache.update_and_fetch(keys, values)
        assert keys.shape[2] == (8 if window else 17)
        mask = cache.make_mask(4, window_size=5)
        outputs.append(cache.attention(queries, keys, values, scale=0.5, mask=mask))
    windowed, full = outputs
    # Padding queries of rows 1 and 2 aside.
    for row, num_new in enumerate((4, 1, 3)):
        assert mx.allclose(windowed[row, :, :num_new], full[row, :, :num_new], **FLOAT32_TOLERANCE)


def test_paged_batch_rejects_no_rows_and_short_block_tables():
    with pytest.raises(ValueError, match="at least one row"):
        PagedBatch([], BLOCK_SIZE)
    with pytest.raises(ValueError, match="covers 4 positions; it needs 5"):
        PagedBatch([BatchRow([1], offset=3, num_new_tokens=2)], BLOCK_SIZE)


def test_layer_cache_writes_new_positions_to_their_slots_and_gathers_each_row():
    storage = PagedKVStorage([LayerGeometry(1, 1, 1, mx.float32)], BLOCK_SIZE, max_blocks=16)
    storage.ensure_capacity(10)
    num_slots = storage.keys[0][0].shape[0]
    # Every slot starts out holding its own id (keys) and minus its id (values).
    slot_ids = mx.arange(num_slots, dtype=mx.float32).reshape(-1, 1, 1)
    storage.keys[0], storage.values[0] = (slot_ids,), (-slot_ids,)
    batch = PagedBatch(three_rows(), BLOCK_SIZE)
    cache = PagedLayerCache(storage, 0, batch)
    assert cache.offset.tolist() == [2, 0, 6]
    # New keys: 1000 + 10 * row + query index, padding queries included; shape (B, H, L, D).
    new = (1000 + 10 * mx.arange(3)[:, None] + mx.arange(3)[None]).astype(mx.float32)
    keys, values = cache.update_and_fetch(new[:, None, :, None], -new[:, None, :, None])
    assert keys.shape == (3, 1, 8, 1) and values.shape == (3, 1, 8, 1)
    # Padding keys read slot 0, whatever the padding queries last wrote there (masked).
    null = storage.keys[0][0][0, 0, 0].item()
    assert keys[:, 0, :, 0].tolist() == [
        [12, 13, 1000, 1001, 1002, null, null, null],
        [1010, null, null, null, null, null, null, null],
        [8, 9, 10, 11, 36, 37, 1020, 1021],
    ]
    assert mx.array_equal(values, -keys)
    # Nothing outside the written slots and the null block changed.
    written = {0, 14, 15, 20, 28, 38, 39}
    untouched = [s for s in range(num_slots) if s not in written]
    assert storage.keys[0][0][mx.array(untouched), 0, 0].tolist() == untouched


def attend_through_cache(
    storage: PagedKVStorage, rows: Sequence[BatchRow], seed: int, window_size: int | None = None
) -> tuple[tuple[int, ...], mx.array]:
    """One pass of random queries, keys and values through layer 0's cache, under the
    batch's mask (`window_size`: its sliding-window mask): the shape `update_and_fetch`
    returned the keys in, and the attention output."""
    batch = PagedBatch(rows, BLOCK_SIZE)
    cache = PagedLayerCache(storage, 0, batch)
    geometry = storage.layers[0]
    B, H, L = batch.num_rows, geometry.num_kv_heads, batch.num_queries
    queries, keys, values = (
        mx.random.normal((B, H, L, geometry.key_dim), key=mx.random.key(seed + i)) for i in range(3)
    )
    keys, values = cache.update_and_fetch(keys, values)
    mask = cache.make_mask(L, window_size=window_size)
    return tuple(keys.shape), cache.attention(queries, keys, values, scale=0.5, mask=mask)


def twin_storages(cache_type: str, geometry: LayerGeometry, max_blocks: int) -> list:
    """Two storages of one layer, alike: the first to attend by the path under test, the
    second by the one it must equal."""
    return [
        PagedKVStorage(
            [geometry],
            BLOCK_SIZE,
            max_blocks=max_blocks,
            cache_type_k=cache_type,
            cache_type_v=cache_type,
        )
        for _ in range(2)
    ]


@pytest.mark.parametrize("cache_type", ["auto", "turbo4"])
def test_decode_passes_leave_the_context_to_attention_once_it_comes_through_the_cache(
    cache_type,
):
    prefill = [BatchRow([1, 2], 0, 6), BatchRow([3], 0, 3)]
    decode = [BatchRow([1, 2], 6, 1), BatchRow([3], 3, 1)]
    storages = twin_storages(cache_type, LayerGeometry(2, 8, 8, mx.float32), max_blocks=8)
    for storage in storages:
        storage.ensure_capacity(5)
        shape, _ = attend_through_cache(storage, prefill, seed=0)
        # A layer not seen attending through its cache gets its whole context.
        assert shape == (2, 2, 6, 8)
    assert storages[0].layers_attending_in_cache == {0}
    # The second storage stands for a model whose attention never reaches the cache.
    storages[1].layers_attending_in_cache.clear()
    fetched_shape, fetched = attend_through_cache(storages[1], decode, seed=10)
    deferred_shape, deferred = attend_through_cache(storages[0], decode, seed=10)
    assert fetched_shape == (2, 2, 7, 8)
    assert deferred_shape == (2, 2, 1, 8)
    assert mx.allclose(deferred, fetched, **FLOAT32_TOLERANCE)
    # A few queries per row (a verification) leave it too; more fetch it.
    verify = [BatchRow([1, 2, 4], 7, 2)]
    storages[1].layers_attending_in_cache.clear()
    fetched_shape, fetched = attend_through_cache(storages[1], verify, seed=20)
    deferred_shape, deferred = attend_through_cache(storages[0], verify, seed=20)
    assert (fetched_shape, deferred_shape) == ((1, 2, 9, 8), (1, 2, 2, 8))
    assert mx.allclose(deferred, fetched, **FLOAT32_TOLERANCE)
    shape, _ = attend_through_cache(storages[0], [BatchRow([1, 2, 4], 0, 9)], seed=30)
    assert shape == (1, 2, 9, 8)


def decode_rows(lengths: Sequence[int]) -> list[BatchRow]:
    """One decode row per context length (the new position included), each with blocks of
    its own after block 0."""
    rows, next_block = [], 1
    for length in lengths:
        num_blocks = -(-length // BLOCK_SIZE)
        rows.append(BatchRow(list(range(next_block, next_block + num_blocks)), length - 1, 1))
        next_block += num_blocks
    return rows


def test_decode_rows_group_so_that_short_rows_skip_long_rows_padding():
    lengths = [170, 400, 30, 90, 210]
    groups, order = PagedBatch(decode_rows(lengths), BLOCK_SIZE).length_groups()
    assert [group.rows.tolist() for group in groups] == [[1, 4], [0, 3], [2]]
    assert [group.read_slots.shape for group in groups] == [(2, 400), (2, 170), (1, 30)]
    assert [group.mask.shape for group in groups] == [
        (2, 1, 1, 400),
        (2, 1, 1, 170),
        (1, 1, 1, 30),
    ]
    # Row 3 (length 90) sees its own 90 keys of its group's 170.
    assert groups[1].mask[1, 0, 0].astype(mx.int32).tolist() == [1] * 90 + [0] * 80
    concatenated = [row for group in groups for row in group.rows.tolist()]
    assert [concatenated[i] for i in order.tolist()] == [0, 1, 2, 3, 4]
    # Each group's anchors are its own rows': their first blocks, and the one written
    # position of each (all past the first block here).
    assert groups[1].anchors.write_rows.tolist() == [0, 1]
    assert groups[1].anchors.writes_past_first_blocks
    assert not groups[1].anchors.writes_first_blocks
    # Rows within twice of each other, or fewer than MIN_SKIPPED_KEYS (64) apart, one row,
    # and passes of several queries: no groups.
    assert PagedBatch(decode_rows([170, 90, 120]), BLOCK_SIZE).length_groups() is None
    assert PagedBatch(decode_rows([17, 40, 3]), BLOCK_SIZE).length_groups() is None
    groups, _ = PagedBatch(decode_rows([17, 100, 3]), BLOCK_SIZE).length_groups()
    assert [group.rows.tolist() for group in groups] == [[1], [0, 2]]
    assert PagedBatch(decode_rows([40]), BLOCK_SIZE).length_groups() is None
    assert PagedBatch(three_rows(), BLOCK_SIZE).length_groups() is None


def grouped_and_padded(
    cache_type: str,
    lengths: Sequence[int],
    window_size: int | None = None,
    *,
    decode_kernel: bool = False,
) -> tuple[mx.array, mx.array]:
    """A decode pass's attention output through a cache that attends by length groups when
    it may (or by a decode kernel reading the pools, with `decode_kernel`), and the same
    through a cache that attends over the padded batch."""
    storages = twin_storages(cache_type, LayerGeometry(2, 32, 32, mx.float32), max_blocks=256)
    storages[0].decode_kernel = decode_kernel
    for storage in storages:
        storage.ensure_capacity(1 + sum(-(-length // BLOCK_SIZE) for length in lengths))
        prefill = [BatchRow(row.block_table, 0, row.offset) for row in decode_rows(lengths)]
        attend_through_cache(storage, prefill, seed=0)
    # The second stands for a model whose attention never reaches the cache: it attends
    # over the whole padded batch.
    storages[1].layers_attending_in_cache.clear()
    _, padded = attend_through_cache(storages[1], decode_rows(lengths), 10, window_size)
    shape, attended = attend_through_cache(storages[0], decode_rows(lengths), 10, window_size)
    assert shape == (len(lengths), 2, 1, 32)  # the context was left to `attention`
    return attended, padded


@ON_THE_CPU
@pytest.mark.parametrize("cache_type", ["auto", "q8_0", "turbo4"])
def test_decode_attention_by_length_groups_equals_attention_over_the_padded_batch(
    cache_type, monkeypatch
):
    calls = count_group_passes(monkeypatch)
    grouped, padded = grouped_and_padded(cache_type, [170, 400, 30, 90, 210])
    assert calls == [3]
    assert grouped.shape == padded.shape == (5, 2, 1, 32)
    assert mx.allclose(grouped, padded, **FLOAT32_TOLERANCE)


@ON_THE_CPU
@pytest.mark.skipif(not cpu_matvec.available(), reason="CPU kernels not built here")
def test_a_cpu_decode_over_float32_pools_reads_them_by_the_c_kernel_not_by_groups(monkeypatch):
    calls = count_group_passes(monkeypatch)
    read, padded = grouped_and_padded("auto", [170, 400, 30, 90, 210], decode_kernel=True)
    assert calls == []
    assert mx.allclose(read, padded, **FLOAT32_TOLERANCE)


@ON_THE_CPU
def test_a_sliding_window_decode_attends_over_the_padded_batch(monkeypatch):
    calls = count_group_passes(monkeypatch)
    windowed, padded = grouped_and_padded("auto", [170, 400, 30, 90, 210], window_size=50)
    assert calls == []
    assert mx.allclose(windowed, padded, **FLOAT32_TOLERANCE)


def test_layer_cache_masks_take_the_fast_path_only_for_one_unwindowed_row():
    storage = PagedKVStorage([LayerGeometry(1, 1, 1, mx.float32)], BLOCK_SIZE, max_blocks=4)
    one = PagedBatch([BatchRow([1, 2], offset=3, num_new_tokens=2)], BLOCK_SIZE)
    cache = PagedLayerCache(storage, 0, one)
    assert cache.make_mask(2) == "causal"
    windowed = cache.make_mask(2, window_size=2)
    assert windowed.astype(mx.int32).tolist() == [[[[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]]]
    returned = cache.make_mask(2, return_array=True)
    assert returned.astype(mx.int32).tolist() == [[[[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]]]
    batched = PagedLayerCache(storage, 0, PagedBatch(three_rows(), BLOCK_SIZE))
    assert mx.array_equal(batched.make_mask(3), PagedBatch(three_rows(), BLOCK_SIZE).mask())
    assert batched.trim(5) == 0


def test_float_pools_are_gathered_heads_first_without_a_transpose(tmp_path: Path):
    geometry = LayerGeometry(3, 8, 4, mx.float32)
    storage = PagedKVStorage([geometry, geometry], BLOCK_SIZE, max_blocks=16)
    storage.ensure_capacity(16)
    slots = mx.arange(4 * 16, dtype=mx.int32)
    keys = mx.random.normal((64, 3, 8), key=mx.random.key(0))
    values = mx.random.normal((64, 3, 4), key=mx.random.key(1))
    for layer in (0, 1):
        storage.write(layer, slots, keys * (layer + 1), values * (layer + 1))
    read = mx.array([[5, 9, 17, 3], [40, 41, 0, 63]], dtype=mx.int32)
    for layer in (0, 1):
        got_keys, got_values = storage.gather(layer, read)
        assert got_keys.shape == (2, 3, 4, 8) and got_values.shape == (2, 3, 4, 4)
        mx.export_to_dot(str(tmp_path / "gather.dot"), got_keys)
        assert "Transpose" not in (tmp_path / "gather.dot").read_text()
        expected_keys = (keys * (layer + 1))[read].transpose(0, 2, 1, 3)
        expected_values = (values * (layer + 1))[read].transpose(0, 2, 1, 3)
        assert mx.array_equal(got_keys, expected_keys)
        assert mx.array_equal(got_values, expected_values)
