"""The residual window: each row's last positions kept exact beside a quantized cache.

The planner's bookkeeping is checked on block tables alone; the storage must read window
positions as written (float16 for float32 keys) and the rest as the codec decodes them;
through the engine, a window longer than every sequence makes a turbo2 cache give the
tokens an f16 cache gives, over batching, preemption, prefix hits, copy-on-write forks
and speculative rollback, while turbo2 alone gives others.
"""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from test_batching_engine import (
    CONTEXT_SIZE,
    generate_all,
    make_config,
    make_prompts,
    make_request,
    running_engine,
    token_ids,
)

from mlxcel_core.cache.paged import (
    BatchRow,
    BlockCopy,
    LayerGeometry,
    PagedBatch,
    PagedKVStorage,
    ResidualPlanner,
    make_layer_caches,
    residual_blocks_per_row,
)
from mlxcel_core.engine import EngineConfig, InsufficientMemoryError
from mlxcel_core.engine.config import plan_kv_blocks
from mlxcel_core.engine.memory import profile_model
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.sampling import SamplingParams
from mlxcel_core.speculative import SpeculativeConfig, SpeculativeMethod
from mlxcel_models.loading.loader import load_model

from factories import TinyConfig, write_safetensors_model

BLOCK_SIZE = 4


def plan(planner: ResidualPlanner, table: list[int], offset: int, length: int):
    padded = np.array([table], np.int32)
    return planner.plan(padded, np.array([offset], np.int32), np.array([length], np.int32))


def residuals(planner: ResidualPlanner, block_ids) -> list[int | None]:
    return [planner.residual_of(block_id) for block_id in block_ids]


# The planner


def test_blocks_per_row_count_every_block_a_window_can_touch():
    assert residual_blocks_per_row(0, 4) == 0
    assert residual_blocks_per_row(1, 4) == 1
    assert residual_blocks_per_row(4, 4) == 2  # positions 3..6 span two blocks
    assert residual_blocks_per_row(5, 4) == 2
    assert residual_blocks_per_row(6, 4) == 3


def test_a_prefill_gives_residual_blocks_to_the_window_blocks_it_starts():
    planner = ResidualPlanner(window=6, block_size=BLOCK_SIZE, num_residual_blocks=4)
    slots = plan(planner, [5, 6, 7], offset=0, length=10)  # window: positions 4..9
    assert residuals(planner, [5, 6, 7]) == [None, 1, 2]
    exact = np.array(slots.exact)[0]
    assert exact.tolist() == [False] * 4 + [True] * 6
    read = np.array(slots.read_slots)[0]
    assert read[4:].tolist() == [4, 5, 6, 7, 8, 9]  # residual blocks 1 and 2
    assert np.array(slots.write_slots).tolist() == [0] * 4 + read[4:].tolist()


def test_decoding_moves_the_window_and_gives_back_passed_blocks():
    planner = ResidualPlanner(window=4, block_size=BLOCK_SIZE, num_residual_blocks=3)
    table = [5, 6, 7]
    plan(planner, table, offset=0, length=4)
    assert residuals(planner, table) == [1, None, None]
    for length in range(5, 9):  # decode positions 4..7, block 6 starts at 4
        plan(planner, table, offset=length - 1, length=length)
    # Window 4..7 lies in block 6 alone: block 5 gave its residual block back.
    assert residuals(planner, table) == [None, 2, None]
    slots = plan(planner, table, offset=8, length=9)
    assert residuals(planner, table) == [None, 2, 1]
    # Whole blocks are exact: block 6 holds position 4, before the window 5..8.
    assert np.array(slots.exact)[0].tolist() == [False] * 4 + [True] * 5


def test_blocks_a_pass_does_not_start_get_none_but_keep_their_own():
    planner = ResidualPlanner(window=8, block_size=BLOCK_SIZE, num_residual_blocks=4)
    plan(planner, [5, 6], offset=0, length=8)
    # Another row holding blocks 5 and 6 as a cached prefix after block 9, from a prefix
    # cached before any window: 5 and 6 keep their copies, 9 gets none, 8 (started
    # here) gets one.
    slots = plan(planner, [9, 5, 6, 8], offset=12, length=14)
    assert residuals(planner, [9, 5, 6, 8]) == [None, 1, 2, 3]
    assert np.array(slots.exact)[0].tolist() == [False] * 4 + [True] * 10


