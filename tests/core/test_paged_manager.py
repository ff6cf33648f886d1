"""The paged KV cache's bookkeeping: block pool, prefix hashes and the manager facade."""

from __future__ import annotations

import pytest

from mlxcel_core.cache.paged.block_pool import NULL_BLOCK_ID, BlockPool, InvariantError
from mlxcel_core.cache.paged.manager import (
    BlockCopy,
    DetachedBlocks,
    KVCacheManager,
    WindowGroup,
)
from mlxcel_core.cache.paged.prefix import BlockHash, hash_block_tokens, hash_token_blocks
from mlxcel_core.cache.paged.prefix_hit import PromptHashes, longest_common_hit, longest_hit

BLOCK_SIZE = 4


def create_prompts(num_prompts: int, num_tokens: int, *, prefix: tuple[int, ...] = ()):
    """`num_prompts` prompts of `num_tokens` tokens: `prefix`, then tokens unique to each."""
    return [
        [*prefix, *range(1000 * (i + 1), 1000 * (i + 1) + num_tokens - len(prefix))]
        for i in range(num_prompts)
    ]


def make_manager(num_blocks: int = 16, **kwargs) -> KVCacheManager:
    return KVCacheManager(num_blocks, BLOCK_SIZE, **kwargs)


def prefill(manager: KVCacheManager, seq_id: int, token_ids: list[int]) -> int | None:
    """Admit a whole prompt in one step and commit it, as the engine does after the pass."""
    num_cached = manager.admit(seq_id, token_ids, len(token_ids))
    if num_cached is not None:
        manager.commit(seq_id, token_ids, len(token_ids))
    return num_cached


# Block pool


def test_constructors_reject_bad_sizes():
    with pytest.raises(ValueError, match="num_blocks must be >= 2, got 1"):
        BlockPool(1)
    with pytest.raises(ValueError, match="num_blocks"):
        KVCacheManager(1, BLOCK_SIZE)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        KVCacheManager(8, 0)
    with pytest.raises(ValueError, match="block_size"):
        hash_token_blocks([1, 2], 0)


def test_allocate_is_all_or_nothing_and_never_hands_out_the_null_block():
    pool = BlockPool(5)
    assert pool.allocate(5) is None
    assert (pool.num_free_blocks, pool.num_materialized) == (4, 1)
    blocks = pool.allocate(4)
    assert sorted(block.block_id for block in blocks) == [1, 2, 3, 4]
    assert all(block.ref_count == 1 for block in blocks)
    assert pool.allocate(1) is None
    assert (pool.num_free_blocks, pool.num_used_blocks) == (0, 4)
    with pytest.raises(InvariantError):
        pool.free([pool.null_block])
    with pytest.raises(InvariantError):
        pool.touch([pool.null_block])
    assert pool.null_block.block_id == NULL_BLOCK_ID


def test_blocks_materialize_on_demand_and_freed_blocks_are_reused_before_new_ids():
    pool = BlockPool(10)
    first = pool.allocate(2)
    assert pool.num_materialized == 3
    pool.free(reversed(first))
    assert (pool.num_materialized, pool.num_free_blocks, pool.num_used_blocks) == (3, 9, 0)
    again = pool.allocate(2)
    assert {block.block_id for block in again} == {1, 2}
    assert pool.num_materialized == 3
    assert [block.block_id for block in pool.allocate(1)] == [3]
    assert pool.num_materialized == 4


def test_cached_free_blocks_survive_until_every_id_is_materialized_then_lru_goes_first():
    pool = BlockPool(5)
    blocks = pool.allocate(3)
    for i, block in enumerate(blocks):
        pool.cache_block(block, BlockHash(i))
    for i in (0, 2, 1):  # freed in this order: LRU order is 0, 2, 1
        pool.free([blocks[i]])
    assert (pool.num_cached_blocks, pool.num_free_blocks) == (3, 4)
    assert [block.block_id for block in pool.allocate(1)] == [4]  # a new id, no eviction
    assert pool.num_cached_blocks == 3
    assert pool.allocate(1) == [blocks[0]]
    assert pool.lookup(BlockHash(0)) is None
    assert blocks[0].block_hash is None
    assert pool.allocate(1) == [blocks[2]]
    assert pool.lookup(BlockHash(1)) is blocks[1]
    assert pool.num_cached_blocks == 1


def test_a_hash_already_cached_keeps_its_first_block():
    pool = BlockPool(8)
    first, duplicate = pool.allocate(2)
    pool.cache_block(first, BlockHash(7))
    pool.cache_block(duplicate, BlockHash(7))
    assert pool.lookup(BlockHash(7)) is first
    assert (duplicate.block_hash, pool.num_cached_blocks) == (None, 1)
    pool.free([first, duplicate])
    assert pool.allocate(1) == [duplicate]  # the uncached duplicate is reused first


