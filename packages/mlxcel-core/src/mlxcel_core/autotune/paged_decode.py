"""Timing the CUDA paged decode kernel's split count on random pools of one shape."""

from __future__ import annotations

import mlx.core as mx

from mlxcel_core.kernels.backend import CUDA
from mlxcel_core.kernels.paged_attention.decode import paged_decode_attention_kernel
from mlxcel_core.kernels.paged_attention.grid import MIN_PARTITION_TOKENS, num_partitions_for

# Split counts a search tries, besides the default, up to what `num_partitions_for` allows.
PARTITION_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)
# Kernel launches per timed call: one launch is tens of microseconds, near the cost of
# the call's own synchronization, so several are queued and evaluated together.
LAUNCHES_PER_CALL = 16


def partition_candidates(capacity_tokens: int, default: int) -> tuple[int, ...]:
    """`PARTITION_CANDIDATES` of at least `MIN_PARTITION_TOKENS` positions each, as
    `num_partitions_for` caps them, and `default`, ascending."""
    most = max(1, capacity_tokens // MIN_PARTITION_TOKENS)
    return tuple(sorted({count for count in PARTITION_CANDIDATES if count <= most} | {default}))


class DecodeKernelProblem:
    """Random queries and full pools of one decode step's shape, for timing split counts.

    Every row holds `capacity_tokens` positions in blocks of its own, shuffled through
    the pool as a long-running cache's are.

    Args:
        dtype: the pools' and queries' dtype (float16, bfloat16 or float32).
        num_q_heads: query heads (H_q), a multiple of `num_kv_heads`.
        num_kv_heads: key/value heads (H_kv).
        head_dim: features per head (D).
        num_rows: sequences decoded together (B).
        capacity_tokens: positions of each row's block table, a multiple of `block_size`.
        block_size: tokens per block.
    """

    def __init__(
        self,
        *,
        dtype: mx.Dtype,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        num_rows: int,
        capacity_tokens: int,
        block_size: int = 16,
    ) -> None:
        blocks_per_row = capacity_tokens // block_size
        num_blocks = num_rows * blocks_per_row + 1  # block 0 is the null block
        keys = mx.random.key(0)
        k_key, v_key, q_key, order_key = mx.random.split(keys, 4)
        slots = (num_blocks * block_size, num_kv_heads, head_dim)
        self.key_pool = mx.random.normal(slots, key=k_key).astype(dtype)
        self.value_pool = mx.random.normal(slots, key=v_key).astype(dtype)
        self.queries = mx.random.normal((num_rows, num_q_heads, 1, head_dim), key=q_key).astype(
            dtype
        )
        order = mx.random.permutation(num_blocks - 1, key=order_key) + 1
        self.block_tables = order.reshape(num_rows, blocks_per_row).astype(mx.int32)
        self.context_lengths = mx.full((num_rows,), capacity_tokens, dtype=mx.int32)
        self.block_size = block_size
        self.scale = head_dim**-0.5
        self.default_partitions = num_partitions_for(num_rows, num_kv_heads, capacity_tokens)
        mx.eval(self.key_pool, self.value_pool, self.queries, self.block_tables)

    def __call__(self, num_partitions: int) -> None:
        """Run the kernel `LAUNCHES_PER_CALL` times with `num_partitions` and wait."""
        outputs = [
            paged_decode_attention_kernel(
                self.queries,
                self.key_pool,
                self.value_pool,
                self.block_tables,
                self.context_lengths,
                block_size=self.block_size,
                scale=self.scale,
                backend=CUDA,
                num_partitions=num_partitions,
            )
            for _ in range(LAUNCHES_PER_CALL)
        ]
        mx.eval(outputs)
