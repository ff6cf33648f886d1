"""KV caches: the protocol model code calls, and its implementations."""

from mlxcel_core.cache.dense import DenseKVCache
from mlxcel_core.cache.protocol import KVCache

__all__ = ["DenseKVCache", "KVCache"]
