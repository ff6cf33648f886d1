"""KV caches: the protocol model code calls, and its implementations."""

from mlxcel_core.cache.dense import DenseKVCache, make_causal_mask
from mlxcel_core.cache.protocol import AttentionMask, KVCache

__all__ = ["AttentionMask", "DenseKVCache", "KVCache", "make_causal_mask"]
