"""How the paged decode attention kernels are launched, on either backend: threads per
block, shared memory, split-KV partitions, and the launch of one pass or split then merge.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence

import mlx.core as mx

# Threads per block of the attention kernel: 4 warps.
THREADS = 128
# Elements of a head each lane reads per position: 16 bytes of a 16-bit dtype.
LANE_ELEMENTS = 8
# Head dims whose `LANE_ELEMENTS`-element lane slices tile within a warp.
HEAD_DIMS = (8, 16, 32, 64, 128, 256)
# Blocks the split-KV variant aims to launch, and the fewest positions of a partition: on an
# H200 at 32k positions, 16-64 partitions of one row beat 4 and 256 (docs/benchmarks.md).
TARGET_BLOCKS = 2048
MIN_PARTITION_TOKENS = 512


def float_bits(value: float) -> int:
    """The float32 bit pattern of `value` as a signed int: kernel template arguments are
    ints, and a model's attention scale is one constant, so it is compiled in."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


def shared_bytes(group_size: int, head_dim: int) -> int:
    """Static shared memory of one attention block (bytes): per position lane, a max and
    a sum per query head of the group and a (group, head_dim) accumulator, in float32."""
    lanes_per_token = head_dim // LANE_ELEMENTS
    states = THREADS // 32 * (32 // lanes_per_token)
    return states * group_size * (head_dim + 2) * 4


def num_partitions_for(num_rows: int, num_kv_heads: int, capacity_tokens: int) -> int:
    """Partitions per row: 1 (the one-pass kernel) when rows x KV heads already make
    `TARGET_BLOCKS` blocks, else enough to reach it, each of at least
    `MIN_PARTITION_TOKENS` positions of the block tables' capacity."""
    blocks = num_rows * num_kv_heads
    wanted = math.ceil(TARGET_BLOCKS / blocks)
    most = max(1, capacity_tokens // MIN_PARTITION_TOKENS)
    return max(1, min(wanted, most))


def check_launch(num_partitions: int, scale: float) -> None:
    """Raise `ValueError` where `num_partitions` < 1 or `scale` is not > 0."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")


def launch_partitioned(
    kernels: Mapping[str, object],
    inputs: Sequence[mx.array],
    template: Sequence[tuple[str, object]],
    *,
    shape: tuple[int, int, int, int],
    num_partitions: int,
    output_dtype: mx.Dtype,
) -> mx.array:
    """Launch `kernels`' one-pass kernel over a grid of one block per (KV head, row), or
    its split kernel over `num_partitions` partitions of each row, then the merge.

    Args:
        kernels: as `source.attention_kernels` builds them, on either backend.
        inputs: the attention kernel's inputs.
        template: its template arguments.
        shape: (B, H_q, H_kv, D): rows, query heads, KV heads, output features.
        num_partitions: 1 for the one-pass kernel.
        output_dtype: the dtype of the (B, H_q, 1, D) result.
    """
    B, H_q, H_kv, D = shape
    grid = (H_kv * THREADS, B, num_partitions)
    if num_partitions == 1:
        (output,) = kernels["one_pass"](
            inputs=inputs,
            template=template,
            grid=grid,
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(B, H_q, 1, D)],
            output_dtypes=[output_dtype],
        )
        return output
    parts = (B, H_q, num_partitions)
    partial_out, partial_max, partial_sum = kernels["split"](
        inputs=inputs,
        template=template,
        grid=grid,
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(*parts, D), parts, parts],
        output_dtypes=[mx.float32, mx.float32, mx.float32],
    )
    (output,) = kernels["merge"](
        inputs=[partial_out, partial_max, partial_sum],
        template=[("T", output_dtype), ("D", D)],
        grid=(B * H_q * D, 1, 1),
        threadgroup=(min(256, B * H_q * D), 1, 1),
        output_shapes=[(B, H_q, 1, D)],
        output_dtypes=[output_dtype],
    )
    return output
