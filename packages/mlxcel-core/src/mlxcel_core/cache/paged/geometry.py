"""The shape of an attention layer's keys and values, and the bytes they take stored."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.cache.paged.residual import residual_dtype
from mlxcel_core.cache.quant import AUTO, is_quantized, kv_bytes_per_vector


@dataclass(frozen=True)
class LayerGeometry:
    """The shape of one attention layer's keys and values.

    Attributes:
        num_kv_heads: key/value heads (H_kv).
        key_dim: features per key head (D_k).
        value_dim: features per value head (D_v).
        dtype: the dtype the layer produces keys and values in.
    """

    num_kv_heads: int
    key_dim: int
    value_dim: int
    dtype: mx.Dtype

    def bytes_per_token(self, cache_type_k: str = AUTO, cache_type_v: str = AUTO) -> int:
        """Key plus value bytes one position takes in this layer, stored as the given types.

        Raises:
            ValueError: a cache type is unknown or cannot take this layer's head dim.
        """
        key_bytes = kv_bytes_per_vector(cache_type_k, self.key_dim, self.dtype)
        value_bytes = kv_bytes_per_vector(cache_type_v, self.value_dim, self.dtype)
        return self.num_kv_heads * (key_bytes + value_bytes)

    def exact_bytes_per_token(self, cache_type_k: str, cache_type_v: str) -> int:
        """Bytes one position's exact copies take in this layer under a residual window:
        the quantized sides' keys or values in `residual_dtype` of the layer's."""
        features = is_quantized(cache_type_k) * self.key_dim
        features += is_quantized(cache_type_v) * self.value_dim
        return self.num_kv_heads * features * residual_dtype(self.dtype).size
