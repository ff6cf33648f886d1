"""The paged KV cache: a block pool with prefix caching, its arrays, and batched views.

`KVCacheManager` is the bookkeeping (block tables, reference counts, prefix hashes,
copy-on-write, detach/adopt), one pool and table per block group (full attention, each
sliding window), and touches no arrays; `PagedKVStorage` holds the per-layer
pools; `PagedBatch` and `PagedLayerCache` let a model's attention read and write them
through the `KVCache` protocol (gather, then attention: the reference path).
"""

from mlxcel_core.cache.paged.batch import BatchRow, PagedBatch
from mlxcel_core.cache.paged.block_pool import BlockPool, InvariantError, KVBlock
from mlxcel_core.cache.paged.geometry import LayerGeometry
from mlxcel_core.cache.paged.layer_cache import PagedLayerCache, make_layer_caches
from mlxcel_core.cache.paged.manager import (
    BlockCopy,
    BlockGroupUsage,
    DetachedBlocks,
    KVCacheManager,
    WindowGroup,
)
from mlxcel_core.cache.paged.prefix import (
    BlockHash,
    BlockHashExtra,
    KeyedSpan,
    block_extra,
    hash_block_tokens,
    hash_token_blocks,
)
from mlxcel_core.cache.paged.residual import (
    ResidualPlanner,
    ResidualSlots,
    residual_blocks_per_row,
    residual_dtype,
)
from mlxcel_core.cache.paged.storage import PagedKVStorage

__all__ = [
    "BatchRow",
    "BlockCopy",
    "BlockGroupUsage",
    "BlockHash",
    "BlockHashExtra",
    "BlockPool",
    "DetachedBlocks",
    "InvariantError",
    "KVBlock",
    "KVCacheManager",
    "KeyedSpan",
    "LayerGeometry",
    "PagedBatch",
    "PagedKVStorage",
    "PagedLayerCache",
    "ResidualPlanner",
    "ResidualSlots",
    "WindowGroup",
    "block_extra",
    "hash_block_tokens",
    "hash_token_blocks",
    "make_layer_caches",
    "residual_blocks_per_row",
    "residual_dtype",
]
