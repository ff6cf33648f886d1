"""The paged KV cache's manager over sliding-window layers: blocks freed behind the window,
prefix hits searched from the right, and block groups (full-attention layers beside
windowed ones, each over its own pool) whose common hit every group can serve."""

from __future__ import annotations

import pytest

from mlxcel_core.cache.paged.block_pool import NULL_BLOCK_ID, BlockPool
from mlxcel_core.cache.paged.manager import DetachedBlocks, KVCacheManager, WindowGroup
from mlxcel_core.cache.paged.prefix_hit import PromptHashes, longest_common_hit, longest_hit

from paged_managers import BLOCK_SIZE, create_prompts, make_manager

# Sliding window: every attention layer reads only the last `sliding_window` positions


def decode(manager: KVCacheManager, seq_id: int, token_ids: list[int], start: int) -> None:
    """Compute positions start .. len(token_ids) - 1 one at a time, as decode steps do."""
    for position in range(start, len(token_ids)):
        assert manager.allocate_slots(seq_id, position, 1)
        manager.commit(seq_id, token_ids, position + 1)


def test_blocks_behind_the_window_are_freed_and_the_first_is_kept():
    manager = make_manager(num_blocks=32, sliding_window=6)
    (tokens,) = create_prompts(1, 40)
    assert manager.admit(0, tokens, 1) == 0
    decode(manager, 0, tokens, 0)
    table = manager.block_table(0)
    # The next token (position 40) reads positions 35-40: blocks 8-10 (and 10 is new).
    assert manager.allocate_slots(0, 40, 1)
    table = manager.block_table(0)
    assert table[0] != NULL_BLOCK_ID
    assert table[1:8] == [NULL_BLOCK_ID] * 7
    assert NULL_BLOCK_ID not in table[8:]
    assert manager.num_used_blocks == 1 + 3
    assert manager.num_free_blocks == 31 - 4
    manager.free(0)
    assert manager.num_free_blocks == 31


def prefill_in_chunks(manager: KVCacheManager, seq_id: int, token_ids: list[int]) -> None:
    """Admit and compute a prompt in chunks of 8, committing each, as the engine does."""
    assert manager.admit(seq_id, token_ids, 8) == 0
    manager.commit(seq_id, token_ids, 8)
    for start in range(8, len(token_ids), 8):
        num_new = min(8, len(token_ids) - start)
        assert manager.allocate_slots(seq_id, start, num_new)
        manager.commit(seq_id, token_ids, start + num_new)


def test_a_windowed_prefix_hit_searches_from_the_right():
    """A hit needs the first block and the blocks the window reaches back from the first
    position to compute; blocks between them may have been evicted."""
    manager = make_manager(num_blocks=10, sliding_window=6)
    tokens, other = create_prompts(2, 30)
    # Its blocks 1-3 are freed behind the window as the chunks go, oldest first.
    prefill_in_chunks(manager, 0, tokens)
    assert manager.block_table(0)[1:4] == [NULL_BLOCK_ID] * 3
    # Another sequence takes the last unmaterialized block and evicts blocks 1 and 2.
    assert manager.admit(1, other, 12) == 0
    manager.free(0)
    # 7 full blocks before the last token; position 28 reads 23-28: blocks 5 and 6.
    assert manager.admit(2, tokens, 2) == 28
    table = manager.block_table(2)
    assert table[1:5] == [NULL_BLOCK_ID] * 4
    assert NULL_BLOCK_ID not in (table[0], *table[5:])


def test_a_windowed_hit_stops_where_a_window_block_is_missing():
    manager = make_manager(num_blocks=10, sliding_window=6)
    tokens, other = create_prompts(2, 30)
    prefill_in_chunks(manager, 0, tokens)
    manager.free(0)
    # The partial block 7 is taken first, then the last free id, then blocks 1-3 (freed
    # behind the window first) and block 6 (the first of the sequence's freed at its end).
    assert manager.admit(1, other, 24) == 0
    manager.free(1)
    # Without block 6, the best hit is 24 tokens (position 24 reads blocks 4 and 5).
    assert manager.admit(2, tokens, 2) == 24


def test_forks_and_adoption_keep_the_null_entries_behind_the_window():
    manager = make_manager(num_blocks=32, sliding_window=6)
    (tokens,) = create_prompts(1, 24)
    assert manager.admit(0, tokens, 1) == 0
    decode(manager, 0, tokens, 0)
    assert manager.allocate_slots(0, 24, 1)
    manager.fork(0, 1, 24)
    assert manager.block_table(1) == manager.block_table(0)[:6]
    used = manager.num_used_blocks
    detached = manager.detach(1)
    manager.adopt(2, detached)
    assert manager.block_table(2) == manager.block_table(0)[:6]
    manager.free(2)
    manager.free(0)
    assert manager.num_used_blocks == 0 < used
    with pytest.raises(ValueError, match="sliding_window must be None or >= 1, got 0"):
        make_manager(sliding_window=0)


def test_a_child_forks_only_while_the_parent_holds_the_blocks_its_window_reads():
    manager = make_manager(num_blocks=32, sliding_window=6)
    (tokens,) = create_prompts(1, 30)
    assert manager.admit(0, tokens, 1) == 0
    decode(manager, 0, tokens, 0)
    assert manager.allocate_slots(0, 30, 1)  # frees blocks 1-5: position 30 reads 25-30
    assert manager.can_fork(0, 29)
    assert not manager.can_fork(0, 9)  # position 9 reads 4-9: blocks 1 and 2, freed
    plain = make_manager(num_blocks=32)
    assert plain.admit(0, tokens, 30) == 0
    assert plain.can_fork(0, 9)


