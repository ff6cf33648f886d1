"""Paged decode attention: the reference against dense attention, the dispatch, and (on a
CUDA or Metal device) the kernels against the reference.

Pools are filled the way `PagedKVStorage` keeps them, with each row's blocks scattered in a
shuffled order through the pool, and the same keys and values are attended densely.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
import pytest
from turbo_factories import verification

from mlxcel_core.cache.paged import BatchRow, LayerGeometry, PagedBatch, PagedKVStorage
from mlxcel_core.cache.paged.layer_cache import PagedLayerCache
from mlxcel_core.engine.config import EngineConfig, make_kv_storage
from mlxcel_core.engine.memory import ModelProfile
from mlxcel_core.kernels import CUDA, METAL, cpu_matvec
from mlxcel_core.kernels.paged_attention import (
    cpu_decode_attention,
    decode_kernel_backend,
    paged_decode_attention,
    paged_decode_attention_kernel,
    paged_decode_attention_reference,
)
from mlxcel_core.kernels.paged_attention.decode import supports
from mlxcel_core.kernels.paged_attention.grid import num_partitions_for

# The kernels of each backend, called as the reference is.
paged_decode_attention_cuda = functools.partial(paged_decode_attention_kernel, backend=CUDA)
paged_decode_attention_metal = functools.partial(paged_decode_attention_kernel, backend=METAL)


@dataclass
class PagedProblem:
    """Queries, pools and block tables of a decode pass, with each row's dense context."""

    queries: mx.array  # (B, H_q, 1, D)
    key_pool: mx.array  # (slots, H_kv, D)
    value_pool: mx.array  # (slots, H_kv, D)
    block_tables: mx.array  # (B, max_blocks), int32
    context_lengths: mx.array  # (B,), int32
    block_size: int
    dense_keys: list[np.ndarray]  # per row (H_kv, length, D), float64
    dense_values: list[np.ndarray]


