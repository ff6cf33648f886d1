"""The paged KV path equals the dense one: slot tables, masks, and a real model's logits.

The model tests run tiny random-weight llamas through `PagedKVStorage`, `PagedBatch` and
`KVCacheManager` block tables the way the engine does (chunked prefill, batched decode with
rows at different offsets, prefix hits, copy-on-write) and compare every position's logits
with the same tokens run alone through dense caches.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.cache.paged import (
    BatchRow,
    KVCacheManager,
    LayerGeometry,
    PagedBatch,
    PagedKVStorage,
    PagedLayerCache,
    make_layer_caches,
)
from mlxcel_core.engine.memory import profile_model
from mlxcel_core.language_model import LanguageModel
from mlxcel_models.loading.loader import load_model

from factories import TinyConfig, write_safetensors_model, write_sliding_window_model

BLOCK_SIZE = 4
FLOAT32_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
# Q8_0 layers switch between the quantized and the dequantized product by row count, and
# a padded batch has more rows than one sequence alone.
Q8_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


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
    cache_type: str, lengths: Sequence[int], window_size: int | None = None
) -> tuple[mx.array, mx.array]:
    """A decode pass's attention output through a cache that attends by length groups when
    it may, and the same through a cache that attends over the padded batch."""
    storages = twin_storages(cache_type, LayerGeometry(2, 32, 32, mx.float32), max_blocks=256)
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


def count_group_passes(monkeypatch) -> list[int]:
    """Each call of attention by length groups, as the number of groups it attended by."""
    calls: list[int] = []
    attend = PagedLayerCache._attend_by_length

    def counted(self, queries, scale, groups, order):
        calls.append(len(groups))
        return attend(self, queries, scale, groups, order)

    monkeypatch.setattr(PagedLayerCache, "_attend_by_length", counted)
    return calls


ON_THE_CPU = pytest.mark.skipif(
    mx.default_device() != mx.cpu, reason="length groups serve the CPU's decode passes"
)


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


# A real model over paged KV


class PagedHarness:
    """Runs sequences through a model over paged KV, as the engine does.

    Each `step` is one forward pass over every sequence given, prefill chunks and decode
    rows together, padded to the longest chunk (the engine's runner keeps long rows apart;
    `PagedBatch` allows both). Positions are allocated through the KV manager first, block
    tables read once every allocation (and copy-on-write swap) is done, and full blocks
    committed afterwards.
    """

    def __init__(self, model: LanguageModel, *, num_blocks: int = 64) -> None:
        self.model = model
        layers = profile_model(model, BLOCK_SIZE).layers
        self.kv = KVCacheManager(num_blocks, BLOCK_SIZE)
        self.storage = PagedKVStorage(layers, BLOCK_SIZE, num_blocks)
        self.tokens: dict[int, list[int]] = {}
        self.num_computed: dict[int, int] = {}
        self.chunks: dict[int, list[int]] = {}

    def admit(self, seq_id: int, token_ids: Sequence[int]) -> int:
        """Give a sequence its prefix-cache hit; return the cached tokens."""
        num_cached = self.kv.admit(seq_id, token_ids, 1)
        assert num_cached is not None
        self.tokens[seq_id] = list(token_ids)
        self.num_computed[seq_id] = num_cached
        self.chunks[seq_id] = [num_cached] if num_cached else []
        return num_cached

    def step(self, work: dict[int, int]) -> dict[int, mx.array]:
        """Compute `work[seq_id]` more tokens of each sequence; return their (n, V) logits."""
        rows, inputs = [], []
        num_queries = max(work.values())
        for seq_id, num_new in work.items():
            start = self.num_computed[seq_id]
            assert self.kv.allocate_slots(seq_id, start, num_new)
            chunk = self.tokens[seq_id][start : start + num_new]
            assert len(chunk) == num_new
            inputs.append(chunk + [0] * (num_queries - num_new))
        for seq_id, num_new in work.items():
            rows.append(BatchRow(self.kv.block_table(seq_id), self.num_computed[seq_id], num_new))
        self.storage.ensure_capacity(self.kv.materialized_blocks[0])
        self.storage.copy_blocks(self.kv.take_block_copies())
        batch = PagedBatch(rows, BLOCK_SIZE)
        logits = self.model(
            mx.array(inputs, dtype=mx.int32), make_layer_caches(self.storage, batch)
        )
        mx.eval(logits, self.storage.arrays())
        result = {}
        for b, (seq_id, num_new) in enumerate(work.items()):
            result[seq_id] = logits[b, :num_new]
            self.num_computed[seq_id] += num_new
            self.chunks[seq_id].append(num_new)
            self.kv.commit(seq_id, self.tokens[seq_id], self.num_computed[seq_id])
        return result


def dense_logits(model: LanguageModel, token_ids: Sequence[int], chunks: Sequence[int]) -> mx.array:
    """(T, V) logits of the tokens run alone through dense caches, chunk by chunk."""
    cache = model.make_cache()
    pieces, start = [], 0
    for size in chunks:
        pieces.append(model(mx.array([token_ids[start : start + size]]), cache)[0])
        start += size
    return mx.concatenate(pieces)


def check_against_dense(harness: PagedHarness, paged: dict[int, list[mx.array]], tolerance):
    """Each sequence's paged logits (its latest positions) equal its dense logits there."""
    for seq_id, pieces in paged.items():
        reference = dense_logits(harness.model, harness.tokens[seq_id], harness.chunks[seq_id])
        got = mx.concatenate(pieces)
        np.testing.assert_allclose(np.array(got), np.array(reference[-got.shape[0] :]), **tolerance)