def test_a_reused_block_is_written_whole_through_its_old_copy_then_given_back():
    planner = ResidualPlanner(window=4, block_size=BLOCK_SIZE, num_residual_blocks=2)
    plan(planner, [5], offset=0, length=3)
    assert residuals(planner, [5]) == [1]
    # Block 5, freed and reused by a longer prefill: the pass writes every position of
    # it, exact copies included, so the copy is whole again until the row moves on.
    slots = plan(planner, [5, 6, 7], offset=0, length=12)
    assert residuals(planner, [5, 6, 7]) == [1, None, 2]
    assert np.array(slots.write_slots)[:4].tolist() == [4, 5, 6, 7]
    plan(planner, [5, 6, 7, 8], offset=12, length=13)
    assert residuals(planner, [5, 6, 7, 8]) == [None, None, 2, 1]


def test_residual_blocks_go_least_recently_seen_first():
    planner = ResidualPlanner(window=4, block_size=BLOCK_SIZE, num_residual_blocks=2)
    plan(planner, [5], offset=0, length=4)
    plan(planner, [6], offset=0, length=4)
    plan(planner, [5, 8], offset=3, length=5)  # block 5 seen again, block 8 takes block 6's
    assert residuals(planner, [5, 6, 8]) == [1, None, 2]


def test_copies_carry_the_residual_block_or_drop_a_stale_one():
    planner = ResidualPlanner(window=8, block_size=BLOCK_SIZE, num_residual_blocks=4)
    plan(planner, [5, 6], offset=0, length=6)
    assert planner.copy(6, 9) == (2, 3)
    assert residuals(planner, [6, 9]) == [2, 3]
    plan(planner, [7], offset=0, length=2)
    assert planner.copy(11, 7) is None  # block 11 has none: block 7's own is stale
    assert planner.residual_of(7) is None
    planner.drop([5, 6])
    assert residuals(planner, [5, 6]) == [None, None]


# The storage

GEOMETRY = LayerGeometry(num_kv_heads=2, key_dim=64, value_dim=64, dtype=mx.float32)


def storage_with(
    window: int, num_residual_blocks: int = 4, cache_type_k: str = "turbo2"
) -> PagedKVStorage:
    storage = PagedKVStorage(
        [GEOMETRY],
        BLOCK_SIZE,
        16,
        cache_type_k=cache_type_k,
        cache_type_v="turbo2",
        residual_window=window,
        num_residual_blocks=num_residual_blocks,
    )
    storage.ensure_capacity(8)
    return storage


def write_row(storage: PagedKVStorage, row: BatchRow, keys: mx.array, values: mx.array):
    batch = PagedBatch([row], BLOCK_SIZE)
    residual = batch.residual_slots(storage)
    start, stop = row.offset, row.offset + row.num_new_tokens
    storage.write(
        0,
        batch.write_slots,
        keys[start:stop],
        values[start:stop],
        batch.anchors,
        None if residual is None else residual.write_slots,
    )
    return batch, residual


def test_window_positions_read_as_written_and_the_rest_as_decoded():
    rng = np.random.default_rng(0)
    keys = mx.array(rng.standard_normal((10, 2, 64)).astype(np.float32))
    values = mx.array(rng.standard_normal((10, 2, 64)).astype(np.float32))
    row = BatchRow([1, 2, 3], 0, 10)
    windowed, plain = storage_with(window=6), storage_with(window=0)
    batch, residual = write_row(windowed, row, keys, values)
    write_row(plain, row, keys, values)
    exact = (residual.read_slots, residual.exact)
    got_k, got_v = windowed.gather(0, batch.read_slots, batch.anchors, exact)
    decoded_k, decoded_v = plain.gather(0, batch.read_slots, batch.anchors)
    exact_k = keys.astype(mx.float16).astype(mx.float32).transpose(1, 0, 2)[None]
    exact_v = values.astype(mx.float16).astype(mx.float32).transpose(1, 0, 2)[None]
    # Blocks 2 and 3 (positions 4..9) are the window's; block 1 is decoded.
    assert mx.array_equal(got_k[:, :, 4:], exact_k[:, :, 4:])
    assert mx.array_equal(got_v[:, :, 4:], exact_v[:, :, 4:])
    assert mx.array_equal(got_k[:, :, :4], decoded_k[:, :, :4])
    assert mx.array_equal(got_v[:, :, :4], decoded_v[:, :, :4])
    assert not mx.allclose(decoded_k[:, :, 4:], exact_k[:, :, 4:], atol=1e-2)


