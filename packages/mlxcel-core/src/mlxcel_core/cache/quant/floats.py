"""Plain float KV caches: head-vectors cast to float32, float16 or bfloat16."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from mlxcel_core.cache.quant.protocol import Component


class FloatCodec:
    """Stores each head-vector cast to `storage_dtype`; decoding casts it back.

    Args:
        head_dim: features per head (D).
        storage_dtype: the dtype kept in the pools.
    """

    def __init__(self, head_dim: int, storage_dtype: mx.Dtype) -> None:
        self.storage_dtype = storage_dtype
        self.centered = False
        self.components = (Component(head_dim, storage_dtype),)

    def encode(self, x: mx.array) -> tuple[mx.array, ...]:
        return (x.astype(self.storage_dtype),)

    def decode(self, parts: Sequence[mx.array], dtype: mx.Dtype) -> mx.array:
        return parts[0].astype(dtype)