def random_tokens(seed: int, lengths: Sequence[int]) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 250, n).tolist() for n in lengths]


@pytest.mark.parametrize(
    ("fixture", "tolerance"), [("tiny_safetensors", FLOAT32_TOLERANCE), ("tiny_gguf", Q8_TOLERANCE)]
)
def test_chunked_prefill_and_batched_decode_at_different_offsets_match_dense(
    request, fixture, tolerance
):
    model = load_model(request.getfixturevalue(fixture)).model
    harness = PagedHarness(model)
    # Prompts of 3, 7 and 13 tokens, then 6, 6 and 5 decode tokens (teacher-forced).
    sequences = random_tokens(0, [3 + 6, 7 + 6, 13 + 5])
    for seq_id, tokens in enumerate(sequences):
        assert harness.admit(seq_id, tokens) == 0
    paged: dict[int, list[mx.array]] = {0: [], 1: [], 2: []}
    # Prefill chunks of different lengths share passes with decode rows, then every row
    # decodes at its own offset.
    schedule = [
        {0: 3, 1: 5},
        {0: 1, 1: 2, 2: 6},
        {2: 7, 0: 1, 1: 1},
        *[{0: 1, 1: 1, 2: 1}] * 3,
        {1: 1, 2: 1, 0: 1},
        {2: 1, 1: 1},
    ]
    for work in schedule:
        for seq_id, logits in harness.step(work).items():
            paged[seq_id].append(logits)
    assert [harness.num_computed[s] for s in range(3)] == [9, 13, 18]
    assert len(set(harness.kv.block_table(2)) & set(harness.kv.block_table(1))) == 0
    check_against_dense(harness, paged, tolerance)


@ON_THE_CPU
def test_decode_rows_far_apart_in_length_attend_by_groups_and_match_dense(
    tiny_safetensors, monkeypatch
):
    model = load_model(tiny_safetensors).model
    harness = PagedHarness(model)
    calls = count_group_passes(monkeypatch)
    # Prompts of 150 and 8 tokens, then 4 decode tokens each (teacher-forced).
    sequences = random_tokens(2, [150 + 4, 8 + 4])
    for seq_id, tokens in enumerate(sequences):
        assert harness.admit(seq_id, tokens) == 0
    paged: dict[int, list[mx.array]] = {0: [], 1: []}
    for work in [{0: 150}, {1: 8}, *[{0: 1, 1: 1}] * 4]:
        for seq_id, logits in harness.step(work).items():
            paged[seq_id].append(logits)
    # Every layer of every two-row decode pass took the groups, one row in each.
    assert calls == [2] * (4 * len(harness.storage.layers))
    check_against_dense(harness, paged, FLOAT32_TOLERANCE)