def test_an_uncached_free_block_moves_to_the_head_of_the_free_queue():
    pool = BlockPool(8)
    first, second = pool.allocate(2)
    pool.cache_block(first, BlockHash(1))
    pool.cache_block(second, BlockHash(2))
    pool.free([first, second])
    pool.uncache_block(second)
    assert pool.allocate(1) == [second]
    assert pool.num_materialized == 3


def test_touch_takes_a_cached_block_out_of_the_free_queue():
    pool = BlockPool(3)
    block, other = pool.allocate(2)
    pool.cache_block(block, BlockHash(1))
    pool.free([block])
    pool.touch([block])
    assert (block.ref_count, pool.num_free_blocks, pool.num_used_blocks) == (1, 0, 2)
    pool.free([other])
    assert pool.allocate(1) == [other]


def test_double_free_raises_invariant_error():
    pool = BlockPool(4)
    blocks = pool.allocate(1)
    pool.free(blocks)
    with pytest.raises(InvariantError, match="ref_count 0"):
        pool.free(blocks)


# Prefix hashes


def test_block_hash_chains_the_prefix_and_extra_keys():
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    hashes = hash_token_blocks(tokens, BLOCK_SIZE)
    assert hashes == hash_token_blocks(tokens, BLOCK_SIZE)
    assert hashes[1] == hash_block_tokens(hashes[0], [5, 6, 7, 8])
    other_prefix = hash_token_blocks([9, 9, 9, 9, 5, 6, 7, 8], BLOCK_SIZE)
    assert other_prefix[1] != hashes[1]
    assert hash_block_tokens(None, [5, 6, 7, 8]) != hashes[1]
    assert hash_block_tokens(None, [1, 2, 3, 4], ("image-a",)) != hashes[0]
    assert hash_token_blocks(tokens[4:], BLOCK_SIZE, hashes[0]) == hashes[1:]


def test_a_trailing_partial_block_gets_no_hash():
    assert len(hash_token_blocks(list(range(7)), BLOCK_SIZE)) == 1
    assert hash_token_blocks([1, 2, 3], BLOCK_SIZE) == []


# Manager: admission and the prefix cache


def test_a_second_sequence_with_the_same_prompt_hits_the_prefix_cache():
    manager = make_manager()
    (prompt,) = create_prompts(1, 10)
    assert prefill(manager, 1, prompt) == 0
    assert manager.num_cached_blocks == 2  # the partial third block is not cached
    assert prefill(manager, 2, prompt) == 8
    first, second = manager.block_table(1), manager.block_table(2)
    assert second[:2] == first[:2]
    assert second[2] != first[2]
    assert (manager.num_queried_tokens, manager.num_hit_tokens) == (20, 8)
    assert manager.hit_rate == pytest.approx(0.4)


def test_a_prompt_of_whole_blocks_leaves_its_last_block_to_compute():
    manager = make_manager()
    (prompt,) = create_prompts(1, 8)
    prefill(manager, 1, prompt)
    assert manager.admit(2, prompt, 8) == 4
    assert manager.num_blocks_of(2) == 2


def test_a_partial_block_is_never_cached():
    manager = make_manager()
    (prompt,) = create_prompts(1, 6)
    prefill(manager, 1, prompt)
    assert manager.num_cached_blocks == 1
    assert manager.admit(2, [*prompt, 50, 51, 52], 9) == 4


def test_the_same_block_after_a_different_prefix_does_not_hit():
    manager = make_manager()
    first, second = create_prompts(2, 9, prefix=(1, 2, 3, 4, 5, 6, 7, 8))
    second[:4] = [40, 41, 42, 43]
    prefill(manager, 1, first)
    assert manager.admit(2, second, 9) == 0
    assert manager.admit(3, first, 9) == 8


def test_blocks_are_shared_only_between_sequences_of_the_same_extra_key():
    manager = make_manager()
    (prompt,) = create_prompts(1, 9)
    half = ("lora", (0.5).hex())
    assert manager.admit(1, prompt, 9, extra=half) == 0
    manager.commit(1, prompt, 9)
    assert manager.admit(2, prompt, 9) == 0
    assert manager.admit(3, prompt, 9, extra=("lora", (1.0).hex())) == 0
    assert manager.admit(4, prompt, 9, extra=half) == 8
    manager.fork(4, 5, 8)
    manager.allocate_slots(5, 8, 1)
    manager.commit(5, [*prompt[:8], 7, 7, 7, 7], 12)
    assert manager.detach(5).extra == half