def test_a_prefill_chunk_reads_its_own_positions_and_its_first_window_exactly():
    rng = np.random.default_rng(2)
    keys = mx.array(rng.standard_normal((14, 2, 64)).astype(np.float32))
    reads = {}
    for window in (3, 0):
        storage = storage_with(window)
        for offset in (0, 7):  # two prefill chunks of 7
            row = BatchRow([1, 2, 3, 4], offset, 7)
            (cache,) = make_layer_caches(storage, PagedBatch([row], BLOCK_SIZE))
            new = keys[offset : offset + 7].transpose(1, 0, 2)[None]
            reads[window], _ = cache.update_and_fetch(new, new)
    read, decoded = reads[3], reads[0]
    exact = keys.astype(mx.float16).astype(mx.float32).transpose(1, 0, 2)[None]
    # The second chunk's first query (position 7) needs positions 5..7: block 2 (4..7)
    # kept its copy from the first chunk; 7..13 are the chunk's own.
    assert mx.array_equal(read[:, :, 4:], exact[:, :, 4:])
    assert mx.array_equal(read[:, :, :4], decoded[:, :, :4])
    assert not mx.allclose(decoded[:, :, 4:7], exact[:, :, 4:7], atol=1e-2)


def test_block_copies_carry_exact_copies_and_transfers_drop_them():
    rng = np.random.default_rng(1)
    keys = mx.array(rng.standard_normal((6, 2, 64)).astype(np.float32))
    storage = storage_with(window=8)
    write_row(storage, BatchRow([1, 2], 0, 6), keys, keys)
    storage.copy_blocks([BlockCopy(2, 5)])
    copied = PagedBatch([BatchRow([1, 5], 5, 1)], BLOCK_SIZE)
    residual = copied.residual_slots(storage)
    assert np.array(residual.exact)[0].tolist() == [True] * 6
    got, _ = storage.gather(0, copied.read_slots[:, :5], None, residual.rows(mx.array([0]), 5))
    expected = keys[:5].astype(mx.float16).astype(mx.float32).transpose(1, 0, 2)[None]
    assert mx.array_equal(got, expected)
    storage.write_blocks([5], storage.read_blocks([5]))
    after = storage.plan_residual(np.array([[1, 5]], np.int32), np.array([5]), np.array([6]))
    assert np.array(after.exact)[0].tolist() == [True] * 4 + [False] * 2


def test_an_unquantized_side_is_read_from_its_pool_as_it_is():
    rng = np.random.default_rng(3)
    keys = mx.array(rng.standard_normal((6, 2, 64)).astype(np.float32))
    values = mx.array(rng.standard_normal((6, 2, 64)).astype(np.float32))
    storage = storage_with(window=8, cache_type_k="auto")
    assert storage.exact_sides == (False, True)
    batch, residual = write_row(storage, BatchRow([1, 2], 0, 6), keys, values)
    exact = (residual.read_slots, residual.exact)
    got_k, got_v = storage.gather(0, batch.read_slots, batch.anchors, exact)
    assert mx.array_equal(got_k, keys.transpose(1, 0, 2)[None])  # float32, not rounded
    assert mx.array_equal(
        got_v, values.astype(mx.float16).astype(mx.float32).transpose(1, 0, 2)[None]
    )


def test_the_storage_counts_the_exact_copies_of_quantized_sides_only():
    storage = storage_with(window=6, num_residual_blocks=4)
    exact = 2 * (4 + 1) * BLOCK_SIZE * 2 * 64 * 2  # keys and values, float16
    assert storage.nbytes == storage.capacity_blocks[0] * storage.bytes_per_block[0] + exact
    values_only = storage_with(window=6, num_residual_blocks=4, cache_type_k="f16")
    (capacity,), (block_bytes,) = values_only.capacity_blocks, values_only.bytes_per_block
    assert values_only.nbytes == capacity * block_bytes + exact // 2
    for cache_type in ("auto", "f16", "bf16", "f32"):
        with pytest.raises(ValueError, match="needs a quantized cache type"):
            PagedKVStorage(
                [GEOMETRY],
                BLOCK_SIZE,
                16,
                cache_type_k=cache_type,
                cache_type_v=cache_type,
                residual_window=4,
                num_residual_blocks=2,
            )


