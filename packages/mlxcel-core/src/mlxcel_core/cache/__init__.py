"""KV caches: the protocol model code calls, and its implementations."""

from mlxcel_core.cache.dense import DenseKVCache, make_causal_mask
from mlxcel_core.cache.protocol import AttentionCache, AttentionMask, KVCache

__all__ = ["AttentionCache", "AttentionMask", "DenseKVCache", "KVCache", "make_causal_mask"]
