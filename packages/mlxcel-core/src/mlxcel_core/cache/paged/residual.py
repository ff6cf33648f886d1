"""A residual window: each row's most recent positions kept exact beside a quantized cache.

KIVI (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", ICML
2024) keeps each sequence's latest keys and values in full precision and quantizes only
older ones, since a query attends most to its nearest positions. Here the unit is the
block. A block that a pass starts writing (its first position is among the pass's new
positions) while it lies within its row's last `window` positions gets a residual block:
an exact copy, in `residual_dtype` of the layer's. From then on every write to the block
is stored both ways, and a read of its positions takes the exact copy. A pass of several
positions (a prefill chunk, a speculative verification) also reads its own new positions
exactly, from the keys and values it has just made, and keeps the blocks holding its first
query's window; so each of its queries sees at least its own last `window` positions
exact, as a decode pass does.

Nothing else attaches a residual block, so a block's copy holds every position written
since: later positions are written by `PagedKVStorage.write` with their exact copies, and
whole-block copies (copy-on-write) carry it along; a block a pass starts writing may keep
a copy it had, as the pass writes it again from its first position. A block overwritten
whole from elsewhere (`PagedKVStorage.write_blocks`) loses its copy. A block its row has
moved past (wholly before the first query's window) gives its residual block back.

Residual blocks are a fixed set, handed out least recently used first: one whose block was
freed, or whose row stopped, is never seen in a window again and is the first taken. A
block that loses its copy is read as stored (decoded), which is correct, only less exact.
The plan depends on the passes alone, so every rank of a tensor or pipeline group, seeing
the same passes, makes the same one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import mlx.core as mx
import numpy as np


def residual_dtype(dtype: mx.Dtype) -> mx.Dtype:
    """The dtype of exact copies of keys or values made in `dtype`: float16 for float32
    (as the f16 cache type stores them: its error is far below any quantized type's, at
    half the bytes), else `dtype` itself."""
    return mx.float16 if dtype == mx.float32 else dtype


@dataclass(frozen=True)
class ResidualSlots:
    """Where one pass reads and writes the exact copies.

    Attributes:
        write_slots: (N,) int32 residual slot of each written position, in the order of
            the pass's write slots; slot 0 (the null residual block) for positions whose
            block has no residual block.
        read_slots: (B, S) int32 residual slot of each read position; 0 where `exact` is
            False.
        exact: (B, S) bool, True where a read position has an exact copy.
        in_pass: (B, S) bool, True where a read position is one of the pass's new ones.
        pass_index: (B, S) int32 index of a new position among its row's new ones (0
            elsewhere).
    """

    write_slots: mx.array
    read_slots: mx.array
    exact: mx.array
    in_pass: mx.array
    pass_index: mx.array

    def with_new_positions(self, context: mx.array, new: mx.array) -> mx.array:
        """`context` with the pass's new positions taken from `new`, rounded as exact
        copies are.

        Args:
            context: (B, H, S, D) keys or values as read for the pass.
            new: (B, H, L, D) the pass's new keys or values, in the layer's dtype.

        Returns:
            (B, H, S, D) in `context`'s dtype.
        """
        rounded = new.astype(residual_dtype(new.dtype)).astype(context.dtype)
        spread = mx.take_along_axis(rounded, self.pass_index[:, None, :, None], axis=2)
        return mx.where(self.in_pass[:, None, :, None], spread, context)

    def rows(self, rows: mx.array, num_keys: int) -> tuple[mx.array, mx.array]:
        """`read_slots` and `exact` of some rows' first `num_keys` positions."""
        return self.read_slots[rows, :num_keys], self.exact[rows, :num_keys]


