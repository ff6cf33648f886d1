"""One forward pass over paged KV: the batch's slot tables and masks."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel_core.cache.paged.centering import RowAnchors
from mlxcel_core.cache.paged.residual import ResidualSlots
from mlxcel_core.cache.paged.storage import PagedKVStorage


@dataclass(frozen=True)
class BatchRow:
    """One sequence's part of a forward pass.

    Attributes:
        block_table: the sequence's block ids in position order, covering at least
            `offset + num_new_tokens` positions.
        offset: positions already in the cache (tokens).
        num_new_tokens: positions this pass computes and stores (>= 1).
    """

    block_table: Sequence[int]
    offset: int
    num_new_tokens: int


@dataclass(frozen=True)
class LengthGroup:
    """Rows of a decode pass that attend together, padded to the longest of them only.

    Attributes:
        rows: (G,) int32 rows of the batch, longest first.
        read_slots: (G, S_g) int32 slots of their keys, S_g the longest row's length.
        anchors: their first blocks, for reading centered pools.
        mask: (G, 1, 1, S_g) bool, True where a row has a key.
    """

    rows: mx.array
    read_slots: mx.array
    anchors: RowAnchors
    mask: mx.array


# Below this, the keys a row would skip in a group of its own cost less to read on the CPU
# than the group's extra operations in every layer (docs/paged-attention.md).
MIN_SKIPPED_KEYS = 64


def _pad_block_tables(tables: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(rows, longest table) int32 block ids, each row padded with -1; (rows,) table lengths."""
    counts = np.fromiter((len(table) for table in tables), np.int64, len(tables))
    padded = np.full((len(tables), max(int(counts.max()), 1)), -1, dtype=np.int32)
    flat = np.fromiter(itertools.chain.from_iterable(tables), np.int32, int(counts.sum()))
    padded[np.arange(padded.shape[1]) < counts[:, None]] = flat
    return padded, counts


