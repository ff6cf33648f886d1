"""One block group's block tables over its own pool (the `KVCacheManager`'s part per group).

Every group's table of a sequence covers the same positions, one entry per block. A group
with a window frees each sequence's blocks wholly behind the window of its next token as
it moves on, setting those entries to the null block, so it holds about the window's
blocks however long the sequence runs; its first block is kept (quantized pools center
later keys on it). vLLM's `SingleTypeKVCacheManager` and its `SlidingWindowManager`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel_core.cache.paged.block_pool import NULL_BLOCK_ID, BlockPool, InvariantError, KVBlock
from mlxcel_core.cache.paged.prefix import BlockHash
from mlxcel_core.cache.paged.prefix_hit import first_window_block


@dataclass(frozen=True)
class BlockCopy:
    """Copy block `src_block_id`'s content into `dst_block_id` of block group `group`
    before the next forward pass."""

    src_block_id: int
    dst_block_id: int
    group: int = 0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class GroupTables:
    """Block tables of one group over its pool.

    Args:
        index: the group's number (its `BlockCopy.group`).
        num_blocks: blocks in its pool, the null block included.
        block_size: tokens per block.
        window: positions its layers read back, or None for all of them.

    Raises:
        ValueError: `num_blocks` is < 2 or `window` is < 1.
    """

    def __init__(self, index: int, num_blocks: int, block_size: int, window: int | None) -> None:
        if window is not None and window < 1:
            raise ValueError(f"sliding_window must be None or >= 1, got {window}")
        self.index = index
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.window = window
        self.tables: dict[int, list[KVBlock]] = {}
        # Per sequence, the first table entry past its first block that may still be held
        # (the ones before it were freed behind the window).
        self._held_from: dict[int, int] = {}

    def num_to_start(self, cached: Sequence[KVBlock], num_fresh: int) -> int:
        """Free blocks `start` takes: the fresh ones, and the cached ones now free."""
        null = self.pool.null_block
        return num_fresh + sum(1 for b in cached if b is not null and b.ref_count == 0)

    def start(self, seq_id: int, cached: Sequence[KVBlock], num_fresh: int) -> None:
        """Give a new sequence its cached blocks and `num_fresh` fresh ones after them."""
        null = self.pool.null_block
        self.pool.touch(block for block in cached if block is not null)
        fresh = self.pool.allocate(num_fresh)
        if fresh is None:
            raise InvariantError(f"{num_fresh} blocks were free, then could not be allocated")
        self._set(seq_id, [*cached, *fresh])

    def _set(self, seq_id: int, table: list[KVBlock]) -> None:
        self.tables[seq_id] = table
        null = self.pool.null_block
        self._held_from[seq_id] = next(
            (i for i in range(1, len(table)) if table[i] is not null), len(table)
        )

    def free_behind_window(self, seq_id: int, num_computed: int) -> None:
        """Free the blocks wholly behind the window of position `num_computed`, oldest
        first (a cached one is then evicted before the newer ones a later hit needs)."""
        if self.window is None:
            return
        table = self.tables[seq_id]
        start = self._held_from[seq_id]
        stop = min(first_window_block(num_computed, self.window, self.block_size), len(table))
        if stop <= start:
            return
        null = self.pool.null_block
        behind = [block for block in table[start:stop] if block is not null]
        table[start:stop] = [null] * (stop - start)
        self._held_from[seq_id] = stop
        self.pool.free(behind)

    def num_to_grow(self, seq_id: int, num_computed: int, num_new_tokens: int) -> int:
        """Fresh blocks `grow` takes: one per shared block written, one per new block."""
        table = self.tables[seq_id]
        first = num_computed // self.block_size
        end = cdiv(num_computed + num_new_tokens, self.block_size)
        shared = sum(1 for i in range(first, min(end, len(table))) if table[i].ref_count > 1)
        return shared + max(0, end - len(table))

    def grow(
        self, seq_id: int, num_computed: int, num_new_tokens: int, copies: list[BlockCopy]
    ) -> None:
        """Cover positions [0, num_computed + num_new_tokens), the last `num_new_tokens`
        about to be written: a shared block there is swapped for a fresh one (a copy
        queued in `copies` if it holds positions before `num_computed`); a cached block
        held by this sequence alone loses its hash.

        Raises:
            InvariantError: `num_to_grow` blocks are not free.
        """
        table = self.tables[seq_id]
        size = self.block_size
        first = num_computed // size
        end = cdiv(num_computed + num_new_tokens, size)
        fresh = self.pool.allocate(self.num_to_grow(seq_id, num_computed, num_new_tokens))
        if fresh is None:
            raise InvariantError("blocks counted as free could not be allocated")
        fresh_blocks = iter(fresh)
        for i in range(first, min(end, len(table))):
            if table[i].ref_count > 1:
                block, table[i] = table[i], next(fresh_blocks)
                if i * size < num_computed:
                    copies.append(BlockCopy(block.block_id, table[i].block_id, self.index))
                self.pool.free([block])
            else:
                self.pool.uncache_block(table[i])
        table.extend(fresh_blocks)

    def cache(self, seq_id: int, start: int, hashes: Sequence[BlockHash]) -> None:
        """Register the sequence's blocks `start ..` under `hashes`, one each; a block
        freed behind the window (a null entry) is skipped."""
        null = self.pool.null_block
        table = self.tables[seq_id]
        for block, block_hash in zip(table[start : start + len(hashes)], hashes, strict=True):
            if block is not null:
                self.pool.cache_block(block, block_hash)

    def free(self, seq_id: int) -> None:
        """Release the sequence's blocks, tail first."""
        table = self.tables.pop(seq_id)
        del self._held_from[seq_id]
        null = self.pool.null_block
        self.pool.free(block for block in reversed(table) if block is not null)

    def fork(self, parent_id: int, child_id: int, num_blocks: int) -> None:
        """Let the child share the parent's first `num_blocks` blocks."""
        shared = self.tables[parent_id][:num_blocks]
        null = self.pool.null_block
        self.pool.touch(block for block in shared if block is not null)
        self.tables[child_id] = shared
        self._held_from[child_id] = self._held_from[parent_id]

    def can_fork(self, parent_id: int, num_tokens: int) -> bool:
        """Whether the parent still holds every block a child at `num_tokens` reads: its
        window may have moved past blocks the child's window, further back, needs."""
        if self.window is None:
            return True
        table = self.tables[parent_id]
        start = first_window_block(num_tokens, self.window, self.block_size)
        null = self.pool.null_block
        return all(block is not null for block in table[start : cdiv(num_tokens, self.block_size)])

    def detach(self, seq_id: int) -> tuple[int, ...]:
        """Forget the sequence, leaving its blocks' references; its block ids."""
        table = self.tables.pop(seq_id)
        del self._held_from[seq_id]
        return tuple(block.block_id for block in table)

    def adoptable(self, block_ids: Sequence[int]) -> list[KVBlock]:
        """The table of detached block ids, for `adopt`.

        Raises:
            ValueError: a block is not materialized or is free.
        """
        null = self.pool.null_block
        table = [null if i == NULL_BLOCK_ID else self.pool.block(i) for i in block_ids]
        for block in table:
            if block is not null and block.ref_count < 1:
                raise ValueError(f"block {block.block_id} is free; detached blocks keep a ref")
        return table

    def adopt(self, seq_id: int, table: list[KVBlock]) -> None:
        """Make the sequence the owner of an `adoptable` table (references unchanged)."""
        self._set(seq_id, table)

    def block_ids(self, seq_id: int) -> list[int]:
        return [block.block_id for block in self.tables[seq_id]]
