"""The block pool: reference counts, the LRU free queue and the prefix-cache map.

Pure bookkeeping over block ids; the arrays live in `PagedKVStorage`, which grows to
`BlockPool.num_materialized` blocks. Modelled on vLLM v1's `vllm/v1/core/block_pool.py`
and `FreeKVCacheBlockQueue` (`vllm/v1/core/kv_cache_utils.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mlxcel_core.cache.paged.prefix import BlockHash
from mlxcel_core.errors import MlxcelError

NULL_BLOCK_ID = 0
"""The reserved block that padding writes go to; never allocated, never freed."""


class InvariantError(MlxcelError, RuntimeError):
    """A broken internal invariant of the KV cache bookkeeping (a bug, not bad input).

    The engine does not recover from it: it stops the process rather than serve from
    block tables it can no longer trust.
    """


@dataclass(eq=False)
class KVBlock:
    """One block of `block_size` KV positions.

    Attributes:
        block_id: the block's index in the storage pools.
        ref_count: sequences holding the block; 0 means it sits in the free queue.
        block_hash: the block's prefix-cache hash while it is cached, else None.
        prev_free: the previous block in the free queue, None when not queued.
        next_free: the next block in the free queue, None when not queued.
    """

    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None
    prev_free: KVBlock | None = field(default=None, repr=False)
    next_free: KVBlock | None = field(default=None, repr=False)


class FreeBlockQueue:
    """A doubly linked queue of free blocks with O(1) push, pop and removal from the middle.

    Head and tail are sentinel blocks, so a block is queued exactly when its links are set.
    """

    def __init__(self) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def peek(self) -> KVBlock | None:
        """The head block (the next to pop), or None when the queue is empty."""
        return self._head.next_free if self._length else None

    def popleft(self) -> KVBlock:
        """Remove and return the head block.

        Raises:
            InvariantError: the queue is empty.
        """
        block = self.peek()
        if block is None:
            raise InvariantError("popleft from an empty free queue")
        self.remove(block)
        return block

    def appendleft(self, block: KVBlock) -> None:
        """Push `block` at the head: it is popped first."""
        assert self._head.next_free is not None
        self._link(block, self._head, self._head.next_free)

    def append(self, block: KVBlock) -> None:
        """Push `block` at the tail: it is popped last."""
        assert self._tail.prev_free is not None
        self._link(block, self._tail.prev_free, self._tail)

    def remove(self, block: KVBlock) -> None:
        """Unlink `block` from anywhere in the queue.

        Raises:
            InvariantError: `block` is not queued.
        """
        prev, next_ = block.prev_free, block.next_free
        if prev is None or next_ is None:
            raise InvariantError(f"block {block.block_id} is not in the free queue")
        prev.next_free, next_.prev_free = next_, prev
        block.prev_free = block.next_free = None
        self._length -= 1

    def _link(self, block: KVBlock, prev: KVBlock, next_: KVBlock) -> None:
        if block.prev_free is not None or block.next_free is not None:
            raise InvariantError(f"block {block.block_id} is already in the free queue")
        block.prev_free, block.next_free = prev, next_
        prev.next_free = next_.prev_free = block
        self._length += 1


class BlockPool:
    """Reference-counted blocks 1 .. num_blocks - 1, materialized in id order on demand.

    Block 0 is the null block. A free block is either uncached (content worthless, kept at
    the head of the free queue so it is reused first) or cached (content reusable through
    `lookup`, queued from least to most recently freed, evicted from the head). Ids are
    materialized only when no uncached free block is left, so the storage grows with the
    tokens held; cached blocks are evicted only when every id is materialized.

    Args:
        num_blocks: blocks including the null block (so num_blocks - 1 usable).

    Raises:
        ValueError: `num_blocks` is < 2.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2, got {num_blocks}")
        self.num_blocks = num_blocks
        self.null_block = KVBlock(NULL_BLOCK_ID)
        self._blocks: list[KVBlock] = [self.null_block]
        self._free_queue = FreeBlockQueue()
        self._cached: dict[BlockHash, KVBlock] = {}

    @property
    def num_materialized(self) -> int:
        """Highest block id ever handed out + 1 (1 before any allocation)."""
        return len(self._blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks `allocate` can hand out: queued (cached or not) plus never materialized."""
        return len(self._free_queue) + self.num_blocks - len(self._blocks)

    @property
    def num_used_blocks(self) -> int:
        """Blocks with ref_count > 0."""
        return len(self._blocks) - 1 - len(self._free_queue)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a prefix-cache hash, used or free."""
        return len(self._cached)

    def block(self, block_id: int) -> KVBlock:
        """The materialized block with id `block_id`.

        Raises:
            ValueError: `block_id` is the null block or was never materialized.
        """
        if not 0 < block_id < len(self._blocks):
            raise ValueError(f"block_id must be in [1, {len(self._blocks) - 1}], got {block_id}")
        return self._blocks[block_id]

    def allocate(self, num_blocks: int) -> list[KVBlock] | None:
        """Take `num_blocks` blocks with ref_count 1, all or none.

        Returns:
            The blocks, or None (nothing changed) when fewer than `num_blocks` are free.

        Raises:
            ValueError: `num_blocks` is < 0.
        """
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if num_blocks > self.num_free_blocks:
            return None
        blocks = [self._take_one() for _ in range(num_blocks)]
        for block in blocks:
            block.ref_count = 1
        return blocks

    def _take_one(self) -> KVBlock:
        head = self._free_queue.peek()
        if head is not None and head.block_hash is None:
            return self._free_queue.popleft()
        if len(self._blocks) < self.num_blocks:
            block = KVBlock(len(self._blocks))
            self._blocks.append(block)
            return block
        block = self._free_queue.popleft()
        self._drop_hash(block)
        return block

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block; a block reaching 0 joins the free queue.

        Uncached blocks go to the head (reused first), cached ones to the tail (evicted
        last). Pass a sequence's blocks in reverse order, so its tail blocks, the least
        likely to be shared, are evicted before its head blocks.

        Raises:
            InvariantError: a block is the null block or already has ref_count 0.
        """
        for block in blocks:
            self._check_not_null(block)
            if block.ref_count <= 0:
                raise InvariantError(f"block {block.block_id} freed with ref_count 0")
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.block_hash is None:
                    self._free_queue.appendleft(block)
                else:
                    self._free_queue.append(block)

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Add one reference to each block, taking a free (cached) block out of the queue.

        Raises:
            InvariantError: a block is the null block.
        """
        for block in blocks:
            self._check_not_null(block)
            if block.ref_count == 0:
                self._free_queue.remove(block)
            block.ref_count += 1

    def cache_block(self, block: KVBlock, block_hash: BlockHash) -> None:
        """Register a full, in-use block under `block_hash`.

        If another block already holds `block_hash` (two sequences computed the same prefix
        at once), that mapping stays and `block` stays uncached.

        Raises:
            InvariantError: `block` is the null block, is free, or holds another hash.
        """
        self._check_not_null(block)
        if block.ref_count == 0:
            raise InvariantError(f"block {block.block_id} cached while free")
        if block.block_hash is not None:
            if block.block_hash != block_hash:
                raise InvariantError(f"block {block.block_id} cached under a second hash")
            return
        if block_hash not in self._cached:
            self._cached[block_hash] = block
            block.block_hash = block_hash

    def uncache_block(self, block: KVBlock) -> None:
        """Drop `block`'s hash, before its content is overwritten; no-op if it holds none."""
        if block.block_hash is None:
            return
        self._drop_hash(block)
        if block.ref_count == 0:
            # A free uncached block belongs at the head, where it is reused first.
            self._free_queue.remove(block)
            self._free_queue.appendleft(block)

    def lookup(self, block_hash: BlockHash) -> KVBlock | None:
        """The block cached under `block_hash`, used or free, or None."""
        return self._cached.get(block_hash)

    def _drop_hash(self, block: KVBlock) -> None:
        assert block.block_hash is not None
        del self._cached[block.block_hash]
        block.block_hash = None

    def _check_not_null(self, block: KVBlock) -> None:
        if block is self.null_block:
            raise InvariantError("the null block is never allocated, freed or cached")