def _slots(tables: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """Slot of each of the (B, N) `positions` through the (B, blocks) `tables`; positions
    past a table read its last block, which callers mask."""
    blocks = np.minimum(positions // block_size, tables.shape[1] - 1)
    return np.take_along_axis(tables, blocks, 1) * block_size + positions % block_size


def _anchor_positions(block_size: int) -> np.ndarray:
    """Positions of a row's first block whose mean its later positions are stored against:
    all but position 0, the attention sink whose key is unlike the others (Xiao et al.,
    "Efficient Streaming Language Models with Attention Sinks", 2023), unless it is alone."""
    return np.arange(min(1, block_size - 1), block_size, dtype=np.int32)


class PagedBatch:
    """Slot tables and masks of a batch of rows, each padded to the longest row.

    Row b's new tokens sit at positions offset_b .. offset_b + n_b - 1; the batch has
    L = max n_b query positions per row. Its keys are each row's positions from 0, or,
    for a block group of windowed layers, from the first its first query's window reads
    (k_b = max(0, offset_b - window + 1)), so those layers never read the positions
    behind their window (whose blocks the group has freed): S = max(offset_b + n_b - k_b)
    key positions, key j of row b at position k_b + j. Padding queries write to the null
    block and padding keys are masked out.

    Args:
        rows: the rows, at least one.
        block_size: tokens per block.
        window: positions the batch's layers read back (their own included), or None for
            every position.
        scalar_offset: the layers' caches give `offset` as an int (one row only), for
            models that read it as one integer.

    Raises:
        ValueError: `rows` is empty, a row's block table is too short, `window` is < 1,
            or `scalar_offset` is asked of several rows.
    """

    def __init__(
        self,
        rows: Sequence[BatchRow],
        block_size: int,
        *,
        window: int | None = None,
        scalar_offset: bool = False,
    ) -> None:
        if not rows:
            raise ValueError("rows must hold at least one row")
        if window is not None and window < 1:
            raise ValueError(f"window must be None or >= 1, got {window}")
        if scalar_offset and len(rows) != 1:
            raise ValueError(f"scalar_offset needs one row, got {len(rows)}")
        self.window = window
        self.scalar_offset = rows[0].offset if scalar_offset else None
        self.num_rows = len(rows)
        self.num_queries = max(row.num_new_tokens for row in rows)
        offsets = np.fromiter((row.offset for row in rows), np.int32, self.num_rows)
        lengths = offsets + np.fromiter(
            (row.num_new_tokens for row in rows), np.int32, self.num_rows
        )
        tables, num_blocks = _pad_block_tables([row.block_table for row in rows])
        covered = num_blocks * block_size
        short = np.flatnonzero(covered < lengths)
        if short.size:
            b = int(short[0])
            raise ValueError(
                f"row {b}'s block table covers {int(covered[b])} positions; it needs {lengths[b]}"
            )
        self._key_starts = (
            np.zeros_like(offsets) if window is None else np.maximum(0, offsets - window + 1)
        )
        self._num_row_keys = lengths - self._key_starts
        self.num_keys = int(self._num_row_keys.max())
        query_positions = offsets[:, None] + np.arange(self.num_queries, dtype=np.int32)
        self._is_real_query = query_positions < lengths[:, None]
        # Padding queries all write to slot 0, inside the null block.
        last_positions = np.minimum(query_positions, lengths[:, None] - 1)
        write = np.where(self._is_real_query, _slots(tables, last_positions, block_size), 0)
        self.offsets = mx.array(offsets)
        # Decode attention reads the pools through these; -1 padding reads block 0.
        self.block_tables = mx.array(np.maximum(tables, 0))
        self.context_lengths = mx.array(lengths)
        self.write_slots = mx.array(write.reshape(-1))
        self._block_size = block_size
        self._tables = tables
        self._offsets = offsets
        self._query_positions = query_positions
        self._lengths = lengths
        self._masks: dict[int | None, mx.array] = {}
        self._query_tables: tuple[mx.array, mx.array] | None = None
        self._length_groups: tuple[list[LengthGroup], mx.array] | None = None
        self._length_groups_found = False

    @functools.cached_property
    def _key_positions(self) -> np.ndarray:
        return self._key_starts[:, None] + np.arange(self.num_keys, dtype=np.int32)

    @functools.cached_property
    def read_slots(self) -> mx.array:
        """(B, S) int32 slot of each row's keys, 0 (the null block) for padding keys.
        Built when first read: decode kernels read the block tables instead."""
        key_positions = self._key_positions
        slots = _slots(self._tables, key_positions, self._block_size)
        return mx.array(np.where(key_positions < self._lengths[:, None], slots, 0))

    @functools.cached_property
    def anchors(self) -> RowAnchors:
        """The rows' first blocks, for keys stored relative to them (centered codecs).
        Built when first read."""
        block_size = self._block_size
        query_positions = self._query_positions
        key_positions = self._key_positions
        write_centered = (self._is_real_query & (query_positions >= block_size)).reshape(-1)
        return RowAnchors(
            anchor_slots=mx.array(self._tables[:, :1] * block_size + _anchor_positions(block_size)),
            write_rows=mx.array(
                np.repeat(np.arange(self.num_rows, dtype=np.int32), self.num_queries)
            ),
            write_centered=mx.array(write_centered),
            read_centered=mx.array(
                (key_positions >= block_size) & (key_positions < self._lengths[:, None])
            ),
            writes_first_blocks=bool((self._is_real_query & (query_positions < block_size)).any()),
            writes_past_first_blocks=bool(write_centered.any()),
        )

    def mask(self, window_size: int | None = None) -> mx.array:
        """(B, 1, L, S) boolean mask; True where a query may attend to a key.

        Query i of row b (position offset_b + i) sees the row's keys at positions up to its
        own, and with `window_size` only the last `window_size` of them. A windowed
        batch's mask is always windowed, by its own window when `window_size` is None or
        wider: its keys reach no further back, as an mlx-lm `RotatingKVCache` of that size
        holds no more (PLaMo 3 asks its window + 1 of one).
        """
        if self.window is not None:
            window_size = min(window_size or self.window, self.window)
        if window_size not in self._masks:
            keys = self._key_positions[:, None, :]
            queries = np.minimum(self._query_positions, self._lengths[:, None] - 1)[:, :, None]
            allowed = keys <= queries
            if window_size is not None:
                allowed &= keys > queries - window_size
            self._masks[window_size] = mx.array(allowed[:, None])
        return self._masks[window_size]

    def query_tables(self) -> tuple[mx.array, mx.array]:
        """Each query as a row of its own, for decode kernels that take one query per row
        (`attend_per_query`): its row's block table, (B * L, max_blocks) int32, and the
        positions it attends to, (B * L,) int32 (those `mask()` lets it see: up to its
        own, or up to its row's last for a padding query). Found once per pass."""
        if self._query_tables is None:
            seen = np.minimum(self._query_positions, self._lengths[:, None] - 1) + 1
            tables = np.repeat(np.maximum(self._tables, 0), self.num_queries, axis=0)
            self._query_tables = (mx.array(tables), mx.array(seen.reshape(-1)))
        return self._query_tables

    def residual_slots(self, storage: PagedKVStorage, group: int = 0) -> ResidualSlots | None:
        """Plan the residual blocks of the storage's group `group` (whose block tables the
        batch holds) for this pass (`PagedKVStorage.plan_residual`); None when it keeps
        none."""
        if not storage.residual_window:
            return None
        return storage.plan_residual(
            self._tables,
            self._offsets,
            self._lengths,
            group=group,
            key_positions=self._key_positions,
        )

    def length_groups(self) -> tuple[list[LengthGroup], mx.array] | None:
        """A decode pass's rows in groups by context length, and the (B,) int32 order that
        puts the groups' rows, concatenated, back in batch order; None when one group would
        hold them all (or the pass is not a decode pass). Found once per pass.

        Rows are taken longest first; a row starts a new group when it is no longer than
        half the current group's longest and at least `MIN_SKIPPED_KEYS` shorter. So a
        short row beside a long one does not read, and attend over, the long one's
        padding: a row is padded to about twice its length at most, or to fewer than
        `MIN_SKIPPED_KEYS` keys past it, whichever is more. No group is made to skip only
        a few keys, since each group repeats the gather's operations in every layer.
        """
        if not self._length_groups_found:
            self._length_groups_found = True
            self._length_groups = self._find_length_groups()
        return self._length_groups

    def _find_length_groups(self) -> tuple[list[LengthGroup], mx.array] | None:
        if self.num_queries != 1 or self.num_rows == 1:
            return None
        counts = self._num_row_keys
        order = np.argsort(-counts, kind="stable")
        starts = [0]
        for i in range(1, len(order)):
            length, longest = counts[order[i]], counts[order[starts[-1]]]
            if 2 * length <= longest and longest - length >= MIN_SKIPPED_KEYS:
                starts.append(i)
        if len(starts) == 1:
            return None
        groups = [
            self._length_group(order[start:end])
            for start, end in zip(starts, [*starts[1:], len(order)], strict=True)
        ]
        return groups, mx.array(np.argsort(order).astype(np.int32))

    def _length_group(self, rows: np.ndarray) -> LengthGroup:
        num_keys = int(self._num_row_keys[rows[0]])
        selected = mx.array(rows.astype(np.int32))
        # One new position per row: the group's written positions are its rows'.
        written = self._query_positions[rows, 0]
        centered = written >= self._block_size
        return LengthGroup(
            rows=selected,
            read_slots=self.read_slots[selected, :num_keys],
            anchors=RowAnchors(
                anchor_slots=self.anchors.anchor_slots[selected],
                write_rows=mx.arange(len(rows), dtype=mx.int32),
                write_centered=mx.array(centered),
                read_centered=self.anchors.read_centered[selected, :num_keys],
                writes_first_blocks=bool((~centered).any()),
                writes_past_first_blocks=bool(centered.any()),
            ),
            mask=self.mask()[selected, :, :, :num_keys],
        )
