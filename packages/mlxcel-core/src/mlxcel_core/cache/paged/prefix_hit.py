"""Finding a new sequence's cached prefix: the blocks of its prompt the pools still hold.

In a full-attention block group every block before the first computed position is read,
so the group's hit is the longest run of cached blocks from the start (vLLM's
`FullAttentionManager`). In a group whose layers read only their last W positions, a hit
of k blocks needs only the sequence's first block (kept for quantized pools, which center
later keys on it) and the blocks the window of position `k * block_size` reaches back to;
blocks between them may have been evicted. The search then runs over the full blocks and
keeps the longest such k (vLLM's `SlidingWindowManager.find_longest_cache_hit`).

With several groups the hit is the longest prefix every group can serve. A full-attention
hit stays a hit when shortened, a windowed one need not (a shorter prefix's window reaches
further back), so the groups take turns lowering a common bound until none lowers it
(vLLM's `HybridKVCacheCoordinator`, which iterates to the same fixed point).
"""

from __future__ import annotations

from collections.abc import Sequence

from mlxcel_core.cache.paged.block_pool import BlockPool, KVBlock
from mlxcel_core.cache.paged.prefix import (
    BlockHash,
    BlockHashExtra,
    KeyedSpan,
    block_extra,
    hash_block_tokens,
)


def first_window_block(position: int, window: int, block_size: int) -> int:
    """The first block, past a sequence's first, that attention at `position` reads under
    a window of `window` positions (its own included)."""
    return max(1, max(0, position - window + 1) // block_size)


class PromptHashes:
    """The hashes of a prompt's full blocks before its last token, made as they are asked
    for (a miss in the first block of a long prompt hashes one block only).

    Args:
        token_ids: the sequence's tokens.
        block_size: tokens per block.
        extra: the sequence's extra hash key (see `KVCacheManager.admit`).
        spans: its keyed spans.
    """

    def __init__(
        self,
        token_ids: Sequence[int],
        block_size: int,
        extra: BlockHashExtra = (),
        spans: Sequence[KeyedSpan] = (),
    ) -> None:
        self._token_ids = token_ids
        self._block_size = block_size
        self._extra = extra
        self._spans = spans
        self._hashes: list[BlockHash] = []
        # At least one token is left to compute, so the last token's block is never hit.
        self.num_blocks = (len(token_ids) - 1) // block_size

    def __getitem__(self, index: int) -> BlockHash:
        size = self._block_size
        while len(self._hashes) <= index:
            start = len(self._hashes) * size
            parent = self._hashes[-1] if self._hashes else None
            keys = block_extra(self._extra, self._spans, start, size)
            self._hashes.append(
                hash_block_tokens(parent, self._token_ids[start : start + size], keys)
            )
        return self._hashes[index]

    def prefix(self, num_blocks: int) -> list[BlockHash]:
        """The first `num_blocks` hashes."""
        if num_blocks:
            self[num_blocks - 1]
        return self._hashes[:num_blocks]


def longest_hit(
    pool: BlockPool,
    hashes: PromptHashes,
    block_size: int,
    *,
    window: int | None,
    limit: int,
) -> int:
    """The most full blocks, at most `limit`, whose prefix one group's pool can serve.

    Args:
        pool: the group's block pool.
        hashes: the prompt's block hashes.
        block_size: tokens per block.
        window: positions the group's layers read back, or None for all of them.
        limit: the most blocks to consider (<= `hashes.num_blocks`).
    """
    if window is None:
        hit = 0
        while hit < limit and pool.lookup(hashes[hit]) is not None:
            hit += 1
        return hit
    if limit == 0 or pool.lookup(hashes[0]) is None:
        return 0
    best, run = 0, 0
    for k in range(1, limit + 1):
        run = run + 1 if pool.lookup(hashes[k - 1]) is not None else 0
        if run >= k - first_window_block(k * block_size, window, block_size):
            best = k
    return best


def longest_common_hit(
    groups: Sequence[tuple[BlockPool, int | None]], hashes: PromptHashes, block_size: int
) -> int:
    """The most full blocks every group can serve: each group (its pool and window) in
    turn lowers a common bound to its own longest hit within it, until a round of all
    of them lowers it no more.

    Args:
        groups: each block group's pool and window (None: full attention).
        hashes: the prompt's block hashes.
        block_size: tokens per block.
    """
    bound = hashes.num_blocks
    while True:
        start = bound
        for pool, window in groups:
            bound = longest_hit(pool, hashes, block_size, window=window, limit=bound)
        if bound == start:
            return bound


def hit_blocks(
    pool: BlockPool, hashes: PromptHashes, block_size: int, *, window: int | None, hit: int
) -> list[KVBlock]:
    """The table entries of a group's `hit` cached blocks (`longest_hit` found them):
    the pool's null block where a window leaves a block unread."""
    first = 0 if window is None else first_window_block(hit * block_size, window, block_size)
    table = []
    for i in range(hit):
        block = pool.lookup(hashes[i]) if i == 0 or i >= first else pool.null_block
        if block is None:
            raise ValueError(f"block {i} of the hit is not cached")
        table.append(block)
    return table