def test_commit_registers_blocks_as_they_fill_during_decode():
    manager = make_manager()
    (tokens,) = create_prompts(1, 6)
    manager.admit(1, tokens, 6)
    manager.commit(1, tokens, 6)
    for token in (60, 61):
        assert manager.allocate_slots(1, len(tokens), 1)
        tokens.append(token)
        manager.commit(1, tokens, len(tokens))
    assert manager.num_cached_blocks == 2
    assert manager.admit(2, [*tokens, 62], 1) == 8


def test_admit_allocates_only_for_the_tokens_of_this_step():
    manager = make_manager()
    (prompt,) = create_prompts(1, 10)
    assert manager.admit(1, prompt, 3) == 0
    assert (manager.num_blocks_of(1), manager.materialized_blocks) == (1, (2,))
    assert manager.allocate_slots(1, 3, 7)
    assert manager.num_blocks_of(1) == 3


def test_admit_counts_free_cached_blocks_it_would_take_out_of_the_free_queue():
    manager = make_manager(num_blocks=4)
    prompt, other = create_prompts(2, 9)
    prefill(manager, 1, prompt)  # blocks 1, 2 cached, 3 holds the partial block
    manager.free(1)
    assert manager.admit(2, other[:1], 1) == 0  # takes block 3, the uncached one
    assert (manager.num_free_blocks, manager.num_cached_blocks) == (2, 2)
    # Two free blocks, one fresh block needed: but both free blocks are the cached prefix.
    assert manager.admit(3, prompt, 1) is None
    assert (manager.num_free_blocks, manager.num_cached_blocks) == (2, 2)
    with pytest.raises(ValueError, match="seq_id 3 holds no blocks"):
        manager.block_table(3)
    assert manager.num_queried_tokens == 10
    manager.free(2)
    assert manager.admit(3, prompt, 1) == 8


def test_a_freed_sequence_loses_its_tail_blocks_first_and_evicted_hashes_miss():
    manager = make_manager(num_blocks=4)
    prompt, other = create_prompts(2, 9)
    prefill(manager, 1, prompt)
    manager.free(1)
    assert manager.admit(2, other[:8], 8) == 0  # evicts the prompt's second block
    assert manager.num_cached_blocks == 1
    manager.free(2)
    assert manager.admit(3, prompt, 9) == 4


def test_prefix_caching_disabled_caches_nothing():
    manager = make_manager(enable_prefix_caching=False)
    (prompt,) = create_prompts(1, 12)
    prefill(manager, 1, prompt)
    assert manager.num_cached_blocks == 0
    assert prefill(manager, 2, prompt) == 0
    assert manager.hit_rate == 0.0


def test_admit_and_allocate_slots_reject_bad_arguments():
    manager = make_manager()
    (prompt,) = create_prompts(1, 6)
    with pytest.raises(ValueError, match="num_new_tokens must be >= 1, got 0"):
        manager.admit(1, prompt, 0)
    with pytest.raises(ValueError, match="token_ids"):
        manager.admit(1, [], 1)
    manager.admit(1, prompt, 6)
    with pytest.raises(ValueError, match="seq_id 1 already holds blocks"):
        manager.admit(1, prompt, 6)
    with pytest.raises(ValueError, match=r"num_computed must be in \[0, 8\], got 9"):
        manager.allocate_slots(1, 9, 1)
    with pytest.raises(ValueError, match="seq_id 5"):
        manager.allocate_slots(5, 0, 1)


def test_allocate_slots_refuses_without_changing_anything():
    manager = make_manager(num_blocks=3)
    first, second = create_prompts(2, 4)
    manager.admit(1, first, 4)
    manager.admit(2, second, 4)
    assert not manager.allocate_slots(1, 4, 1)
    assert manager.block_table(1) == [1]
    manager.free(2)
    assert manager.allocate_slots(1, 4, 1)
    assert manager.block_table(1) == [1, 2]


# Manager: fork and copy-on-write


def test_a_write_into_a_shared_block_copies_it_for_the_writer():
    manager = make_manager()
    (prompt,) = create_prompts(1, 6)
    manager.admit(1, prompt, 6)
    manager.fork(1, 2, 6)
    parent = manager.block_table(1)
    assert manager.block_table(2) == parent
    assert manager.num_used_blocks == 2
    assert manager.allocate_slots(2, 6, 1)
    child = manager.block_table(2)
    assert child[0] == parent[0]
    assert child[1] != parent[1]
    assert manager.take_block_copies() == [BlockCopy(parent[1], child[1])]
    assert manager.take_block_copies() == []
    assert manager.allocate_slots(1, 6, 1)  # the parent holds its block alone now
    assert manager.block_table(1) == parent
    assert manager.take_block_copies() == []


