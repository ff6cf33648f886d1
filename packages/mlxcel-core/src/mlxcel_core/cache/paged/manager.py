"""The KV cache manager: the narrow facade the scheduler uses for paged KV memory.

Which prefix blocks are cached, allocate slots or refuse, commit full blocks, free. Sequences
are int ids; positions map to blocks through each sequence's block tables, one per block
group (`mlxcel_core.cache.block_groups`): full-attention layers in one group, each
sliding window's layers in another, each group over its own pool. Modelled on vLLM v1's
`vllm/v1/core/kv_cache_manager.py` and its hybrid `kv_cache_coordinator.py`; copy-on-write
after `fork` follows vLLM v0's block manager (PagedAttention, Kwon et al., SOSP 2023).

A windowed group frees a sequence's blocks wholly behind the window of its next token as
it moves on (`group_tables`), so it holds about W positions however long the sequence
runs. A prefix-cache hit is the longest prefix every group can serve (`prefix_hit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel_core.cache.paged.group_tables import BlockCopy, GroupTables, cdiv
from mlxcel_core.cache.paged.prefix import (
    BlockHash,
    BlockHashExtra,
    KeyedSpan,
    hash_token_blocks,
)
from mlxcel_core.cache.paged.prefix_hit import PromptHashes, hit_blocks, longest_common_hit


@dataclass(frozen=True)
class WindowGroup:
    """A block group of sliding-window layers beside the manager's first group.

    Attributes:
        window: positions its layers read back, their own included.
        num_blocks: blocks in its pool, the null block included.
    """

    window: int
    num_blocks: int


@dataclass(frozen=True)
class BlockGroupUsage:
    """One block group's pool after a step.

    Attributes:
        window: positions its layers read back, or None for all of them.
        num_blocks: usable blocks (the null block excluded).
        num_used: blocks held by sequences.
        num_cached: blocks holding a prefix-cache entry (used or free).
    """

    window: int | None
    num_blocks: int
    num_used: int
    num_cached: int


@dataclass(frozen=True)
class DetachedBlocks:
    """A sequence's blocks handed from one owner to another, references included.

    Attributes:
        block_ids: the block table of each group, in position order.
        block_hashes: hashes of the leading blocks committed to the prefix cache.
        block_size: tokens per block.
        extra: the extra key the blocks' hashes were made with (see `KVCacheManager.admit`).
        spans: the keyed spans the blocks' hashes were made with (see `KVCacheManager.admit`).
    """

    block_ids: tuple[tuple[int, ...], ...]
    block_hashes: tuple[BlockHash, ...]
    block_size: int
    extra: BlockHashExtra = ()
    spans: tuple[KeyedSpan, ...] = ()


@dataclass(frozen=True)
class _HashKeys:
    """What a sequence's block hashes depend on beyond its token ids."""

    extra: BlockHashExtra = ()
    spans: tuple[KeyedSpan, ...] = ()