# Block groups: full-attention layers beside windowed ones, each over its own pool


def make_mixed_manager(
    num_blocks: int = 32, window: int = 6, window_blocks: int = 8
) -> KVCacheManager:
    """A full-attention group of `num_blocks` and a group of `window`-position layers."""
    return KVCacheManager(
        num_blocks, BLOCK_SIZE, window_groups=[WindowGroup(window, window_blocks)]
    )


def test_the_window_group_frees_its_blocks_while_the_full_group_keeps_all():
    manager = make_mixed_manager()
    (tokens,) = create_prompts(1, 40)
    assert manager.admit(0, tokens, 1) == 0
    decode(manager, 0, tokens, 0)
    assert manager.allocate_slots(0, 40, 1)
    full, windowed = manager.block_tables(0)
    assert len(full) == len(windowed) == 11
    assert NULL_BLOCK_ID not in full
    # Position 40 reads 35-40: blocks 8-10 of the window group, and its first block.
    assert windowed[1:8] == [NULL_BLOCK_ID] * 7
    assert NULL_BLOCK_ID not in (windowed[0], *windowed[8:])
    assert [(g.window, g.num_used) for g in manager.group_usage()] == [(None, 11), (6, 4)]
    assert manager.block_table(0) == full
    manager.free(0)
    assert [g.num_used for g in manager.group_usage()] == [0, 0]
    assert manager.num_free_blocks == 31 + 7


def test_a_full_window_pool_refuses_the_slots_of_every_group():
    manager = make_mixed_manager(window_blocks=4)
    tokens, other = create_prompts(2, 12)
    assert manager.admit(0, tokens, 8) == 0  # two blocks in each group
    assert manager.admit(1, other, 4) == 0  # one more each: the window pool is full
    used = manager.num_used_blocks
    assert not manager.allocate_slots(1, 4, 4)
    assert manager.num_used_blocks == used
    assert manager.admit(2, create_prompts(3, 4)[2], 4) is None
    assert manager.materialized_blocks == (4, 4)


def test_copies_on_write_name_their_group():
    manager = make_mixed_manager()
    (tokens,) = create_prompts(1, 6)
    assert manager.admit(0, tokens, 6) == 0
    manager.fork(0, 1, 5)
    assert manager.allocate_slots(1, 5, 1)
    copies = manager.take_block_copies()
    assert sorted(copy.group for copy in copies) == [0, 1]
    assert all(copy.dst_block_id == manager.block_tables(1)[copy.group][1] for copy in copies)


def test_a_hit_is_the_longest_prefix_both_groups_serve():
    manager = make_mixed_manager(window_blocks=10)
    tokens, other = create_prompts(2, 30)
    prefill_in_chunks(manager, 0, tokens)
    manager.free(0)
    # The full group keeps every block cached; the window group loses blocks 1-3 and 6
    # to another prompt (as `test_a_windowed_hit_stops_where_a_window_block_is_missing`).
    assert manager.admit(1, other, 24) == 0
    manager.free(1)
    assert manager.admit(2, tokens, 2) == 24
    full, windowed = manager.block_tables(2)
    assert NULL_BLOCK_ID not in full
    assert windowed[1:4] == [NULL_BLOCK_ID] * 3


def test_forks_and_adoption_carry_every_group():
    manager = make_mixed_manager()
    (tokens,) = create_prompts(1, 30)
    assert manager.admit(0, tokens, 1) == 0
    decode(manager, 0, tokens, 0)
    assert manager.allocate_slots(0, 30, 1)
    assert manager.can_fork(0, 29)
    assert not manager.can_fork(0, 9)  # the window group freed what position 9 reads
    manager.fork(0, 1, 29)
    detached = manager.detach(1)
    assert detached.block_ids == tuple(tuple(t[:8]) for t in manager.block_tables(0))
    manager.adopt(2, detached)
    assert manager.block_tables(2) == tuple(t[:8] for t in manager.block_tables(0))
    with pytest.raises(ValueError, match="must hold 2 block tables, got 1"):
        manager.adopt(3, DetachedBlocks(detached.block_ids[:1], (), BLOCK_SIZE))
    manager.free(2)
    manager.free(0)
    assert manager.num_used_blocks == 0


def cache_blocks(pool: BlockPool, hashes: PromptHashes, indices: set[int]) -> None:
    """Make `pool` hold the prompt's blocks `indices` as cached free blocks."""
    blocks = pool.allocate(len(indices))
    for block, index in zip(blocks, sorted(indices), strict=True):
        pool.cache_block(block, hashes[index])
    pool.free(blocks)


def test_the_common_hit_iterates_until_no_group_lowers_it():
    """Full attention serves 9 blocks; a window of 6 then 8; a window of 2 then 7; at 7
    the window of 6 misses block 5, and every shorter hit of it misses a block, down to
    1: a single pass over the groups would have answered 7."""
    hashes = PromptHashes(list(range(37)), BLOCK_SIZE)
    full, six, two = BlockPool(16), BlockPool(16), BlockPool(16)
    cache_blocks(full, hashes, set(range(9)))
    cache_blocks(six, hashes, {0, 6, 7})
    cache_blocks(two, hashes, {0, 3, 6})
    assert longest_hit(six, hashes, BLOCK_SIZE, window=6, limit=9) == 8
    assert longest_hit(two, hashes, BLOCK_SIZE, window=2, limit=8) == 7
    assert longest_hit(six, hashes, BLOCK_SIZE, window=6, limit=7) == 1
    groups = [(full, None), (six, 6), (two, 2)]
    assert longest_common_hit(groups, hashes, BLOCK_SIZE) == 1
    assert longest_common_hit(groups[:2], hashes, BLOCK_SIZE) == 8
