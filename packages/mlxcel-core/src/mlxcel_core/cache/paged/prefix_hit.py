"""Finding a new sequence's cached prefix: the blocks of its prompt the pool still holds.

Without a window every block before the first computed position is read, so the hit is
the longest run of cached blocks from the start (vLLM's `FullAttentionManager`). When every
attention layer reads only its last W positions, a hit of k blocks needs only the
sequence's first block (kept for quantized pools, which center later keys on it) and the
blocks the window of position `k * block_size` reaches back to; blocks between them may
have been evicted. The search then runs over all full blocks and keeps the longest such k
(vLLM's `SlidingWindowManager.find_longest_cache_hit`, which scans from the right).
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


def find_cached_prefix(
    pool: BlockPool,
    token_ids: Sequence[int],
    block_size: int,
    *,
    extra: BlockHashExtra = (),
    spans: Sequence[KeyedSpan] = (),
    window: int | None = None,
) -> tuple[list[KVBlock], list[BlockHash]]:
    """The longest usable cached prefix of `token_ids`, leaving at least one token to
    compute.

    Args:
        pool: the block pool to look blocks up in.
        token_ids: the sequence's tokens.
        block_size: tokens per block.
        extra: the sequence's extra hash key (see `KVCacheManager.admit`).
        spans: its keyed spans.
        window: positions every attention layer reads back, or None for all of them.

    Returns:
        The table entries of the prefix (the pool's null block where a window leaves a
        block unread) and the hashes of its blocks, one per entry.
    """
    hashes: list[BlockHash] = []
    found: list[KVBlock | None] = []
    parent = None
    for start in range(0, (len(token_ids) - 1) // block_size * block_size, block_size):
        keys = block_extra(extra, spans, start, block_size)
        parent = hash_block_tokens(parent, token_ids[start : start + block_size], keys)
        block = pool.lookup(parent)
        if block is None and window is None:
            break
        hashes.append(parent)
        found.append(block)
    if window is None:
        return found, hashes  # type: ignore[return-value]
    if not found or found[0] is None:
        return [], []
    best, run = 0, 0
    for k in range(1, len(found) + 1):
        run = run + 1 if found[k - 1] is not None else 0
        if run >= k - first_window_block(k * block_size, window, block_size):
            best = k
    first = first_window_block(best * block_size, window, block_size)
    table = [
        block if i == 0 or i >= first else pool.null_block for i, block in enumerate(found[:best])
    ]
    return table, hashes[:best]  # type: ignore[return-value]