def test_a_fork_at_a_block_boundary_needs_no_copy():
    manager = make_manager()
    (prompt,) = create_prompts(1, 8)
    prefill(manager, 1, prompt)
    manager.fork(1, 2, 8)
    assert manager.allocate_slots(2, 8, 1)
    assert manager.allocate_slots(1, 8, 1)
    assert manager.take_block_copies() == []
    parent, child = manager.block_table(1), manager.block_table(2)
    assert child[:2] == parent[:2]
    assert child[2] != parent[2]
    manager.free(1)
    manager.free(2)
    assert manager.num_used_blocks == 0


def test_a_shared_block_rewritten_from_its_start_is_replaced_without_a_copy():
    manager = make_manager()
    (prompt,) = create_prompts(1, 8)
    prefill(manager, 1, prompt)
    manager.fork(1, 2, 8)
    assert manager.allocate_slots(2, 4, 1)  # position 4 starts the shared second block
    parent, child = manager.block_table(1), manager.block_table(2)
    assert child[0] == parent[0]
    assert child[1] != parent[1]
    assert manager.take_block_copies() == []


def test_a_fork_inherits_the_committed_hashes_of_its_whole_blocks():
    manager = make_manager()
    (prompt,) = create_prompts(1, 10)
    prefill(manager, 1, prompt)
    manager.fork(1, 2, 7)
    assert manager.block_table(2) == manager.block_table(1)[:2]
    assert manager.detach(2).block_hashes == tuple(hash_token_blocks(prompt[:4], BLOCK_SIZE))


def test_copy_on_write_is_all_or_nothing():
    manager = make_manager(num_blocks=3)
    (prompt,) = create_prompts(1, 6)
    manager.admit(1, prompt, 6)
    manager.fork(1, 2, 6)
    assert not manager.allocate_slots(2, 6, 3)  # one copy + one new block, one free
    assert manager.block_table(2) == manager.block_table(1)
    assert manager.take_block_copies() == []


def test_writing_into_a_cached_block_held_once_uncaches_it():
    manager = make_manager()
    (prompt,) = create_prompts(1, 8)
    prefill(manager, 1, prompt)
    table = manager.block_table(1)
    assert manager.allocate_slots(1, 4, 2)  # rewrite from position 4 (e.g. a rollback)
    assert manager.block_table(1) == table
    assert manager.num_cached_blocks == 1
    assert manager.admit(2, [*prompt, 99], 1) == 4


def test_blocks_rewritten_after_a_rollback_are_committed_under_their_new_tokens():
    manager = make_manager()
    prompt, other = create_prompts(2, 8)
    prefill(manager, 1, prompt)
    assert manager.allocate_slots(1, 4, 4)
    rewritten = [*prompt[:4], *other[4:]]
    manager.commit(1, rewritten, 8)
    assert manager.num_cached_blocks == 2
    assert manager.admit(2, [*rewritten, 99], 1) == 8


# Manager: ownership


def test_detach_then_adopt_keeps_references_and_the_block_table():
    manager = make_manager()
    (prompt,) = create_prompts(1, 10)
    prefill(manager, 1, prompt)
    manager.fork(1, 2, 10)
    table, used = manager.block_table(1), manager.num_used_blocks
    detached = manager.detach(1)
    assert detached.block_ids == (tuple(table),)
    assert len(detached.block_hashes) == 2
    assert manager.num_used_blocks == used
    with pytest.raises(ValueError, match="seq_id 1"):
        manager.detach(1)
    manager.adopt(3, detached)
    assert manager.block_table(3) == table
    with pytest.raises(ValueError, match="seq_id 3 already holds blocks"):
        manager.adopt(3, detached)
    manager.free(2)
    manager.free(3)
    assert manager.num_used_blocks == 0
    assert manager.usage == 0.0


def test_adopt_rejects_blocks_it_cannot_own():
    manager = make_manager()
    (prompt,) = create_prompts(1, 8)
    prefill(manager, 1, prompt)
    detached = manager.detach(1)
    with pytest.raises(ValueError, match="block_size must be 4, got 8"):
        manager.adopt(2, DetachedBlocks(detached.block_ids, (), 8))
    with pytest.raises(ValueError, match=r"block_id must be in \[1, 2\], got 9"):
        manager.adopt(2, DetachedBlocks(((9,),), (), BLOCK_SIZE))
    manager.adopt(2, detached)
    manager.free(2)
    with pytest.raises(ValueError, match="block 1 is free"):
        manager.adopt(3, detached)


def test_freeing_an_unknown_sequence_is_a_no_op():
    manager = make_manager()
    manager.free(42)
    assert manager.num_free_blocks == 15


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