class KVCacheManager:
    """Block tables, prefix caching and copy-on-write over one pool per block group.

    Args:
        num_blocks: blocks in the first group's pool, including its reserved null block 0.
        block_size: tokens per block.
        enable_prefix_caching: reuse full blocks across sequences with the same prefix.
        sliding_window: positions back from its newest that the first group's layers
            still read: blocks behind it are freed (see the module); None keeps every block.
        window_groups: further groups of windowed layers, each with its own pool
            (`BlockGroups` orders them: the first group is the widest).
        min_cached_tokens: a cached prefix shorter than this is not used: the sequence
            computes its prompt afresh (its full blocks still join the prefix cache).

    Raises:
        ValueError: a pool has < 2 blocks, `block_size` or a window is < 1, or
            `min_cached_tokens` is < 0.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        sliding_window: int | None = None,
        window_groups: Sequence[WindowGroup] = (),
        min_cached_tokens: int = 0,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if min_cached_tokens < 0:
            raise ValueError(f"min_cached_tokens must be >= 0, got {min_cached_tokens}")
        self._groups = [GroupTables(0, num_blocks, block_size, sliding_window)]
        self._groups += [
            GroupTables(i, group.num_blocks, block_size, group.window)
            for i, group in enumerate(window_groups, start=1)
        ]
        self._block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.min_cached_tokens = min_cached_tokens
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

        The cached prefix is the longest run of full blocks every group finds in the prefix
        cache (`prefix_hit`), capped to leave at least one token to compute, and none if
        shorter than `min_cached_tokens`. The sequence
        then holds blocks for positions
        [0, num_cached + min(num_new_tokens, len(token_ids) - num_cached)) in every group.

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
        if seq_id in self._hashes:
            raise ValueError(f"seq_id {seq_id} already holds blocks")
        if not token_ids:
            raise ValueError("token_ids must hold at least one token")
        if num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be >= 1, got {num_new_tokens}")
        keys = _HashKeys(extra, tuple(spans))
        hashes = PromptHashes(token_ids, self._block_size, extra, keys.spans)
        hit = 0
        if self.enable_prefix_caching and use_cached:
            pools = [(group.pool, group.window) for group in self._groups]
            hit = longest_common_hit(pools, hashes, self._block_size)
            if hit * self._block_size < self.min_cached_tokens:
                hit = 0
        cached = [
            hit_blocks(group.pool, hashes, self._block_size, window=group.window, hit=hit)
            for group in self._groups
        ]
        num_cached = hit * self._block_size
        num_tokens = num_cached + min(num_new_tokens, len(token_ids) - num_cached)
        num_fresh = cdiv(num_tokens, self._block_size) - hit
        if any(
            group.num_to_start(blocks, num_fresh) > group.pool.num_free_blocks
            for group, blocks in zip(self._groups, cached, strict=True)
        ):
            return None
        for group, blocks in zip(self._groups, cached, strict=True):
            group.start(seq_id, blocks, num_fresh)
        self._hashes[seq_id] = hashes.prefix(hit)
        self._keys[seq_id] = keys
        self.num_queried_tokens += len(token_ids)
        self.num_hit_tokens += num_cached
        return num_cached

    def allocate_slots(self, seq_id: int, num_computed: int, num_new_tokens: int) -> bool:
        """Cover positions [0, num_computed + num_new_tokens) before they are written.

        Positions [num_computed, num_computed + num_new_tokens) are about to be written.
        In every group, a shared block there (ref_count > 1) is swapped for a fresh one in
        this sequence's table; if it holds positions before `num_computed`, a `BlockCopy`
        is queued for the storage layer. A cached block there held only by this sequence
        loses its hash. A windowed group first frees the blocks behind the window of
        position `num_computed`.

        Returns:
            True, or False (no table grew) when the fresh blocks cannot all be had.

        Raises:
            ValueError: `seq_id` is unknown, `num_new_tokens` is < 1 or `num_computed` is
                outside [0, positions the sequence holds].
        """
        self._check_positions(seq_id, "num_computed", num_computed)
        if num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be >= 1, got {num_new_tokens}")
        for group in self._groups:
            group.free_behind_window(seq_id, num_computed)
        if any(
            group.num_to_grow(seq_id, num_computed, num_new_tokens) > group.pool.num_free_blocks
            for group in self._groups
        ):
            return False
        del self._hashes[seq_id][num_computed // self._block_size :]
        for group in self._groups:
            group.grow(seq_id, num_computed, num_new_tokens, self._copies)
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
        self._check_positions(seq_id, "num_computed", num_computed)
        if num_computed > len(token_ids):
            raise ValueError(f"num_computed must be <= {len(token_ids)}, got {num_computed}")
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
        for group in self._groups:
            group.cache(seq_id, start, new)
        hashes.extend(new)

    def free(self, seq_id: int) -> None:
        """Release the sequence's blocks, tail first, and forget it; unknown ids are a no-op."""
        if self._hashes.pop(seq_id, None) is None:
            return
        del self._keys[seq_id]
        for group in self._groups:
            group.free(seq_id)

    def fork(self, parent_id: int, child_id: int, num_tokens: int) -> None:
        """Let `child_id` share the parent's blocks covering positions [0, num_tokens).

        Later writes into a shared block go through copy-on-write (`allocate_slots`).

        Raises:
            ValueError: `parent_id` is unknown, `child_id` holds blocks, or `num_tokens` is
                outside [0, positions the parent holds].
        """
        self._check_positions(parent_id, "num_tokens", num_tokens)
        if child_id in self._hashes:
            raise ValueError(f"child_id {child_id} already holds blocks")
        for group in self._groups:
            group.fork(parent_id, child_id, cdiv(num_tokens, self._block_size))
        self._hashes[child_id] = self._hashes[parent_id][: num_tokens // self._block_size]
        self._keys[child_id] = self._keys[parent_id]

    def can_fork(self, parent_id: int, num_tokens: int) -> bool:
        """Whether `fork(parent_id, ..., num_tokens)` gives the child every block it reads:
        a windowed group may have freed blocks behind the parent's window that the
        child's window, further back, still needs.

        Raises:
            ValueError: `parent_id` is unknown.
        """
        self._check_known(parent_id)
        return all(group.can_fork(parent_id, num_tokens) for group in self._groups)

    def detach(self, seq_id: int) -> DetachedBlocks:
        """Stop tracking the sequence; its blocks keep their references for a new owner.

        Raises:
            ValueError: `seq_id` is unknown.
        """
        self._check_known(seq_id)
        ids = tuple(group.detach(seq_id) for group in self._groups)
        hashes = self._hashes.pop(seq_id)
        keys = self._keys.pop(seq_id)
        return DetachedBlocks(ids, tuple(hashes), self._block_size, keys.extra, keys.spans)

    def adopt(self, seq_id: int, detached: DetachedBlocks) -> None:
        """Make `seq_id` the owner of detached blocks; reference counts are unchanged.

        Raises:
            ValueError: `seq_id` already holds blocks, the block size or the number of
                groups differs, or a block is not materialized or is free.
        """
        if seq_id in self._hashes:
            raise ValueError(f"seq_id {seq_id} already holds blocks")
        if detached.block_size != self._block_size:
            raise ValueError(
                f"detached.block_size must be {self._block_size}, got {detached.block_size}"
            )
        if len(detached.block_ids) != len(self._groups):
            raise ValueError(
                f"detached blocks must hold {len(self._groups)} block tables, "
                f"got {len(detached.block_ids)}"
            )
        tables = [
            group.adoptable(ids)
            for group, ids in zip(self._groups, detached.block_ids, strict=True)
        ]
        for group, table in zip(self._groups, tables, strict=True):
            group.adopt(seq_id, table)
        self._hashes[seq_id] = list(detached.block_hashes)
        self._keys[seq_id] = _HashKeys(detached.extra, detached.spans)

    def block_table(self, seq_id: int) -> list[int]:
        """The sequence's block ids in the first group, in position order.

        Raises:
            ValueError: `seq_id` is unknown.
        """
        self._check_known(seq_id)
        return self._groups[0].block_ids(seq_id)

    def block_tables(self, seq_id: int) -> tuple[list[int], ...]:
        """The sequence's block ids in each group, in position order.

        Raises:
            ValueError: `seq_id` is unknown.
        """
        self._check_known(seq_id)
        return tuple(group.block_ids(seq_id) for group in self._groups)

    def num_blocks_of(self, seq_id: int) -> int:
        """Entries of each of the sequence's tables (covering num_blocks * block_size
        positions), freed ones included.

        Raises:
            ValueError: `seq_id` is unknown.
        """
        self._check_known(seq_id)
        return len(self._groups[0].tables[seq_id])

    def _check_known(self, seq_id: int) -> None:
        if seq_id not in self._hashes:
            raise ValueError(f"seq_id {seq_id} holds no blocks")

    def _check_positions(self, seq_id: int, name: str, num_tokens: int) -> None:
        num_held = self.num_blocks_of(seq_id) * self._block_size
        if not 0 <= num_tokens <= num_held:
            raise ValueError(f"{name} must be in [0, {num_held}], got {num_tokens}")

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can still be allocated, cached free blocks included (all groups)."""
        return sum(group.pool.num_free_blocks for group in self._groups)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence (all groups)."""
        return sum(group.pool.num_used_blocks for group in self._groups)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks in the prefix cache, used or free (all groups)."""
        return sum(group.pool.num_cached_blocks for group in self._groups)

    @property
    def num_usable_blocks(self) -> int:
        """Blocks sequences can hold: every pool's but its null block."""
        return sum(group.pool.num_blocks - 1 for group in self._groups)

    @property
    def materialized_blocks(self) -> tuple[int, ...]:
        """Per group, the blocks its storage must hold: highest id handed out + 1."""
        return tuple(group.pool.num_materialized for group in self._groups)

    def group_usage(self) -> tuple[BlockGroupUsage, ...]:
        """Each group's pool: its window, usable, used and cached blocks."""
        return tuple(
            BlockGroupUsage(
                group.window,
                group.pool.num_blocks - 1,
                group.pool.num_used_blocks,
                group.pool.num_cached_blocks,
            )
            for group in self._groups
        )

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by sequences (all groups)."""
        return self.num_used_blocks / self.num_usable_blocks

    @property
    def hit_rate(self) -> float:
        """Prefix-cache hit tokens / queried tokens over admitted sequences (0.0 before any)."""
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0
