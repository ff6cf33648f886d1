"""Small paged KV cache managers and the prompts they admit, for the bookkeeping tests."""

from __future__ import annotations

from mlxcel_core.cache.paged.manager import KVCacheManager

BLOCK_SIZE = 4


def create_prompts(num_prompts: int, num_tokens: int, *, prefix: tuple[int, ...] = ()):
    """`num_prompts` prompts of `num_tokens` tokens: `prefix`, then tokens unique to each."""
    return [
        [*prefix, *range(1000 * (i + 1), 1000 * (i + 1) + num_tokens - len(prefix))]
        for i in range(num_prompts)
    ]


def make_manager(num_blocks: int = 16, **kwargs) -> KVCacheManager:
    return KVCacheManager(num_blocks, BLOCK_SIZE, **kwargs)
