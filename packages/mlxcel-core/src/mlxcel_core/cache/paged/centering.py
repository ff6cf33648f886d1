"""Centering keys on each row's first block, for codecs whose error scales with the norm
they see.

For a codec with `centered` set (TurboQuant) the paged storage stores a row's keys past
its first block as k - m, where m is the per-head mean of that row's first block as
stored (decoded), its first position (the attention sink, whose key is unlike the rest)
left out, and adds m back when it reads them. m is a function of the first block's stored
contents alone: every later position of the row is encoded after that block is full, so
m never changes under it; rows that share a cached prefix share its first block and so
their m; block copies, preemption, rollback and transfers of whole blocks keep it. The
first block's own keys are stored as they are.

Why keys: they share a large common part per head (SmolLM2's mean key holds a median 63%
of its head's key energy) that the softmax does not see (q.(k - m) = q.k - q.m, the same
for every key of one query), while TurboQuant's error is a fixed fraction of the norm it
quantizes. Adding m back makes the centering exact whatever m is. Values are not centered:
on SmolLM2 it did not lower their attention error
(docs/adr/0014-turbo-centered-on-the-first-block.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.cache.quant import KVCodec
from mlxcel_core.cache.quant.turbo import TurboQuantCodec
from mlxcel_core.kernels.turbo_encode import (
    FirstBlockCentering,
    turbo_encode_backend,
    turbo_encode_kernel,
)


@dataclass(frozen=True)
class RowAnchors:
    """Where a batch's rows begin, for storing positions relative to their first block.

    Attributes:
        anchor_slots: (B, A) int32 slots of the positions of each row's first block whose
            mean the later positions are stored against (all but the first, A =
            block_size - 1, for blocks of more than one position).
        write_rows: (N,) int32 row of each written position.
        write_centered: (N,) bool, True where a written position lies past its row's
            first block.
        read_centered: (B, S) bool, True where a read position lies past its row's first
            block (and inside the row).
        writes_first_blocks: some written position lies in its row's first block.
        writes_past_first_blocks: some written position lies past it.
    """

    anchor_slots: mx.array
    write_rows: mx.array
    write_centered: mx.array
    read_centered: mx.array
    writes_first_blocks: bool
    writes_past_first_blocks: bool


def store_parts(pool: Sequence[mx.array], parts: Sequence[mx.array], slots: mx.array) -> None:
    """Write each encoded part into its pool array at `slots`."""
    for array, part in zip(pool, parts, strict=True):
        array[slots] = part


def first_block_means(pool: Sequence[mx.array], codec: KVCodec, anchor_slots: mx.array) -> mx.array:
    """(B, H, D) float32 mean of each row's anchor positions as stored."""
    decoded = codec.decode([array[anchor_slots] for array in pool], mx.float32)
    return mx.mean(decoded, axis=1)


def store_centered(
    pool: Sequence[mx.array], codec: KVCodec, slots: mx.array, x: mx.array, anchors: RowAnchors
) -> None:
    """Store (N, H, D) `x` at (N,) `slots` (slot 0, the null block, for padding): first-block
    positions as they are, the rest relative to their row's first-block mean.

    First-block positions are stored first, so a write that fills a row's first block and
    goes past it centers on what it has just stored. Where a write holds both kinds, each
    pass sends the positions it does not own to slot 0, which nothing reads unmasked; a
    write of one kind (every decode step past the first block) stores at `slots` as they
    are, one operation fewer per layer.
    """
    centered = anchors.write_centered
    both = anchors.writes_first_blocks and anchors.writes_past_first_blocks
    if anchors.writes_first_blocks:
        first = mx.where(centered, 0, slots) if both else slots
        store_parts(pool, codec.encode(x), first)
    if anchors.writes_past_first_blocks:
        past = mx.where(centered, slots, 0) if both else slots
        store_parts(pool, _centered_parts(pool, codec, x, anchors), past)


def _centered_parts(
    pool: Sequence[mx.array], codec: KVCodec, x: mx.array, anchors: RowAnchors
) -> tuple[mx.array, ...]:
    """`x` encoded, the positions past their row's first block relative to its mean."""
    if isinstance(codec, TurboQuantCodec):
        backend = turbo_encode_backend(mx.default_device(), codec.head_dim)
        if backend is not None:
            centering = FirstBlockCentering(
                tuple(pool), anchors.anchor_slots, anchors.write_rows, anchors.write_centered
            )
            return turbo_encode_kernel(x, codec.codebook, centering, backend=backend)
    means = first_block_means(pool, codec, anchors.anchor_slots)[anchors.write_rows]
    shift = mx.where(anchors.write_centered[:, None, None], means, 0.0)
    return codec.encode(x.astype(mx.float32) - shift)


def load_centered(
    pool: Sequence[mx.array], codec: KVCodec, slots: mx.array, dtype: mx.Dtype, anchors: RowAnchors
) -> mx.array:
    """(B, S, H, D) vectors in `dtype` at (B, S) `slots`, with each row's first-block mean
    added back past its first block."""
    decoded = codec.decode([array[slots] for array in pool], mx.float32)
    means = first_block_means(pool, codec, anchors.anchor_slots)[:, None]
    return (decoded + mx.where(anchors.read_centered[..., None, None], means, 0.0)).astype(dtype)
