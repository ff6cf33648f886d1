"""The CPU paged decode attention kernel against `paged_decode_attention_reference`: odd
head dims and lengths, grouped-query heads, block sizes, rows of length 0, 1 and a full
table, one and two threads, and the inputs it refuses; and the engine on the CPU, whose
greedy tokens are those of gathering the context when decode passes read the pools."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from test_batching_engine import (
    generate_all,
    make_config,
    make_prompts,
    make_request,
    running_engine,
    token_ids,
)

from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.kernels.cpu_matvec import paged_attention
from mlxcel_core.kernels.cpu_matvec.paged_attention import cpu_paged_decode_attention
from mlxcel_core.kernels.paged_attention import (
    CPU_KERNEL_MIN_QUERIES,
    paged_decode_attention_reference,
)
from mlxcel_models.loading.loader import load_model

# `on_the_cpu` is an autouse fixture.
from cpu_kernels import needs_kernel, on_the_cpu  # noqa: F401

# The kernel and the reference sum in different orders; both in float32.
TOLERANCE = {"rtol": 2e-5, "atol": 2e-6}
# What pool slots no row owns hold: a score or value read from one would show.
UNOWNED_KEY, UNOWNED_VALUE = 1e4, -1e4


def make_inputs(
    lengths: list[int],
    *,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    value_dim: int,
    block_size: int,
    max_blocks: int | None = None,
    seed: int = 0,
) -> dict:
    """Keyword arguments of the kernel (and the reference): rows of `lengths` positions in
    shuffled blocks of pools whose other slots hold large values, tables padded with 0."""
    rng = np.random.default_rng(seed)
    blocks_per_row = [-(-length // block_size) for length in lengths]
    max_blocks = max_blocks or max(1, *blocks_per_row)
    num_blocks = 1 + sum(blocks_per_row)
    ids = rng.permutation(np.arange(1, num_blocks))
    key_pool = np.full((num_blocks * block_size, kv_heads, head_dim), UNOWNED_KEY, np.float32)
    value_pool = np.full((num_blocks * block_size, kv_heads, value_dim), UNOWNED_VALUE, np.float32)
    tables = np.zeros((len(lengths), max_blocks), np.int32)
    start = 0
    for row, (length, count) in enumerate(zip(lengths, blocks_per_row, strict=True)):
        tables[row, :count] = ids[start : start + count]
        start += count
        positions = np.arange(length)
        slots = tables[row, positions // block_size] * block_size + positions % block_size
        key_pool[slots] = rng.standard_normal((length, kv_heads, head_dim))
        value_pool[slots] = rng.standard_normal((length, kv_heads, value_dim))
    queries = rng.standard_normal((len(lengths), q_heads, 1, head_dim)).astype(np.float32)
    return {
        "queries": mx.array(queries),
        "key_pool": mx.array(key_pool),
        "value_pool": mx.array(value_pool),
        "block_tables": mx.array(tables),
        "context_lengths": mx.array(np.array(lengths, np.int32)),
        "block_size": block_size,
        "scale": head_dim**-0.5,
    }


def assert_matches_the_reference(
    inputs: dict, lengths: list[int], tolerance: dict = TOLERANCE
) -> mx.array:
    out = cpu_paged_decode_attention(**inputs)
    B, H_q, _, _ = inputs["queries"].shape
    assert out.shape == (B, H_q, 1, inputs["value_pool"].shape[2])
    assert out.dtype == mx.float32
    expected = np.array(paged_decode_attention_reference(**inputs))
    attending = np.array(lengths) > 0
    np.testing.assert_allclose(np.array(out)[attending], expected[attending], **tolerance)
    assert not np.array(out)[~attending].any()
    return out


@needs_kernel
@pytest.mark.parametrize(("q_heads", "kv_heads"), [(3, 3), (9, 3), (8, 2), (6, 1), (10, 2)])
@pytest.mark.parametrize(("head_dim", "value_dim"), [(64, 64), (37, 19), (8, 24), (5, 3)])
@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_the_kernel_computes_the_reference_attention(
    q_heads, kv_heads, head_dim, value_dim, block_size
):
    partial = [1, 2 * block_size + 3, 7]
    max_blocks = 1 + max(-(-length // block_size) for length in partial)
    # The fourth row fills its whole table.
    lengths = [*partial, max_blocks * block_size]
    inputs = make_inputs(
        lengths,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        value_dim=value_dim,
        block_size=block_size,
        max_blocks=max_blocks,
    )
    assert_matches_the_reference(inputs, lengths)


@needs_kernel
def test_rows_of_length_zero_get_zeros_beside_rows_of_a_full_table():
    lengths = [0, 32, 1, 0, 17]
    inputs = make_inputs(lengths, q_heads=4, kv_heads=2, head_dim=16, value_dim=16, block_size=8)
    out = assert_matches_the_reference(inputs, lengths)
    assert not np.array(out)[[0, 3]].any()


@needs_kernel
def test_large_scores_stay_finite_and_the_softmax_stable():
    lengths = [40, 9]
    inputs = make_inputs(lengths, q_heads=6, kv_heads=2, head_dim=32, value_dim=32, block_size=4)
    inputs["scale"] = 50.0
    # Scores of hundreds: float32 rounds them by some 1e-5, which the exp carries over.
    out = assert_matches_the_reference(inputs, lengths, {"rtol": 1e-3, "atol": 1e-4})
    assert np.isfinite(np.array(out)).all()


@needs_kernel
@pytest.mark.parametrize("lengths", [[132] * 16, [1, 300, 2, 77, 0, 5], [50]])
def test_two_threads_compute_what_one_computes(lengths):
    inputs = make_inputs(lengths, q_heads=9, kv_heads=3, head_dim=64, value_dim=64, block_size=16)
    one = cpu_paged_decode_attention(**inputs, threads=1)
    assert mx.array_equal(one, cpu_paged_decode_attention(**inputs, threads=2))


@needs_kernel
def test_block_table_entries_past_a_row_are_not_read():
    lengths = [5, 12]
    inputs = make_inputs(
        lengths, q_heads=2, kv_heads=1, head_dim=8, value_dim=8, block_size=4, max_blocks=6
    )
    expected = cpu_paged_decode_attention(**inputs)
    tables = np.array(inputs["block_tables"])
    tables[0, 2:] = -7
    tables[1, 3:] = 10**6
    inputs["block_tables"] = mx.array(tables)
    assert mx.array_equal(cpu_paged_decode_attention(**inputs), expected)


@needs_kernel
def test_tables_that_would_read_outside_the_pools_are_refused():
    lengths = [5, 12]
    inputs = make_inputs(lengths, q_heads=2, kv_heads=1, head_dim=8, value_dim=8, block_size=4)
    slots = inputs["key_pool"].shape[0]
    tables = np.array(inputs["block_tables"])
    for bad_id in (slots // 4, -1):
        refused = tables.copy()
        refused[1, 2] = bad_id
        with pytest.raises(ValueError, match=f"a block past the pools' {slots} slots"):
            cpu_paged_decode_attention(**{**inputs, "block_tables": mx.array(refused)})
    for bad_length in (13, -1):
        with pytest.raises(ValueError, match="a context length past 3 blocks of 4"):
            cpu_paged_decode_attention(
                **{**inputs, "context_lengths": mx.array([5, bad_length], dtype=mx.int32)}
            )


@needs_kernel
def test_inputs_the_kernel_does_not_take_are_refused():
    inputs = make_inputs([5], q_heads=4, kv_heads=2, head_dim=8, value_dim=8, block_size=4)
    with pytest.raises(ValueError, match="float32 queries and pools on the CPU"):
        cpu_paged_decode_attention(**{**inputs, "key_pool": inputs["key_pool"].astype(mx.float16)})
    with pytest.raises(ValueError, match="threads must be 1 or 2, got 3"):
        cpu_paged_decode_attention(**inputs, threads=3)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        cpu_paged_decode_attention(**{**inputs, "block_size": 0})
    queries = inputs["queries"]
    for bad in (queries[:, :3], mx.concatenate([queries, queries], axis=2), queries[0]):
        with pytest.raises(ValueError, match=r"takes queries \(B, H_q, 1, D\)"):
            cpu_paged_decode_attention(**{**inputs, "queries": bad})
    with pytest.raises(ValueError, match=r"takes queries \(B, H_q, 1, D\)"):
        cpu_paged_decode_attention(**{**inputs, "value_pool": inputs["value_pool"][:-1]})


def test_supports_float32_on_the_cpu_only_and_two_threads_for_large_steps():
    queries, pool = mx.zeros((2, 4, 1, 8)), mx.zeros((16, 2, 8))
    assert paged_attention.supports(queries, pool, pool)
    assert not paged_attention.supports(queries.astype(mx.bfloat16), pool, pool)
    assert not paged_attention.supports(queries, pool, pool.astype(mx.float16))
    large = paged_attention.SPLIT_MIN_SCORES
    assert paged_attention.threads_for(1, 1, large, cpu_streams=2) == 2
    assert paged_attention.threads_for(1, 1, large - 1, cpu_streams=2) == 1
    assert paged_attention.threads_for(1, 1, large, cpu_streams=1) == 1
    if mx.is_available(mx.gpu):
        mx.set_default_device(mx.gpu)  # `on_the_cpu` sets it back
        assert not paged_attention.supports(queries, pool, pool)


# In the engine


@needs_kernel
def test_the_engine_on_the_cpu_decodes_from_the_pools_with_the_greedy_tokens_of_the_gather(
    tiny_safetensors, monkeypatch
):
    model = load_model(tiny_safetensors).model
    calls: list[tuple[int, ...]] = []
    kernel = paged_attention.cpu_paged_decode_attention

    def counted(queries, *arguments, **options):
        calls.append(queries.shape)
        return kernel(queries, *arguments, **options)

    gathers: list[int] = []
    gather = PagedKVStorage.gather

    def counted_gather(self, layer, *arguments):
        gathers.append(layer)
        return gather(self, layer, *arguments)

    monkeypatch.setattr(paged_attention, "cpu_paged_decode_attention", counted)
    monkeypatch.setattr(PagedKVStorage, "gather", counted_gather)
    requests = [make_request(prompt, index=i) for i, prompt in enumerate(make_prompts())]
    tokens, num_gathers = {}, {}
    for decode_kernel in (True, False):
        with running_engine(model, make_config(paged_decode_kernel=decode_kernel)) as engine:
            tokens[decode_kernel] = [token_ids(o) for o in generate_all(engine, requests)]
        if decode_kernel:
            kernel_calls, calls[:] = list(calls), []
        num_gathers[decode_kernel], gathers[:] = len(gathers), []
    assert tokens[True] == tokens[False]
    assert all(len(ids) == 10 for ids in tokens[True])
    assert not calls
    # Passes the kernel serves gather nothing (only passes of one query still do).
    assert num_gathers[True] < num_gathers[False]
    # Decode passes of 2 to 4 rows, and prefill chunks as a query per row.
    rows = {B for B, _, _, _ in kernel_calls}
    assert rows >= {4, 8} and min(rows) >= CPU_KERNEL_MIN_QUERIES