# Through the engine


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> LanguageModel:
    """A tiny llama with 32-feature heads."""
    config = TinyConfig(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256)
    folder = write_safetensors_model(tmp_path_factory.mktemp("residual") / "llama", config)
    return load_model(folder).model


def typed(cache_type: str, residual: int = 0, **kwargs) -> EngineConfig:
    return make_config(
        cache_type_k=cache_type, cache_type_v=cache_type, cache_residual=residual, **kwargs
    )


def run(model: LanguageModel, config: EngineConfig, groups, draft_model=None) -> list[list[int]]:
    with running_engine(model, config, draft_model) as engine:
        return [token_ids(o) for group in groups for o in generate_all(engine, group)]


def batch_groups():
    prompts = make_prompts()
    return [[make_request(p, index=i) for i, p in enumerate(prompts)]]


def prefix_and_fork_groups():
    prompt = make_prompts([10])[0]
    samplings = [SamplingParams(temperature=0.9, seed=seed) for seed in (7, 8, 9)]
    forks = [make_request(prompt, index=i, sampling=s) for i, s in enumerate(samplings)]
    return [[make_request(prompt)], [make_request(prompt)], forks]


CASES = {
    "batch": (batch_groups, {}),
    "preemption": (batch_groups, {"num_kv_blocks": 14}),
    "prefix hits and forks": (prefix_and_fork_groups, {}),
    "prompt lookup drafts": (
        batch_groups,
        {"speculative": SpeculativeConfig(method=SpeculativeMethod.PROMPT_LOOKUP)},
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_window_over_the_whole_context_gives_f16_tokens_on_a_turbo2_cache(model, case):
    make_groups, settings = CASES[case]
    f16 = run(model, typed("f16", **settings), make_groups())
    windowed = run(model, typed("turbo2", CONTEXT_SIZE, **settings), make_groups())
    assert windowed == f16
    assert run(model, typed("turbo2", **settings), make_groups()) != f16


def test_a_draft_model_and_its_rollback_keep_the_window_exact(model):
    spec = SpeculativeConfig(num_draft_tokens=4, draft_p_min=0.0)
    groups = batch_groups()
    f16 = run(model, typed("f16", speculative=spec), groups, model)
    assert run(model, typed("turbo2", CONTEXT_SIZE, speculative=spec), groups, model) == f16


def test_the_engine_refuses_a_window_without_a_quantized_type():
    for cache_type in ("auto", "f16"):
        with pytest.raises(ValueError, match="beside a quantized cache"):
            typed(cache_type, 16)
    with pytest.raises(ValueError, match="cache_residual must be >= 0"):
        typed("turbo4", -1)
    assert replace(typed("turbo4", 16), cache_residual=0).num_residual_blocks == 0


def test_the_window_is_capped_by_the_context_and_its_bytes_by_the_budget(model):
    # 4 sequences x 2 x the blocks of a 48-position context (13 blocks of 4), not of 10**6.
    assert typed("turbo4", 10**6).num_residual_blocks == 4 * 2 * 13
    profile = profile_model(model, 8)
    per_position = sum(
        layer.num_kv_heads * (layer.key_dim + layer.value_dim) * 2 for layer in profile.layers
    )
    assert typed("q4_0", 8).residual_bytes(profile) == (4 * 2 * 3 + 1) * BLOCK_SIZE * per_position
    budget = 16 * 2**20 + typed("q4_0", 8).residual_bytes(profile)
    config = typed(
        "q4_0", CONTEXT_SIZE, num_kv_blocks=None, device_memory=budget, memory_utilization=1.0
    )
    with pytest.raises(InsufficientMemoryError, match=r"cache_residual window's exact copies take"):
        plan_kv_blocks(
            replace(config, scheduler=replace(config.scheduler, max_num_seqs=4096)), profile
        )