def residual_blocks_per_row(window: int, block_size: int) -> int:
    """The most blocks a row's last `window` positions can touch."""
    return -(-(window - 1) // block_size) + 1 if window > 0 else 0


class ResidualPlanner:
    """Which blocks have residual blocks, and the slots each pass uses (host only).

    Args:
        window: positions kept exact at the end of each row (>= 1).
        block_size: tokens per block.
        num_residual_blocks: residual blocks available, the null residual block 0 not
            included.

    Raises:
        ValueError: `window`, `block_size` or `num_residual_blocks` is < 1.
    """

    def __init__(self, window: int, block_size: int, num_residual_blocks: int) -> None:
        for name, value in (
            ("window", window),
            ("block_size", block_size),
            ("num_residual_blocks", num_residual_blocks),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.window = window
        self.block_size = block_size
        self.num_residual_blocks = num_residual_blocks
        # Block id -> residual block, least recently seen in a window first.
        self._residual_of: OrderedDict[int, int] = OrderedDict()
        self._unused = list(range(num_residual_blocks, 0, -1))

    def residual_of(self, block_id: int) -> int | None:
        """The block's residual block, or None."""
        return self._residual_of.get(block_id)

    def plan(
        self,
        tables: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        key_positions: np.ndarray | None = None,
    ) -> ResidualSlots:
        """Update the residual blocks for one pass and return its slots.

        Args:
            tables: (B, T) int32 block tables, padded with -1.
            offsets: (B,) int32 positions already in the cache.
            lengths: (B,) int32 positions once the pass is done (offset + new tokens).
            key_positions: (B, S) int32 position of each key the pass reads, for a pass
                that reads each row's window only; None reads positions 0 .. S - 1 of
                every row, S the longest row's length.
        """
        size = self.block_size
        had_residual = self._residual_by_block(tables) > 0
        for row, (offset, length) in enumerate(
            zip(offsets.tolist(), lengths.tolist(), strict=True)
        ):
            table = tables[row]
            first_kept = max(0, offset + 1 - self.window) // size
            first_in_window = max(0, length - self.window) // size
            # Blocks the row has moved past.
            before = table[:first_kept]
            for block_id in before[had_residual[row, :first_kept]].tolist():
                self._drop(block_id)
            for index in range(first_kept, (length - 1) // size + 1):
                block_id = int(table[index])
                if block_id in self._residual_of:
                    self._residual_of.move_to_end(block_id)
                elif index >= first_in_window and index * size >= offset:
                    self._attach(block_id)
        if key_positions is None:
            key_positions = np.arange(int(lengths.max()), dtype=np.int32)[None, :]
        return self._slots(tables, offsets, lengths, key_positions)

    def _residual_by_block(self, tables: np.ndarray) -> np.ndarray:
        """(B, T) int32 residual block of each table entry; 0 for none (and padding)."""
        residual_by_block = np.zeros(max(int(tables.max()) + 1, 1), np.int32)
        for block_id, residual in self._residual_of.items():
            if block_id < residual_by_block.size:
                residual_by_block[block_id] = residual
        return np.where(tables >= 0, residual_by_block[np.maximum(tables, 0)], 0)

    def _attach(self, block_id: int) -> None:
        if self._unused:
            residual = self._unused.pop()
        else:
            _, residual = self._residual_of.popitem(last=False)
        self._residual_of[block_id] = residual

    def _drop(self, block_id: int) -> None:
        residual = self._residual_of.pop(block_id, None)
        if residual is not None:
            self._unused.append(residual)

    def drop(self, block_ids: list[int]) -> None:
        """Forget the residual blocks of blocks overwritten whole from elsewhere."""
        for block_id in block_ids:
            self._drop(block_id)

    def copy(self, src_block_id: int, dst_block_id: int) -> tuple[int, int] | None:
        """Give `dst_block_id` a residual block if `src_block_id` has one (a whole-block
        copy), else drop its own; the (source, destination) residual blocks to copy."""
        self._drop(dst_block_id)
        src = self._residual_of.get(src_block_id)
        if src is None:
            return None
        self._attach(dst_block_id)
        dst = self._residual_of[dst_block_id]
        if self._residual_of.get(src_block_id) != src:
            # Taking a residual block for the copy evicted the source's own.
            self._drop(dst_block_id)
            return None
        return src, dst

    def _slots(
        self, tables: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, keys: np.ndarray
    ) -> ResidualSlots:
        size = self.block_size
        keys = np.broadcast_to(keys, (len(tables), keys.shape[1]))
        blocks = np.minimum(keys // size, tables.shape[1] - 1)
        residual = np.take_along_axis(self._residual_by_block(tables), blocks, 1)
        exact = (residual > 0) & (keys < lengths[:, None])
        read = np.where(exact, residual * size + keys % size, 0).astype(np.int32)
        num_queries = int((lengths - offsets).max())
        queries = offsets[:, None] + np.arange(num_queries, dtype=np.int32)
        is_real = queries < lengths[:, None]
        # A row's new positions are its last keys read.
        first_key = keys[:, :1]
        last = np.minimum(queries, lengths[:, None] - 1) - first_key
        written = np.take_along_axis(read, last, 1)
        write = np.where(is_real, written, 0).astype(np.int32)
        in_pass = (keys >= offsets[:, None]) & (keys < lengths[:, None])
        pass_index = np.where(in_pass, keys - offsets[:, None], 0).astype(np.int32)
        return ResidualSlots(
            mx.array(write.reshape(-1)),
            mx.array(read),
            mx.array(exact),
            mx.array(in_pass),
            mx.array(pass_index),
        )
