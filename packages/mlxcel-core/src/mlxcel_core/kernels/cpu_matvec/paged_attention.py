"""Decode attention over paged float32 KV pools on the CPU, by a C kernel reading each
row's positions through its block table (paged_attention.c).

Without it, a CPU decode step gathers every row's keys and values out of the pools in each
layer (`gather_context`), then attends with small matrix products: in a 16-row step of a
dense float32 SmolLM2 the gathers and their copies took about 17% of the step. The kernel
computes the same attention as `paged_decode_attention_reference` from the pools as they
are. Like the other CPU kernels it runs outside MLX's graph: the inputs are evaluated, the
result is computed into a NumPy buffer through ctypes (the GIL released), and it becomes a
new MLX array; the NumPy views of the pools are dropped on return, so MLX may still update
the pools in place.
"""

from __future__ import annotations

import ctypes

import mlx.core as mx
import numpy as np

from mlxcel_core.kernels.cpu_matvec.native import (
    c_buffer,
    describe_kernel,
    entry_point,
)

# The C arguments of `mlxcel_paged_decode_attention`.
_ARGUMENTS = (ctypes.c_void_p,) * 6 + (ctypes.c_int64,) * 8 + (ctypes.c_float, ctypes.c_int)

# Steps scoring at least this many (query head, position) pairs are split over two threads:
# starting and joining one costs tens of microseconds, which a split pays back from some
# 6-10 Ki scores on (docs/adr/0038-cpu-paged-decode-attention.md).
SPLIT_MIN_SCORES = 8 * 2**10


def supports(queries: mx.array, key_pool: mx.array, value_pool: mx.array) -> bool:
    """Whether the kernel takes this attention: float32 queries and pools, with the CPU as
    the default device."""
    return (
        queries.dtype == mx.float32
        and key_pool.dtype == mx.float32
        and value_pool.dtype == mx.float32
        and mx.default_device().type == mx.DeviceType.cpu
    )


def threads_for(rows: int, q_heads: int, positions: int, cpu_streams: int) -> int:
    """Threads for `rows` queries of `q_heads` heads over up to `positions` positions each,
    where the caller may use `cpu_streams` cores: 2 from `SPLIT_MIN_SCORES` on, else 1."""
    large = rows * q_heads * positions >= SPLIT_MIN_SCORES
    return 2 if large and cpu_streams >= 2 else 1


def describe_cpu_paged_attention() -> str:
    """One line saying whether decode attention over float32 paged KV on the CPU runs on
    the C kernel, or on MLX's gather and attention and why."""
    return describe_kernel("MLX's gather and attention")


def cpu_paged_decode_attention(
    queries: mx.array,
    key_pool: mx.array,
    value_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    block_size: int,
    scale: float,
    threads: int = 1,
) -> mx.array:
    """One query per row attending to that row's positions in the paged pools, by the C
    kernel: the attention of `paged_decode_attention_reference`, within float32 rounding.

    Evaluates its inputs. The same bits on one thread as on two.

    Args:
        queries: (B, H_q, 1, D) float32 queries; H_q a multiple of H_kv.
        key_pool: (slots, H_kv, D) float32 keys; slot `b * block_size + p` holds position
            p of block b.
        value_pool: (slots, H_kv, D_v) float32 values.
        block_tables: (B, max_blocks) int32 block ids of each row, in position order;
            entries past a row's length are not read.
        context_lengths: (B,) int32 positions each row attends to, at most
            `max_blocks * block_size`.
        block_size: tokens per block, >= 1.
        scale: multiplier of the query-key dot products.
        threads: 1, or 2 to split the rows' heads over a second thread.

    Returns:
        (B, H_q, 1, D_v) float32, a new array; zeros for a row of length 0.

    Raises:
        ValueError: inputs `supports` refuses, shapes that disagree, `threads` other than
            1 and 2, a length past the block table (or negative), a block a row reads that
            lies past the pools, or the library is not available (see
            `native.NativeLibrary.reason`).
        MemoryError: the kernel's scratch could not be allocated.
    """
    if not supports(queries, key_pool, value_pool):
        raise ValueError(
            "the CPU paged attention kernel takes float32 queries and pools on the CPU; got "
            f"queries {queries.dtype}, pools {key_pool.dtype} and {value_pool.dtype} on "
            f"{mx.default_device()}"
        )
    if threads not in (1, 2):
        raise ValueError(f"threads must be 1 or 2, got {threads}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    _check_shapes(queries, key_pool, value_pool, block_tables, context_lengths)
    B, H_q, _, D = queries.shape
    slots, H_kv, D_v = value_pool.shape
    tables, lengths = (
        array if array.dtype == mx.int32 else array.astype(mx.int32)
        for array in (block_tables, context_lengths)
    )
    mx.eval(queries, key_pool, value_pool, tables, lengths)
    out = np.empty((B, H_q, 1, D_v), dtype=np.float32)
    held = [c_buffer(array) for array in (queries, key_pool, value_pool, tables, lengths)]
    status = entry_point("mlxcel_paged_decode_attention", *_ARGUMENTS)(
        *(pointer for pointer, _ in held),
        out.ctypes.data,
        B, H_q, H_kv, D, D_v, tables.shape[1], block_size, slots, scale, threads,
    )  # fmt: skip
    del held
    if status == -2:
        raise MemoryError("the CPU paged attention kernel could not allocate its scratch")
    if status != 0:
        raise ValueError(
            "the CPU paged attention kernel refused the block tables: a context length past "
            f"{tables.shape[1]} blocks of {block_size} (or negative), or a block past the "
            f"pools' {slots} slots"
        )
    return mx.array(out)


def _check_shapes(
    queries: mx.array,
    key_pool: mx.array,
    value_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
) -> None:
    if not _shapes_agree(queries, key_pool, value_pool, block_tables, context_lengths):
        raise ValueError(
            "the CPU paged attention kernel takes queries (B, H_q, 1, D), pools (slots, H_kv, "
            "D) and (slots, H_kv, D_v) with H_q a multiple of H_kv, block tables "
            "(B, max_blocks) and lengths (B,); got queries "
            f"{queries.shape}, pools {key_pool.shape} and {value_pool.shape}, tables "
            f"{block_tables.shape}, lengths {context_lengths.shape}"
        )


def _shapes_agree(
    queries: mx.array,
    key_pool: mx.array,
    value_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
) -> bool:
    if queries.ndim != 4 or key_pool.ndim != 3 or value_pool.ndim != 3 or block_tables.ndim != 2:
        return False
    B, H_q, L, D = queries.shape
    slots, H_kv, _ = key_pool.shape
    return (
        L == 1
        and H_q % H_kv == 0
        and key_pool.shape[2] == D
        and value_pool.shape[:2] == (slots, H_kv)
        and block_tables.shape[0] == B
        and context_lengths.shape == (B,)
    )


__all__ = [
    "SPLIT_MIN_SCORES",
    "cpu_paged_decode_attention",
    "describe_cpu_paged_attention",
    "supports",
    "threads_for",
]
