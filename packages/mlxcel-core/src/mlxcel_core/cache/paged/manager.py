"""The KV cache manager: the narrow facade the scheduler uses for paged KV memory.

Which prefix blocks are cached, allocate slots or refuse, commit full blocks, free. Sequences
are int ids; positions map to blocks through each sequence's block table. Modelled on vLLM
v1's `vllm/v1/core/kv_cache_manager.py`; copy-on-write after `fork` follows vLLM v0's
block manager (PagedAttention, Kwon et al., SOSP 2023).

With a sliding window (every attention layer of the model reads only its last W
positions), a sequence's blocks wholly behind the window of its next token are freed as it
moves on, their table entries set to the null block, so a sequence holds about W positions
however long it runs; its first block is kept (quantized pools center later keys on it).
A prefix-cache hit then needs only the blocks the window reaches back to, and the first
(`prefix_hit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel_core.cache.paged.block_pool import NULL_BLOCK_ID, BlockPool, InvariantError, KVBlock
from mlxcel_core.cache.paged.prefix import (
    BlockHash,
    BlockHashExtra,
    KeyedSpan,
    hash_token_blocks,
)
from mlxcel_core.cache.paged.prefix_hit import find_cached_prefix, first_window_block


@dataclass(frozen=True)
class BlockCopy:
    """Copy block `src_block_id`'s content into `dst_block_id` before the next forward pass."""

    src_block_id: int
    dst_block_id: int


@dataclass(frozen=True)
class DetachedBlocks:
    """A sequence's blocks handed from one owner to another, references included.

    Attributes:
        block_ids: the block table, in position order.
        block_hashes: hashes of the leading blocks committed to the prefix cache.
        block_size: tokens per block.
        extra: the extra key the blocks' hashes were made with (see `KVCacheManager.admit`).
        spans: the keyed spans the blocks' hashes were made with (see `KVCacheManager.admit`).
    """

    block_ids: tuple[int, ...]
    block_hashes: tuple[BlockHash, ...]
    block_size: int
    extra: BlockHashExtra = ()
    spans: tuple[KeyedSpan, ...] = ()


