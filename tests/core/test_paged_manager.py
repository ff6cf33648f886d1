"""The paged KV cache's manager on full-attention layers: admission and the prefix cache,
fork and copy-on-write, and handing a sequence's blocks over (detach and adopt)."""

from __future__ import annotations

import pytest

from mlxcel_core.cache.paged.manager import BlockCopy, DetachedBlocks, KVCacheManager
from mlxcel_core.cache.paged.prefix import hash_token_blocks

from paged_managers import BLOCK_SIZE, create_prompts, make_manager


def prefill(manager: KVCacheManager, seq_id: int, token_ids: list[int]) -> int | None:
    """Admit a whole prompt in one step and commit it, as the engine does after the pass."""
    num_cached = manager.admit(seq_id, token_ids, len(token_ids))
    if num_cached is not None:
        manager.commit(seq_id, token_ids, len(token_ids))
    return num_cached


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


def test_a_cached_prefix_shorter_than_min_cached_tokens_is_computed_afresh():
    (prompt,) = create_prompts(1, 10)
    for min_cached_tokens, cached in ((8, 8), (9, 0)):
        manager = make_manager(min_cached_tokens=min_cached_tokens)
        assert prefill(manager, 1, prompt) == 0
        assert prefill(manager, 2, prompt) == cached
        assert manager.num_cached_blocks == 2  # the fresh copy joins the cache all the same
    with pytest.raises(ValueError, match="min_cached_tokens"):
        make_manager(min_cached_tokens=-1)


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
