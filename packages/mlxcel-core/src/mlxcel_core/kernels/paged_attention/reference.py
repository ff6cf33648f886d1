"""Paged decode attention in plain MLX: gather each row's context, then attend."""

from __future__ import annotations

import mlx.core as mx


def gather_context(
    pool: mx.array, block_tables: mx.array, context_lengths: mx.array, block_size: int
) -> mx.array:
    """Each row's positions read from a pool through its block table, padded to the table.

    Args:
        pool: (slots, H_kv, D) keys or values; slot `b * block_size + p` holds position p
            of block b.
        block_tables: (B, max_blocks) int32 block ids; entries past a row's context may
            hold any valid id.
        context_lengths: (B,) int32 positions each row holds.
        block_size: tokens per block.

    Returns:
        (B, H_kv, max_blocks * block_size, D) in the pool's dtype; positions at or past a
        row's length read slot 0 (the null block).
    """
    max_blocks = block_tables.shape[1]
    positions = mx.arange(max_blocks * block_size)
    slots = block_tables[:, positions // block_size] * block_size + positions % block_size
    slots = mx.where(positions < context_lengths[:, None], slots, 0)
    return pool[slots].transpose(0, 2, 1, 3)


def paged_decode_attention_reference(
    queries: mx.array,
    key_pool: mx.array,
    value_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    block_size: int,
    scale: float,
) -> mx.array:
    """One query per row attending to that row's cached positions (gather, then attend).

    The numbers are those of the paged cache's gather path: the same gather and
    `mx.fast.scaled_dot_product_attention` with each row's padding masked out.

    Args:
        queries: (B, H_q, 1, D) queries; H_q is a multiple of H_kv (grouped-query heads).
        key_pool: (slots, H_kv, D) keys, as `PagedKVStorage` keeps an unquantized pool.
        value_pool: (slots, H_kv, D_v) values.
        block_tables: (B, max_blocks) int32 block ids of each row, in position order.
        context_lengths: (B,) int32 positions each row attends to (its new one included).
        block_size: tokens per block.
        scale: multiplier of the query-key dot products.

    Returns:
        (B, H_q, 1, D_v) in the queries' dtype. A row of length 0 attends to nothing; its
        result is unspecified.
    """
    keys = gather_context(key_pool, block_tables, context_lengths, block_size)
    values = gather_context(value_pool, block_tables, context_lengths, block_size)
    positions = mx.arange(keys.shape[2])
    mask = (positions < context_lengths[:, None])[:, None, None, :]
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)
