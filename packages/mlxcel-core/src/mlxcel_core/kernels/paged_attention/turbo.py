"""Paged decode attention over TurboQuant KV blocks, read as stored, as one kernel source
for CUDA and Metal.

The codes are never decoded to head-vectors. TurboQuant stores a head-vector x as b-bit
codes c of its rotated rest (x with its outlier features zeroed, rotated by R, quantized
to Lloyd-Max levels y = levels[c]), a scale s, and each outlier feature's position p and
value o (`mlxcel_core.cache.quant.turbo`). With x_hat the decoded vector:

- a key's score is q . x_hat = s (q R) . y + sum_p q[p] (o - r[p]), where r = s y R^T is
  the decoded rest, whose entry r[p] = s sum_i y_i R[p, i] is one dot product per outlier;
- a value enters the output in rotated coordinates, w = s y + sum_p (o - r[p]) R[p, :],
  and the block's weighted sum of w is rotated back once, by R^T, after the softmax.

R = diag(signs) H / sqrt(D) with Sylvester's H, so the kernel forms R[p, i] from the signs
and the parity of p & i. Keys past a row's first block are stored relative to that block's
mean m (`mlxcel_core.cache.paged.centering`); their scores get q . m back, which is the
mean of the anchor positions' own scores, so each block computes it from those positions
first.

The rest is the float kernels' design (`source.py`): one block per (row, KV head) and
partition, D / 8 lanes per position with 8 rotated coordinates each (one run of 8 packed
codes, b bytes), an online softmax per query head of the group, and the split-KV variant
with the same merge kernel. Their source is `turbo_source.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.kernels.backend import Backend
from mlxcel_core.kernels.paged_attention.grid import (
    HEAD_DIMS,
    LANE_ELEMENTS,
    THREADS,
    check_launch,
    float_bits,
    launch_partitioned,
    num_partitions_for,
    shared_bytes,
)
from mlxcel_core.kernels.paged_attention.turbo_source import kernels


@dataclass(frozen=True)
class TurboPool:
    """One layer's keys or values as TurboQuant stores them in the paged pools.

    Attributes:
        codes: (slots, H_kv, D * bits / 8) uint8 packed codes.
        scales: (slots, H_kv, 1) float16.
        positions: (slots, H_kv, outliers) uint8 or uint16 outlier features.
        outliers: (slots, H_kv, outliers) float16 their values.
        levels: (2**bits,) float32 reconstruction level of each code.
        bits: bits per code.
    """

    codes: mx.array
    scales: mx.array
    positions: mx.array
    outliers: mx.array
    levels: mx.array
    bits: int


def _anchor_begin(block_size: int) -> int:
    # As the paged batch picks a row's anchors: its first block past position 0, unless
    # the block holds one position.
    return min(1, block_size - 1)


def turbo_shared_bytes(group_size: int, head_dim: int, key_bits: int, value_bits: int) -> int:
    """Static shared memory of one block (bytes): the float kernel's states, plus the
    rotation's signs, both codebooks and the group's anchor scores, in float32."""
    extra = head_dim + 2**key_bits + 2**value_bits + group_size
    return shared_bytes(group_size, head_dim) + 4 * extra


def supports_turbo(
    backend: Backend,
    group_size: int,
    key_dim: int,
    value_dim: int,
    key_bits: int,
    value_bits: int,
) -> bool:
    """Whether the kernels on `backend` take this layer: keys and values of one head dim
    of `HEAD_DIMS`, 1 to 8 bits each, and shared memory to spare on `backend` (so fewer
    group sizes on Metal than on CUDA at head dim 128)."""
    return (
        key_dim == value_dim
        and key_dim in HEAD_DIMS
        and 1 <= key_bits <= 8
        and 1 <= value_bits <= 8
        and turbo_shared_bytes(group_size, key_dim, key_bits, value_bits)
        <= backend.max_shared_bytes
    )


def turbo_decode_attention_kernel(
    queries: mx.array,
    keys: TurboPool,
    values: TurboPool,
    rotation: mx.array,
    signs: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    block_size: int,
    scale: float,
    backend: Backend,
    num_partitions: int | None = None,
) -> mx.array:
    """Decode attention read straight from TurboQuant pools with centered keys, by
    `backend`'s kernels: what decoding the row's keys and values
    (`PagedKVStorage.gather`) and attending would give, up to rounding.

    Args:
        queries: (B, H_q, 1, D) queries; H_q a multiple of H_kv.
        keys: the layer's key pool; keys past each row's first block stored relative to
            the mean of that block's positions 1 .. block_size - 1 (all of it for one
            position per block).
        values: the layer's value pool, uncentered.
        rotation: (D, D) float32 R of the codec.
        signs: (D,) float32 random signs of R.
        block_tables: (B, max_blocks) int32 block ids of each row, in position order.
        context_lengths: (B,) int32 positions each row attends to.
        block_size: tokens per block.
        scale: multiplier of the query-key dot products.
        backend: `CUDA` or `METAL`, the default device's GPU backend, for a layer
            `supports_turbo` says it takes.
        num_partitions: split each row's block-table capacity into this many partitions;
            None picks with `num_partitions_for`.

    Returns:
        (B, H_q, 1, D) in the queries' dtype; a row of length 0 gives zeros.

    Raises:
        ValueError: `num_partitions` is < 1 or `scale` is not > 0.
    """
    B, H_q, _, D = queries.shape
    H_kv = keys.codes.shape[1]
    if num_partitions is None:
        num_partitions = num_partitions_for(B, H_kv, block_tables.shape[1] * block_size)
    check_launch(num_partitions, scale)
    plain = queries.reshape(B, H_q, D)
    inputs = [
        plain,
        plain.astype(mx.float32) @ rotation,
        keys.codes,
        keys.scales,
        keys.positions,
        keys.outliers,
        values.codes,
        values.scales,
        values.positions,
        values.outliers,
        signs,
        keys.levels,
        values.levels,
        block_tables.astype(mx.int32),
        context_lengths.astype(mx.int32),
    ]
    template = [
        ("T", queries.dtype),
        ("G", H_q // H_kv),
        ("D", D),
        ("BLOCK_SIZE", block_size),
        ("THREADS", THREADS),
        ("LANE_ELEMENTS", LANE_ELEMENTS),
        ("KEY_BITS", keys.bits),
        ("VALUE_BITS", values.bits),
        ("OUTLIERS", keys.positions.shape[2]),
        ("ANCHOR_BEGIN", _anchor_begin(block_size)),
        ("SCALE_BITS", float_bits(scale)),
    ]
    rotated = launch_partitioned(
        kernels(backend),
        inputs,
        template,
        shape=(B, H_q, H_kv, D),
        num_partitions=num_partitions,
        output_dtype=mx.float32,
    )
    return (rotated @ rotation.T).astype(queries.dtype)
