"""Decode attention over a paged KV cache, read through the block tables.

`paged_decode_attention` runs a backend's kernels (`decode.py`) where
`decode_kernel_backend` names one for the layer, and the plain-MLX reference everywhere
else (docs/adr/0015-paged-decode-kernel.md). `turbo_decode_attention_kernel` reads
TurboQuant pools as stored, where `turbo_decode_kernel_backend` names a backend for the
layer. Both kernels are one source for CUDA and Metal; the Metal ones run only when the
installed `KernelOptions` turn them on (`mlxcel_core.kernels.options`). `attend_per_query`
serves passes of up to `MAX_QUERIES_PER_ROW` queries per row (a speculative verification,
a short prefill chunk) with these one-query kernels.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import mlx.core as mx

from mlxcel_core.kernels import cpu_matvec
from mlxcel_core.kernels.backend import Backend
from mlxcel_core.kernels.cpu_matvec import paged_attention as cpu_attention
from mlxcel_core.kernels.options import kernel_backend
from mlxcel_core.kernels.paged_attention import decode
from mlxcel_core.kernels.paged_attention.decode import paged_decode_attention_kernel
from mlxcel_core.kernels.paged_attention.reference import (
    gather_context,
    paged_decode_attention_reference,
)
from mlxcel_core.kernels.paged_attention.turbo import (
    TurboPool,
    supports_turbo,
    turbo_decode_attention_kernel,
)

# Most queries of one row a pass may have for the kernels to serve it: each reads the row's
# context once more (from L2 at the lengths a verification meets), so long prefill chunks
# stay with cuDNN's attention over the gathered context.
MAX_QUERIES_PER_ROW = 8
# Queries in a pass (rows times queries per row) from which the CPU kernel attends. It
# makes the forward pass wait for each layer's queries, so the host stops building the rest
# of the step meanwhile; at one query that costs more than the gather it saves. Measured
# on a 2-core Xeon with SmolLM2 float32 through the engine (docs/adr/0038): one row 12.2-13.0
# tok/s with the kernel against 15.5-16.8 gathering, two rows 22.7-22.9 against 20.3-21.5.
CPU_KERNEL_MIN_QUERIES = 2


def attend_per_query(
    attend: Callable[[mx.array, mx.array, mx.array], mx.array],
    queries: mx.array,
    block_tables: mx.array,
    query_lengths: mx.array,
) -> mx.array:
    """Several queries per row through a one-query-per-row kernel: each query becomes a row
    of its own over its row's block table, attending to the positions it may see (the
    causal rule among a row's queries), so no context is gathered.

    Args:
        attend: the kernel, called as `attend(queries, block_tables, context_lengths)`
            with (R, H_q, 1, D) queries, (R, max_blocks) tables and (R,) lengths, and
            returning (R, H_q, 1, D_v).
        queries: (B, H_q, L, D).
        block_tables: (B * L, max_blocks) int32: row b's table for each of its L queries
            (`PagedBatch.query_tables`).
        query_lengths: (B * L,) int32: positions query i of row b attends to, its own
            included.

    Returns:
        (B, H_q, L, D_v) in the kernel's output dtype.
    """
    B, H_q, L, D = queries.shape
    rows = queries.transpose(0, 2, 1, 3).reshape(B * L, H_q, 1, D)
    out = attend(rows, block_tables, query_lengths)
    return out.reshape(B, L, H_q, -1).transpose(0, 2, 1, 3)


def decode_kernel_backend(
    device: mx.Device,
    dtype: mx.Dtype,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    value_dim: int,
) -> Backend | None:
    """The backend whose kernels `paged_decode_attention` runs for this layer on
    `device` (`kernel_backend`'s, where its kernels support the layer), or None where it
    runs the reference."""
    backend = kernel_backend(device)
    group_size = num_q_heads // num_kv_heads
    if backend is None or not decode.supports(backend, dtype, group_size, head_dim, value_dim):
        return None
    return backend


def serves_on_cpu(queries: mx.array, key_pool: mx.array, value_pool: mx.array) -> bool:
    """Whether `cpu_decode_attention` serves these (B, H_q, L, D) queries and pools:
    float32 ones with the CPU as the default device, at least `CPU_KERNEL_MIN_QUERIES`
    queries in all, and the CPU kernels' library built."""
    return (
        queries.shape[0] * queries.shape[2] >= CPU_KERNEL_MIN_QUERIES
        and cpu_attention.supports(queries, key_pool, value_pool)
        and cpu_matvec.available()
    )


def cpu_decode_attention(
    queries: mx.array,
    key_pool: mx.array,
    value_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    block_size: int,
    scale: float,
) -> mx.array:
    """`cpu_paged_decode_attention` on one thread, or two for a large step where the
    process may run on two cores.

    Arguments, result and errors as `cpu_paged_decode_attention`'s.
    """
    B, H_q, _, _ = queries.shape
    threads = cpu_attention.threads_for(
        B, H_q, block_tables.shape[1] * block_size, os.cpu_count() or 1
    )
    return cpu_attention.cpu_paged_decode_attention(
        queries,
        key_pool,
        value_pool,
        block_tables,
        context_lengths,
        block_size=block_size,
        scale=scale,
        threads=threads,
    )


def turbo_decode_kernel_backend(
    device: mx.Device,
    num_q_heads: int,
    num_kv_heads: int,
    key_dim: int,
    value_dim: int,
    key_bits: int,
    value_bits: int,
) -> Backend | None:
    """The backend whose `turbo_decode_attention_kernel` serves a layer of TurboQuant
    keys and values of these bits on `device` (`kernel_backend`'s, where its kernels
    support the layer), or None."""
    backend = kernel_backend(device)
    group_size = num_q_heads // num_kv_heads
    if backend is None or not supports_turbo(
        backend, group_size, key_dim, value_dim, key_bits, value_bits
    ):
        return None
    return backend


def paged_decode_attention(
    queries: mx.array,
    key_pool: mx.array,
    value_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    block_size: int,
    scale: float,
) -> mx.array:
    """One query per row attending to that row's positions in the paged pools.

    Arguments and result as `paged_decode_attention_reference`. On the default device,
    `decode_kernel_backend` decides between a backend's kernels and that reference, and
    where it names none, `serves_on_cpu` between the CPU kernel and the reference.
    """
    _, H_q, _, D = queries.shape
    backend = decode_kernel_backend(
        mx.default_device(), key_pool.dtype, H_q, key_pool.shape[1], D, value_pool.shape[2]
    )
    if backend is not None:
        return paged_decode_attention_kernel(
            queries,
            key_pool,
            value_pool,
            block_tables,
            context_lengths,
            block_size=block_size,
            scale=scale,
            backend=backend,
        )
    attend = (
        cpu_decode_attention
        if serves_on_cpu(queries, key_pool, value_pool)
        else paged_decode_attention_reference
    )
    return attend(
        queries,
        key_pool,
        value_pool,
        block_tables,
        context_lengths,
        block_size=block_size,
        scale=scale,
    )


__all__ = [
    "CPU_KERNEL_MIN_QUERIES",
    "MAX_QUERIES_PER_ROW",
    "TurboPool",
    "attend_per_query",
    "cpu_decode_attention",
    "decode_kernel_backend",
    "gather_context",
    "paged_decode_attention",
    "paged_decode_attention_kernel",
    "paged_decode_attention_reference",
    "serves_on_cpu",
    "turbo_decode_attention_kernel",
    "turbo_decode_kernel_backend",
]
