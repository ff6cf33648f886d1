"""Paged decode attention on a GPU: the kernels against the reference, and their speed.

Correctness: the CUDA kernel (one pass, split-KV, and the dispatched choice) against the
plain-MLX reference on the same bf16 pools, as max abs error, beside the error of the bf16
reference itself against a float32 reference of the same keys and values.

Speed, one decode step of one attention layer with every row at `--context` positions:
- paged kernel: `paged_decode_attention` (split-KV or one pass, as dispatched);
- gather then attend: the reference, which gathers each row's keys and values from the
  pools into a padded array, then runs `mx.fast.scaled_dot_product_attention`;
- dense: `mx.fast.scaled_dot_product_attention` over keys and values already contiguous
  (B, H_kv, S, D), as a dense KV cache holds them.
Each variant is timed as `--calls` independent calls evaluated together, the median of
`--repeats` such groups, divided by `--calls`; GB/s counts the keys and values read once.

    python benchmarks/paged_attention.py --context 32768 --batch 1,32
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel_core.kernels import CUDA
from mlxcel_core.kernels.paged_attention import (
    paged_decode_attention,
    paged_decode_attention_kernel,
    paged_decode_attention_reference,
)
from mlxcel_core.kernels.paged_attention.grid import num_partitions_for

paged_decode_attention_cuda = functools.partial(paged_decode_attention_kernel, backend=CUDA)

BLOCK_SIZE = 16
# (query heads, KV heads, head dim) of the model shapes in benchmarks/random_model.py.
SHAPES = {"llama-3.2-1b": (32, 8, 64), "llama-3.1-8b": (32, 8, 128)}


@dataclass
class Problem:
    queries: mx.array  # (B, H_q, 1, D)
    key_pool: mx.array  # (slots, H_kv, D)
    value_pool: mx.array
    block_tables: mx.array  # (B, blocks per row) int32
    context_lengths: mx.array  # (B,) int32

    def attend(self, attention: Callable[..., mx.array], **options) -> mx.array:
        return attention(
            self.queries,
            self.key_pool,
            self.value_pool,
            self.block_tables,
            self.context_lengths,
            block_size=BLOCK_SIZE,
            scale=self.queries.shape[-1] ** -0.5,
            **options,
        )


def make_problem(
    lengths: Sequence[int], shape: tuple[int, int, int], dtype: mx.Dtype, seed: int
) -> Problem:
    """Rows of `lengths` positions whose blocks are spread through the pool in random order."""
    num_q_heads, num_kv_heads, head_dim = shape
    rng = np.random.default_rng(seed)
    per_row = [-(-n // BLOCK_SIZE) for n in lengths]
    blocks = 1 + sum(per_row)
    order = rng.permutation(np.arange(1, blocks)).astype(np.int32)
    tables = np.zeros((len(lengths), max(per_row)), np.int32)
    start = 0
    for row, count in enumerate(per_row):
        tables[row, :count] = order[start : start + count]
        start += count
    mx.random.seed(seed)
    pool_shape = (blocks * BLOCK_SIZE, num_kv_heads, head_dim)
    return Problem(
        mx.random.normal((len(lengths), num_q_heads, 1, head_dim)).astype(dtype),
        mx.random.normal(pool_shape).astype(dtype),
        mx.random.normal(pool_shape).astype(dtype),
        mx.array(tables),
        mx.array(np.array(lengths, np.int32)),
    )


def as_float32(problem: Problem) -> Problem:
    return Problem(
        problem.queries.astype(mx.float32),
        problem.key_pool.astype(mx.float32),
        problem.value_pool.astype(mx.float32),
        problem.block_tables,
        problem.context_lengths,
    )


def max_error(a: mx.array, b: mx.array) -> float:
    return (a.astype(mx.float32) - b.astype(mx.float32)).abs().max().item()


def check_correctness(shape_name: str) -> list[str]:
    """Table rows: max abs error of each kernel variant against the bf16 reference."""
    shape = SHAPES[shape_name]
    rows = []
    for batch, lengths in (
        (1, [32768]),
        (4, [1, 300, 4097, 20000]),
        (32, list(np.random.default_rng(1).integers(1, 8192, 32))),
    ):
        problem = make_problem(lengths, shape, mx.bfloat16, seed=batch)
        reference = problem.attend(paged_decode_attention_reference)
        exact = as_float32(problem).attend(paged_decode_attention_reference)
        variants = {
            "one pass": problem.attend(paged_decode_attention_cuda, num_partitions=1),
            "split-KV x7": problem.attend(paged_decode_attention_cuda, num_partitions=7),
            "dispatched": problem.attend(paged_decode_attention),
        }
        mx.eval(reference, exact, *variants.values())
        for name, out in variants.items():
            rows.append(
                f"| {shape_name} | {batch} | {max(lengths)} | {name} | "
                f"{max_error(out, reference):.2e} | {max_error(out, exact):.2e} | "
                f"{max_error(reference, exact):.2e} | {'yes' if mx.isnan(out).any() else 'no'} |"
            )
    return rows


def time_call(function: Callable[[], mx.array], calls: int, repeats: int) -> float:
    """Median seconds per call of `function` (see the module docstring)."""
    for _ in range(3):
        mx.eval([function() for _ in range(calls)])
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval([function() for _ in range(calls)])
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def time_attention(
    shape_name: str,
    batch: int,
    context: int,
    partitions: Sequence[int],
    calls: int,
    repeats: int,
) -> list[str]:
    shape = SHAPES[shape_name]
    _, num_kv_heads, head_dim = shape
    problem = make_problem([context] * batch, shape, mx.bfloat16, seed=context + batch)
    keys = mx.random.normal((batch, num_kv_heads, context, head_dim)).astype(mx.bfloat16)
    values = mx.random.normal((batch, num_kv_heads, context, head_dim)).astype(mx.bfloat16)
    scale = head_dim**-0.5
    mx.eval(keys, values, problem.key_pool, problem.value_pool, problem.queries)
    variants = {
        "paged kernel": lambda: problem.attend(paged_decode_attention),
        "gather then attend": lambda: problem.attend(paged_decode_attention_reference),
        "dense": lambda: mx.fast.scaled_dot_product_attention(
            problem.queries, keys, values, scale=scale
        ),
    }
    for count in partitions:
        variants[f"paged kernel, {count} partitions"] = functools.partial(
            problem.attend, paged_decode_attention_cuda, num_partitions=count
        )
    seconds = {name: time_call(f, calls, repeats) for name, f in variants.items()}
    kv_bytes = 2 * batch * context * num_kv_heads * head_dim * 2
    chosen = num_partitions_for(batch, num_kv_heads, problem.block_tables.shape[1] * BLOCK_SIZE)
    rows = []
    for name, s in seconds.items():
        rows.append(
            f"| {shape_name} | {batch} | {context} | {name} | {s * 1e6:,.1f} | "
            f"{kv_bytes / s / 1e9:,.0f} | {s / seconds['dense']:.2f}x | "
            f"{seconds['gather then attend'] / s:.2f}x |"
        )
    rows.append(f"<!-- {shape_name} B={batch}: dispatched partitions {chosen} -->")
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="llama-3.2-1b,llama-3.1-8b")
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--batch", default="1,32")
    parser.add_argument(
        "--partitions", default="1", help="also time the kernel at these partition counts"
    )
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    shapes = args.shapes.split(",")
    partitions = [int(count) for count in args.partitions.split(",")]
    print(mx.default_device(), "cuda" if mx.cuda.is_available() else "no cuda", flush=True)

    print(
        "| shape | B | longest row | kernel | max abs err vs bf16 reference |"
        " vs f32 reference | bf16 reference vs f32 | NaN |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        print("\n".join(check_correctness(shape)), flush=True)

    print()
    print(
        "| shape | B | context | attention | us per layer | GB/s of KV | vs dense |"
        " speed-up over gather |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        for batch in (int(b) for b in args.batch.split(",")):
            rows = time_attention(shape, batch, args.context, partitions, args.calls, args.repeats)
            print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