def test_copy_on_write_after_fork_keeps_each_sequence_reading_its_own_kv(tiny_safetensors):
    model = load_model(tiny_safetensors).model
    harness = PagedHarness(model)
    prompt = random_tokens(1, [6])[0]
    parent_tokens, child_tokens = [*prompt, 17, 40, 41], [*prompt, 99, 50, 51]
    harness.admit(0, parent_tokens)
    parent_prompt_logits = harness.step({0: 6})[0]
    # The child shares both prompt blocks; the second is half full, so the first write into
    # it by either sequence must go to a copy.
    harness.kv.fork(0, 1, 6)
    harness.tokens[1], harness.num_computed[1], harness.chunks[1] = child_tokens, 6, [6]
    shared = harness.kv.block_table(0)
    assert harness.kv.block_table(1) == shared
    paged: dict[int, list[mx.array]] = {0: [parent_prompt_logits], 1: []}
    for _ in range(3):
        for seq_id, logits in harness.step({0: 1, 1: 1}).items():
            paged[seq_id].append(logits)
    # The parent wrote first and got the copy; the child then held the original alone.
    parent_table, child_table = harness.kv.block_table(0), harness.kv.block_table(1)
    assert parent_table[0] == child_table[0] == shared[0]
    assert child_table[1] == shared[1] != parent_table[1]
    check_against_dense(harness, paged, FLOAT32_TOLERANCE)


def test_copy_on_write_copy_is_needed_for_the_shared_positions(tiny_safetensors):
    """Without `copy_blocks`, the copied-out sequence would read zeros for positions 4..5."""
    model = load_model(tiny_safetensors).model
    harness = PagedHarness(model)
    prompt = random_tokens(2, [6])[0]
    harness.admit(0, [*prompt, 17])
    harness.step({0: 6})
    harness.kv.fork(0, 1, 6)
    harness.tokens[1], harness.num_computed[1], harness.chunks[1] = [*prompt, 99], 6, [6]
    assert harness.kv.allocate_slots(0, 6, 1)
    copies = harness.kv.take_block_copies()
    assert [(c.src_block_id, c.dst_block_id) for c in copies] == [
        (harness.kv.block_table(1)[1], harness.kv.block_table(0)[1])
    ]
    harness.storage.copy_blocks(copies)
    # Positions 4 and 5 are the first two slots of the copied block.
    src = mx.arange(2) + copies[0].src_block_id * BLOCK_SIZE
    dst = mx.arange(2) + copies[0].dst_block_id * BLOCK_SIZE
    for pools in (harness.storage.keys, harness.storage.values):
        for (pool,) in pools:
            copied = np.array(pool[dst])
            np.testing.assert_array_equal(copied, np.array(pool[src]))
            assert np.abs(copied).min(axis=(1, 2)).all()


# Sliding-window attention


SLIDING_WINDOW = 5


@pytest.fixture(scope="module")
def sliding_models(tmp_path_factory) -> tuple[LanguageModel, LanguageModel]:
    """The same tiny llama weights with a sliding-window first layer, and without."""
    config = TinyConfig(seed=3)
    windowed = write_sliding_window_model(
        tmp_path_factory.mktemp("swa") / "llama", config, SLIDING_WINDOW
    )
    full = write_safetensors_model(tmp_path_factory.mktemp("full") / "llama", config)
    return load_model(windowed).model, load_model(full).model


def mlx_lm_logits(model: LanguageModel, token_ids: Sequence[int]) -> mx.array:
    """(T, V) logits from mlx-lm's own model call with its own caches (RotatingKVCache)."""
    module = model.module  # type: ignore[attr-defined]
    return module(mx.array([token_ids]), cache=module.make_cache())[0]


