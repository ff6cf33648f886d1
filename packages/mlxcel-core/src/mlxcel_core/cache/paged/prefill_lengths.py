"""Causal prefill attention at rounded lengths, so MLX's CUDA backend reuses its attention plans.

MLX's CUDA backend runs attention with more than one query through cuDNN, which builds an
execution plan for every distinct shape of the queries, keys and values and keeps the last
256 in a per-thread LRU cache (`MLX_CUDA_SDPA_CACHE_SIZE`). On one H200, building one took
50-90 ms, while a whole forward pass of a 1B model over 400 tokens took 5-8 ms once its
plan existed (docs/benchmarks.md, "Prefill attention plans on one H200"). A server meets
prompts of every length, so without rounding nearly every prefill pays for a new plan.

Padding the queries, keys and values at the end by the same number of positions keeps the
causal mask exact: MLX aligns it to the bottom right, so real query i still sees keys up to
`offset + i` and never a padded one, and the padded queries' outputs are dropped. The query
count becomes a multiple of `PREFILL_QUERY_MULTIPLE`, so prompts of up to 512 tokens on an
empty cache share eight plans. The key count stays `offset` plus that, so a chunk after a
prefix-cache hit still meets a new plan for each new offset, and so does a one-row
speculative verification pass (a few queries), whose offset grows every step: rounding
costs it a little attention work and gains nothing.
"""

from __future__ import annotations

import os

import mlx.core as mx

# Positions the query count is rounded up to. Padding costs attention work only (the
# model's other layers run on the real positions), at most 63 queries per pass.
PREFILL_QUERY_MULTIPLE = 64
# MLX's switch for cuDNN attention on CUDA; "0" sends attention to its unfused fallback,
# which builds no plans.
CUDNN_ATTENTION_VARIABLE = "MLX_CUDA_USE_CUDNN_SDPA"
# What MLX 0.32 sends to cuDNN: half-precision queries with key and value head sizes that
# are multiples of 8, up to 128.
_CUDNN_DTYPES = (mx.float16, mx.bfloat16)
_CUDNN_MAX_HEAD_DIM = 128


def rounds_prefill_lengths(queries: mx.array, values: mx.array) -> bool:
    """Whether this attention runs at a rounded query count: where MLX's CUDA backend would
    attend through cuDNN, whose plans were measured to cost per shape. The CPU showed no such
    cost and Metal's is unmeasured, so they attend at the real length.

    Args:
        queries: (B, H_q, L, D_k).
        values: (B, H_kv, S, D_v).
    """
    head_dims = (queries.shape[-1], values.shape[-1])
    return (
        mx.default_device().type == mx.DeviceType.gpu
        and mx.cuda.is_available()
        and os.environ.get(CUDNN_ATTENTION_VARIABLE, "1") != "0"
        and queries.dtype in _CUDNN_DTYPES
        and all(dim % 8 == 0 and dim <= _CUDNN_MAX_HEAD_DIM for dim in head_dims)
    )


def causal_attention_at_rounded_length(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    *,
    scale: float,
    multiple: int = PREFILL_QUERY_MULTIPLE,
) -> mx.array:
    """`mx.fast.scaled_dot_product_attention` under its bottom-right causal mask, with the
    queries, keys and values padded at the end so the query count is a multiple of `multiple`.

    Args:
        queries: (B, H_q, L, D_k), H_q a multiple of H_kv.
        keys: (B, H_kv, S, D_k), S >= L; the last L positions are the queries' own.
        values: (B, H_kv, S, D_v).
        scale: multiplier of the query-key dot products.
        multiple: the query count is rounded up to a multiple of this (positions).

    Returns:
        (B, H_q, L, D_v) in the queries' dtype: the attention of the real queries alone.

    Raises:
        ValueError: `multiple` < 1, or S < L.
    """
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    num_queries, num_keys = queries.shape[2], keys.shape[2]
    if num_keys < num_queries:
        raise ValueError(f"{num_keys} keys cannot hold the {num_queries} queries' own positions")
    padding = -num_queries % multiple
    if padding == 0:
        return mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=scale, mask="causal"
        )
    at_end = [(0, 0), (0, 0), (0, padding), (0, 0)]
    attended = mx.fast.scaled_dot_product_attention(
        mx.pad(queries, at_end),
        mx.pad(keys, at_end),
        mx.pad(values, at_end),
        scale=scale,
        mask="causal",
    )
    return attended[:, :, :num_queries]