@dataclass(frozen=True)
class _HashKeys:
    """What a sequence's block hashes depend on beyond its token ids."""

    extra: BlockHashExtra = ()
    spans: tuple[KeyedSpan, ...] = ()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Block tables, prefix caching and copy-on-write over one `BlockPool`.

    Args:
        num_blocks: blocks in the pool, including the reserved null block 0.
        block_size: tokens per block.
        enable_prefix_caching: reuse full blocks across sequences with the same prefix.
        sliding_window: positions back from its newest that a sequence's attention still
            reads (every layer windowed): blocks behind it are freed (see the module);
            None keeps every block.

    Raises:
        ValueError: `num_blocks` is < 2, or `block_size` or `sliding_window` is < 1.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        sliding_window: int | None = None,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be None or >= 1, got {sliding_window}")
        self._pool = BlockPool(num_blocks)
        self._block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window
        self._tables: dict[int, list[KVBlock]] = {}
        # Per sequence, the first table entry past its first block that may still be held
        # (the ones before it were freed behind the sliding window).
        self._held_from: dict[int, int] = {}
        # Hashes of each sequence's leading blocks that are committed (full and computed).
        self._hashes: dict[int, list[BlockHash]] = {}
        # Each sequence's further hash keys (adapter scales, images), from admission to free.
        self._keys: dict[int, _HashKeys] = {}
        self._copies: list[BlockCopy] = []
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, including the null block."""
        return self._pool.num_blocks

    def admit(
        self,
        seq_id: int,
        token_ids: Sequence[int],
        num_new_tokens: int,
        *,
        extra: BlockHashExtra = (),
        spans: Sequence[KeyedSpan] = (),
        use_cached: bool = True,
    ) -> int | None:
        """Give a new sequence its cached prefix plus blocks for `num_new_tokens` more tokens.

        The cached prefix is the longest run of full blocks found in the prefix cache, capped
        to leave at least one token to compute. The sequence then holds blocks for positions
        [0, num_cached + min(num_new_tokens, len(token_ids) - num_cached)).

        Args:
            seq_id: a sequence that holds no blocks.
            token_ids: the sequence's tokens (at least one).
            num_new_tokens: tokens the caller wants to compute this step (>= 1).
            extra: a key the sequence's keys and values depend on beyond its tokens (its
                LoRA adapter scales): its blocks are shared only with sequences of the same
                `extra`.
            spans: the sequence's positions whose keys and values depend on more than
                their tokens (its images' placeholders), in position order: a block holding
                any of them is shared only with sequences holding the same spans there (see
                `block_extra`); blocks holding none hash as without spans.
            use_cached: False gives the sequence no cached prefix (it computes every token);
                its full blocks still join the prefix cache as they are committed.

        Returns:
            The number of cached tokens (a multiple of `block_size`), or None (nothing
            changed) when the blocks cannot all be had.

        Raises:
            ValueError: `seq_id` already holds blocks, `token_ids` is empty or
                `num_new_tokens` is < 1.
        """
        if seq_id in self._tables:
            raise ValueError(f"seq_id {seq_id} already holds blocks")
        if not token_ids:
            raise ValueError("token_ids must hold at least one token")
        if num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be >= 1, got {num_new_tokens}")
        keys = _HashKeys(extra, tuple(spans))
        cached: list[KVBlock] = []
        hashes: list[BlockHash] = []
        if self.enable_prefix_caching and use_cached:
            cached, hashes = find_cached_prefix(
                self._pool,
                token_ids,
                self._block_size,
                extra=extra,
                spans=keys.spans,
                window=self.sliding_window,
            )
        num_cached = len(cached) * self._block_size
        num_tokens = num_cached + min(num_new_tokens, len(token_ids) - num_cached)
        num_fresh = _cdiv(num_tokens, self._block_size) - len(cached)
        held = [block for block in cached if block is not self._pool.null_block]
        # Touching a free cached block takes it out of the free count.
        num_cached_free = sum(1 for block in held if block.ref_count == 0)
        if num_fresh + num_cached_free > self._pool.num_free_blocks:
            return None
        self._pool.touch(held)
        fresh = self._pool.allocate(num_fresh)
        if fresh is None:
            raise InvariantError(f"{num_fresh} blocks were free, then could not be allocated")
        self._tables[seq_id] = cached + fresh
        self._held_from[seq_id] = self._first_held(self._tables[seq_id])
        self._hashes[seq_id] = hashes
        self._keys[seq_id] = keys
        self.num_queried_tokens += len(token_ids)
        self.num_hit_tokens += num_cached
        return num_cached

    def _first_held(self, table: list[KVBlock]) -> int:
        return next(
            (i for i in range(1, len(table)) if table[i] is not self._pool.null_block),
            len(table),
        )

    def _free_behind_window(self, seq_id: int, table: list[KVBlock], num_computed: int) -> None:
        """Free the blocks wholly behind the window of position `num_computed`, oldest
        first (a cached one is then evicted before the newer ones a later hit needs)."""
        if self.sliding_window is None:
            return
        start = self._held_from[seq_id]
        stop = min(
            first_window_block(num_computed, self.sliding_window, self._block_size), len(table)
        )
        if stop <= start:
            return
        behind = [block for block in table[start:stop] if block is not self._pool.null_block]
        table[start:stop] = [self._pool.null_block] * (stop - start)
        self._held_from[seq_id] = stop
        self._pool.free(behind)

    def allocate_slots(self, seq_id: int, num_computed: int, num_new_tokens: int) -> bool:
        """Cover positions [0, num_computed + num_new_tokens) before they are written.

        Positions [num_computed, num_computed + num_new_tokens) are about to be written.
        A shared block there (ref_count > 1) is swapped for a fresh one in this sequence's
        table; if it holds positions before `num_computed`, a `BlockCopy` is queued for the
        storage layer. A cached block there held only by this sequence loses its hash.

        Returns:
            True, or False (nothing changed) when the fresh blocks cannot all be had.

        Raises:
            ValueError: `seq_id` is unknown, `num_new_tokens` is < 1 or `num_computed` is
                outside [0, positions the sequence holds].
        """
        table = self._table(seq_id)
        if num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be >= 1, got {num_new_tokens}")
        self._check_positions("num_computed", num_computed, table)
        self._free_behind_window(seq_id, table, num_computed)
        size = self._block_size
        first = num_computed // size
        end = _cdiv(num_computed + num_new_tokens, size)
        written = range(first, min(end, len(table)))
        num_shared = sum(1 for i in written if table[i].ref_count > 1)
        fresh = self._pool.allocate(num_shared + max(0, end - len(table)))
        if fresh is None:
            return False
        del self._hashes[seq_id][first:]
        fresh_blocks = iter(fresh)
        for i in written:
            if table[i].ref_count > 1:
                block, table[i] = table[i], next(fresh_blocks)
                if i * size < num_computed:
                    self._copies.append(BlockCopy(block.block_id, table[i].block_id))
                self._pool.free([block])
            else:
                self._pool.uncache_block(table[i])
        table.extend(fresh_blocks)
        return True

    def take_block_copies(self) -> list[BlockCopy]:
        """Return and clear the copies queued by `allocate_slots`, oldest first."""
        copies, self._copies = self._copies, []
        return copies

    def commit(self, seq_id: int, token_ids: Sequence[int], num_computed: int) -> None:
        """Register the sequence's newly full, computed blocks in the prefix cache.

        Args:
            seq_id: a sequence holding blocks.
            token_ids: the sequence's tokens (prompt + generated); the first `num_computed`
                are stored in its blocks.
            num_computed: positions computed so far (tokens).

        Raises:
            ValueError: `seq_id` is unknown or `num_computed` is outside
                [0, min(len(token_ids), positions the sequence holds)].
        """
        table = self._table(seq_id)
        if num_computed > len(token_ids):
            raise ValueError(f"num_computed must be <= {len(token_ids)}, got {num_computed}")
        self._check_positions("num_computed", num_computed, table)
        if not self.enable_prefix_caching:
            return
        hashes, size = self._hashes[seq_id], self._block_size
        start, stop = len(hashes), num_computed // size
        parent = hashes[-1] if hashes else None
        keys = self._keys[seq_id]
        new = hash_token_blocks(
            token_ids[start * size : stop * size],
            size,
            parent,
            keys.extra,
            spans=keys.spans,
            first_position=start * size,
        )
        for block, block_hash in zip(table[start:stop], new, strict=True):
            self._pool.cache_block(block, block_hash)
        hashes.extend(new)

    def free(self, seq_id: int) -> None:
        """Release the sequence's blocks, tail first, and forget it; unknown ids are a no-op."""
        table = self._tables.pop(seq_id, None)
        if table is None:
            return
        del self._hashes[seq_id]
        del self._keys[seq_id]
        del self._held_from[seq_id]
        self._pool.free(block for block in reversed(table) if block is not self._pool.null_block)

    def fork(self, parent_id: int, child_id: int, num_tokens: int) -> None:
        """Let `child_id` share the parent's blocks covering positions [0, num_tokens).

        Later writes into a shared block go through copy-on-write (`allocate_slots`).

        Raises:
            ValueError: `parent_id` is unknown, `child_id` holds blocks, or `num_tokens` is
                outside [0, positions the parent holds].
        """
        table = self._table(parent_id)
        if child_id in self._tables:
            raise ValueError(f"child_id {child_id} already holds blocks")
        self._check_positions("num_tokens", num_tokens, table)
        shared = table[: _cdiv(num_tokens, self._block_size)]
        self._pool.touch(block for block in shared if block is not self._pool.null_block)
        self._tables[child_id] = shared
        self._held_from[child_id] = self._held_from[parent_id]
        self._hashes[child_id] = self._hashes[parent_id][: num_tokens // self._block_size]
        self._keys[child_id] = self._keys[parent_id]

    def can_fork(self, parent_id: int, num_tokens: int) -> bool:
        """Whether `fork(parent_id, ..., num_tokens)` gives the child every block it reads:
        under a sliding window, the parent may have freed blocks behind its own window
        that the child's window, further back, still needs.

        Raises:
            ValueError: `parent_id` is unknown.
        """
        table = self._table(parent_id)
        if self.sliding_window is None:
            return True
        start = first_window_block(num_tokens, self.sliding_window, self._block_size)
        return all(
            block is not self._pool.null_block
            for block in table[start : _cdiv(num_tokens, self._block_size)]
        )

    def detach(self, seq_id: int) -> DetachedBlocks:
        """Stop tracking the sequence; its blocks keep their references for a new owner.

        Raises:
            ValueError: `seq_id` is unknown.
        """
        table = self._table(seq_id)
        del self._tables[seq_id]
        del self._held_from[seq_id]
        hashes = self._hashes.pop(seq_id)
        keys = self._keys.pop(seq_id)
        ids = tuple(block.block_id for block in table)
        return DetachedBlocks(ids, tuple(hashes), self._block_size, keys.extra, keys.spans)

    def adopt(self, seq_id: int, detached: DetachedBlocks) -> None:
        """Make `seq_id` the owner of detached blocks; reference counts are unchanged.

        Raises:
            ValueError: `seq_id` already holds blocks, the block size differs, or a block
                is not materialized or is free.
        """
        if seq_id in self._tables:
            raise ValueError(f"seq_id {seq_id} already holds blocks")
        if detached.block_size != self._block_size:
            raise ValueError(
                f"detached.block_size must be {self._block_size}, got {detached.block_size}"
            )
        table = [
            self._pool.null_block if block_id == NULL_BLOCK_ID else self._pool.block(block_id)
            for block_id in detached.block_ids
        ]
        for block in table:
            if block is not self._pool.null_block and block.ref_count < 1:
                raise ValueError(f"block {block.block_id} is free; detached blocks keep a ref")
        self._tables[seq_id] = table
        self._held_from[seq_id] = self._first_held(table)
        self._hashes[seq_id] = list(detached.block_hashes)
        self._keys[seq_id] = _HashKeys(detached.extra, detached.spans)

    def block_table(self, seq_id: int) -> list[int]:
        """The sequence's block ids, in position order.

        Raises:
            ValueError: `seq_id` is unknown.
        """
        return [block.block_id for block in self._table(seq_id)]

    def num_blocks_of(self, seq_id: int) -> int:
        """Blocks the sequence holds (covering num_blocks * block_size positions).

        Raises:
            ValueError: `seq_id` is unknown.
        """
        return len(self._table(seq_id))

    def _table(self, seq_id: int) -> list[KVBlock]:
        table = self._tables.get(seq_id)
        if table is None:
            raise ValueError(f"seq_id {seq_id} holds no blocks")
        return table

    def _check_positions(self, name: str, num_tokens: int, table: list[KVBlock]) -> None:
        num_held = len(table) * self._block_size
        if not 0 <= num_tokens <= num_held:
            raise ValueError(f"{name} must be in [0, {num_held}], got {num_tokens}")

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can still be allocated, cached free blocks included."""
        return self._pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        return self._pool.num_used_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks in the prefix cache, used or free."""
        return self._pool.num_cached_blocks

    @property
    def num_materialized_blocks(self) -> int:
        """Blocks the storage must hold: highest id handed out + 1."""
        return self._pool.num_materialized

    @property
    def usage(self) -> float:
        """Fraction of usable blocks (all but the null block) held by sequences."""
        return self._pool.num_used_blocks / (self._pool.num_blocks - 1)

    @property
    def hit_rate(self) -> float:
        """Prefix-cache hit tokens / queried tokens over admitted sequences (0.0 before any)."""
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0