def make_problem(
    lengths: list[int],
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: mx.Dtype = mx.float32,
    seed: int = 0,
) -> PagedProblem:
    """Random keys and values of rows of `lengths` positions, stored in shuffled blocks;
    block tables are padded with 0 past each row's blocks and pool slots nothing owns hold
    large values, so reading one would show."""
    rng = np.random.default_rng(seed)
    blocks_per_row = [-(-n // block_size) for n in lengths]
    num_blocks = 1 + sum(blocks_per_row)
    block_ids = rng.permutation(np.arange(1, num_blocks))
    pool_shape = (num_blocks * block_size, num_kv_heads, head_dim)
    key_pool = np.full(pool_shape, 1e4)
    value_pool = np.full(pool_shape, -1e4)
    tables = np.zeros((len(lengths), max(blocks_per_row)), np.int32)
    dense_keys, dense_values = [], []
    start = 0
    for row, (length, count) in enumerate(zip(lengths, blocks_per_row, strict=True)):
        ids = block_ids[start : start + count]
        start += count
        tables[row, :count] = ids
        keys = rng.standard_normal((length, num_kv_heads, head_dim))
        values = rng.standard_normal((length, num_kv_heads, head_dim))
        positions = np.arange(length)
        slots = ids[positions // block_size] * block_size + positions % block_size
        key_pool[slots], value_pool[slots] = keys, values
        dense_keys.append(keys.transpose(1, 0, 2))
        dense_values.append(values.transpose(1, 0, 2))
    queries = rng.standard_normal((len(lengths), num_q_heads, 1, head_dim))
    # The dense contexts are what the pools hold after rounding to `dtype`.
    key_pool = mx.array(key_pool.astype(np.float32)).astype(dtype)
    value_pool = mx.array(value_pool.astype(np.float32)).astype(dtype)
    rounded_keys = np.array(key_pool.astype(mx.float32), np.float64)
    rounded_values = np.array(value_pool.astype(mx.float32), np.float64)
    for row, length in enumerate(lengths):
        positions = np.arange(length)
        slots = tables[row, positions // block_size] * block_size + positions % block_size
        dense_keys[row] = rounded_keys[slots].transpose(1, 0, 2)
        dense_values[row] = rounded_values[slots].transpose(1, 0, 2)
    return PagedProblem(
        mx.array(queries.astype(np.float32)).astype(dtype),
        key_pool,
        value_pool,
        mx.array(tables),
        mx.array(np.array(lengths, np.int32)),
        block_size,
        dense_keys,
        dense_values,
    )


def dense_attention(problem: PagedProblem, scale: float) -> np.ndarray:
    """(B, H_q, 1, D) float64 softmax attention of each row over its own context."""
    queries = np.array(problem.queries.astype(mx.float32), np.float64)
    B, H_q, _, D = queries.shape
    out = np.zeros((B, H_q, 1, D))
    for row in range(B):
        keys, values = problem.dense_keys[row], problem.dense_values[row]
        group = H_q // keys.shape[0]
        for head in range(H_q):
            scores = keys[head // group] @ queries[row, head, 0] * scale
            weights = np.exp(scores - scores.max())
            out[row, head, 0] = weights @ values[head // group] / weights.sum()
    return out


def run(attention, problem: PagedProblem, scale: float, **options) -> mx.array:
    return attention(
        problem.queries,
        problem.key_pool,
        problem.value_pool,
        problem.block_tables,
        problem.context_lengths,
        block_size=problem.block_size,
        scale=scale,
        **options,
    )


RAGGED_LENGTHS = [1, 7, 33, 16, 50]


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize(("num_q_heads", "num_kv_heads"), [(4, 4), (8, 2), (6, 1)])
def test_reference_equals_dense_attention_over_ragged_rows(block_size, num_q_heads, num_kv_heads):
    problem = make_problem(
        RAGGED_LENGTHS,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=32,
        block_size=block_size,
        seed=block_size,
    )
    scale = 32**-0.5
    out = run(paged_decode_attention_reference, problem, scale)
    assert out.shape == (5, num_q_heads, 1, 32) and out.dtype == mx.float32
    np.testing.assert_allclose(np.array(out), dense_attention(problem, scale), atol=1e-5)


def test_reference_ignores_block_table_entries_past_each_row():
    problem = make_problem([3, 9], num_q_heads=2, num_kv_heads=1, head_dim=8, block_size=4)
    # Row 0 uses one block of its three table entries; point the rest at row 1's blocks.
    tables = np.array(problem.block_tables)
    tables[0, 1:] = tables[1, :2]
    padded = PagedProblem(**{**vars(problem), "block_tables": mx.array(tables)})
    out = run(paged_decode_attention_reference, padded, 0.5)
    np.testing.assert_allclose(np.array(out), dense_attention(problem, 0.5), atol=1e-5)


def test_dispatch_on_the_cpu_runs_the_c_kernel_for_float32_and_the_reference_otherwise():
    assert decode_kernel_backend(mx.Device(mx.cpu), mx.bfloat16, 32, 8, 64, 64) is None
    for dtype in (mx.float32, mx.bfloat16):
        problem = make_problem(
            RAGGED_LENGTHS, num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=4, dtype=dtype
        )
        with mx.stream(mx.cpu):
            out = run(paged_decode_attention, problem, 0.25)
            expected = run(paged_decode_attention_reference, problem, 0.25)
            if dtype == mx.float32 and cpu_matvec.available():
                assert mx.array_equal(out, run(cpu_decode_attention, problem, 0.25))
                np.testing.assert_allclose(np.array(out), np.array(expected), atol=1e-6)
            else:
                assert mx.array_equal(out, expected)


def test_kernels_take_float_pools_of_one_lane_tiled_head_dim_within_shared_memory():
    for backend in (CUDA, METAL):
        assert supports(backend, mx.bfloat16, 4, 64, 64)
        assert supports(backend, mx.float32, 4, 128, 128)
        assert not supports(backend, mx.bfloat16, 4, 96, 96)
        assert not supports(backend, mx.bfloat16, 4, 128, 64)
        assert not supports(backend, mx.uint8, 4, 64, 64)
        assert not supports(backend, mx.bfloat16, 32, 128, 128)
    # 8 query heads per KV head at head dim 128 take 33 KiB: within CUDA's 48, not Metal's 32.
    assert supports(CUDA, mx.float32, 8, 128, 128)
    assert not supports(METAL, mx.float32, 8, 128, 128)


def test_kernel_arguments_are_checked_before_launch():
    problem = make_problem([4], num_q_heads=2, num_kv_heads=1, head_dim=8, block_size=4)
    for kernel in (paged_decode_attention_cuda, paged_decode_attention_metal):
        with pytest.raises(ValueError, match="num_partitions must be >= 1, got 0"):
            run(kernel, problem, 0.5, num_partitions=0)
        with pytest.raises(ValueError, match=r"scale must be > 0, got -1\.0"):
            run(kernel, problem, -1.0)
        mixed = PagedProblem(**{**vars(problem), "queries": problem.queries.astype(mx.float16)})
        with pytest.raises(ValueError, match="pools must hold the queries' dtype"):
            run(kernel, mixed, 0.5)


def test_split_kv_is_chosen_for_few_rows_and_long_contexts():
    assert num_partitions_for(1, 8, 32768) == 64
    assert num_partitions_for(1, 8, 1024) == 2
    assert num_partitions_for(32, 8, 32768) == 8
    assert num_partitions_for(256, 8, 32768) == 1
    assert num_partitions_for(64, 8, 512) == 1


def layer_cache(rows: list[BatchRow], *, decode_kernel: bool) -> PagedLayerCache:
    geometry = LayerGeometry(num_kv_heads=2, key_dim=16, value_dim=16, dtype=mx.float32)
    storage = PagedKVStorage([geometry], 4, max_blocks=32, decode_kernel=decode_kernel)
    storage.ensure_capacity(32)
    rng = np.random.default_rng(3)
    for pools in (storage.keys, storage.values):
        pools[0] = (mx.array(rng.standard_normal(pools[0][0].shape).astype(np.float32)),)
    return PagedLayerCache(storage, 0, PagedBatch(rows, 4))


@pytest.mark.parametrize("enabled", [True, False])
def test_the_engine_setting_reaches_the_storage(enabled):
    geometry = LayerGeometry(num_kv_heads=2, key_dim=16, value_dim=16, dtype=mx.float32)
    profile = ModelProfile((geometry,), resident_bytes=0, transient_bytes=0, vocab_size=8)
    config = EngineConfig(paged_decode_kernel=enabled)
    assert make_kv_storage(config, profile, num_blocks=4).decode_kernel is enabled


@pytest.mark.parametrize("decode_kernel", [True, False])
def test_layer_cache_attention_on_the_cpu_reads_the_pools_by_the_c_kernel_or_gathers(
    decode_kernel,
):
    rows = [
        BatchRow([1, 2, 3], offset=9, num_new_tokens=1),
        BatchRow([4], offset=2, num_new_tokens=1),
    ]
    cache = layer_cache(rows, decode_kernel=decode_kernel)
    rng = np.random.default_rng(4)
    new = mx.array(rng.standard_normal((2, 2, 1, 16)).astype(np.float32))
    queries = mx.array(rng.standard_normal((2, 4, 1, 16)).astype(np.float32))
    with mx.stream(mx.cpu):
        keys, values = cache.update_and_fetch(new, -new)
        mask = cache.make_mask(1)
        out = cache.attention(queries, keys, values, scale=0.25, mask=mask)
        expected = mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=0.25, mask=mask
        )
    if decode_kernel and cpu_matvec.available():
        np.testing.assert_allclose(np.array(out), np.array(expected), atol=1e-6)
        storage, batch = cache._storage, cache._batch
        with mx.stream(mx.cpu):
            by_kernel = cpu_decode_attention(
                queries, storage.keys[0][0], storage.values[0][0], batch.block_tables,
                batch.context_lengths, block_size=4, scale=0.25,
            )  # fmt: skip
        assert mx.array_equal(out, by_kernel)
    else:
        assert mx.array_equal(out, expected)


gpu_kernels = []
if mx.cuda.is_available():
    gpu_kernels.append(paged_decode_attention_cuda)
if mx.metal.is_available():
    gpu_kernels.append(paged_decode_attention_metal)

# Relative error of the kernels' float32 softmax against the reference, per pool dtype.
KERNEL_TOLERANCE = {mx.float32: 1e-5, mx.float16: 2e-3, mx.bfloat16: 1e-2}


@pytest.mark.skipif(not gpu_kernels, reason="needs a CUDA or Metal GPU")
@pytest.mark.parametrize("kernel", gpu_kernels)
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("num_partitions", [1, 3, None])
@pytest.mark.parametrize(("head_dim", "block_size"), [(64, 16), (128, 8), (32, 1)])
def test_kernel_matches_the_reference(kernel, dtype, num_partitions, head_dim, block_size):
    problem = make_problem(
        [700, 1, 33, 257],
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        seed=head_dim + block_size,
    )
    scale = head_dim**-0.5
    out = run(kernel, problem, scale, num_partitions=num_partitions)
    expected = run(paged_decode_attention_reference, problem, scale)
    assert out.shape == expected.shape and out.dtype == dtype
    difference = (out.astype(mx.float32) - expected.astype(mx.float32)).abs().max().item()
    assert difference <= KERNEL_TOLERANCE[dtype] * expected.abs().max().item()


@pytest.mark.skipif(not mx.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cache_type", ["auto", "turbo4"])
def test_verification_passes_read_the_pools_on_cuda_as_gathering_attends(cache_type):
    gpu = mx.Device(mx.gpu)
    out = verification(cache_type, decode_kernel=True, seed=7, device=gpu)
    expected = verification(cache_type, decode_kernel=False, seed=7, device=gpu)
    assert out.shape == expected.shape == (3, 8, 2, 32)
    difference = (out - expected).abs().max().item()
    assert difference <= 1e-4 * expected.abs().max().item()