def test_the_sliding_window_fixture_really_windows(sliding_models):
    windowed, full = sliding_models
    module = windowed.module
    assert [layer.use_sliding for layer in module.model.layers] == [True, False]
    tokens = random_tokens(4, [14])[0]
    with_window, without = mlx_lm_logits(windowed, tokens), mlx_lm_logits(full, tokens)
    # Positions inside the first window see the same keys; later ones do not.
    np.testing.assert_allclose(
        np.array(with_window[:SLIDING_WINDOW]), np.array(without[:SLIDING_WINDOW]), atol=1e-5
    )
    assert not np.allclose(
        np.array(with_window[SLIDING_WINDOW:]), np.array(without[SLIDING_WINDOW:]), atol=1e-3
    )


def test_sliding_window_layers_match_mlx_lm_with_prefix_reuse(sliding_models):
    windowed, _ = sliding_models
    harness = PagedHarness(windowed)
    first = random_tokens(5, [14 + 4])[0]
    # The second shares the first's 12-token prefix (3 full blocks), then diverges.
    second = [*first[:12], *random_tokens(6, [3 + 4])[0]]
    harness.admit(0, first)
    paged: dict[int, list[mx.array]] = {0: [], 1: []}
    for work in ({0: 6}, {0: 8}, {0: 1}):
        paged[0].extend(harness.step(work).values())
    assert harness.admit(1, second) == 12
    # The second's prompt tail runs beside the first's decode rows; its window reaches back
    # into the shared blocks.
    for work in ({0: 1, 1: 3}, {0: 1, 1: 1}, {0: 1, 1: 1}, {1: 1}, {1: 1}):
        for seq_id, logits in harness.step(work).items():
            paged[seq_id].append(logits)
    assert harness.kv.block_table(1)[:3] == harness.kv.block_table(0)[:3]
    for seq_id, tokens in ((0, first), (1, second)):
        reference = mlx_lm_logits(windowed, tokens)
        got = mx.concatenate(paged[seq_id])
        start = len(tokens) - got.shape[0]
        assert start == (0 if seq_id == 0 else 12)
        np.testing.assert_allclose(np.array(got), np.array(reference[start:]), **FLOAT32_TOLERANCE)


def test_sliding_window_dense_path_matches_mlx_lm(sliding_models):
    """mlxcel's dense caches pass `window_size` through to the mask as mlx-lm's do."""
    windowed, _ = sliding_models
    tokens = random_tokens(7, [16])[0]
    stepped = dense_logits(windowed, tokens, [7, 1, 1, 7])
    np.testing.assert_allclose(
        np.array(stepped), np.array(mlx_lm_logits(windowed, tokens)), **FLOAT32_TOLERANCE
    )


def test_one_row_prefill_chunks_at_rounded_lengths_match_dense(tiny_safetensors, monkeypatch):
    # What CUDA does (`prefill_lengths`), forced here: every chunk after the first starts
    # at an offset, so the rounded keys must stay aligned with the real queries.
    from mlxcel_core.cache.paged import layer_cache as layer_cache_module

    rounded: list[int] = []
    attend = layer_cache_module.causal_attention_at_rounded_length

    def counted(queries, keys, values, *, scale):
        rounded.append(queries.shape[2])
        return attend(queries, keys, values, scale=scale)

    monkeypatch.setattr(layer_cache_module, "rounds_prefill_lengths", lambda queries, values: True)
    monkeypatch.setattr(layer_cache_module, "causal_attention_at_rounded_length", counted)
    model = load_model(tiny_safetensors).model
    harness = PagedHarness(model)
    tokens = random_tokens(3, [150 + 3])[0]
    assert harness.admit(0, tokens) == 0
    paged: dict[int, list[mx.array]] = {0: []}
    for work in [{0: 70}, {0: 50}, {0: 30}, *[{0: 1}] * 3]:
        paged[0].extend(harness.step(work).values())
    num_layers = len(harness.storage.layers)
    assert rounded == [70] * num_layers + [50] * num_layers + [30] * num_layers
    check_against_dense(harness, paged, FLOAT32_TOLERANCE)


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
