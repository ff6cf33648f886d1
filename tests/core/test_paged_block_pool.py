"""The paged KV cache's block pool and the prefix hashes that key its cached blocks."""

from __future__ import annotations

import pytest

from mlxcel_core.cache.paged.block_pool import NULL_BLOCK_ID, BlockPool, InvariantError
from mlxcel_core.cache.paged.manager import KVCacheManager
from mlxcel_core.cache.paged.prefix import BlockHash, hash_block_tokens, hash_token_blocks

from paged_managers import BLOCK_SIZE

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
