"""Quantized and low-precision KV caches: codecs between head-vectors and packed arrays.

A codec encodes (N, H, D) keys or values into a few packed arrays per slot and decodes
them back in the model's dtype; the paged storage keeps the packed arrays in its pools.
Types: f32, f16, bf16 (casts), q8_0 and q4_0 (llama.cpp's block formats) and turbo2/3/4
(TurboQuant); "auto" stores what the model produces, without a codec.
"""

from mlxcel_core.cache.quant.factory import (
    AUTO,
    CACHE_TYPES,
    CacheTypeError,
    check_cache_type,
    is_quantized,
    is_turbo,
    kv_bytes_per_vector,
    make_kv_codec,
)
from mlxcel_core.cache.quant.protocol import Component, KVCodec, bytes_per_vector

__all__ = [
    "AUTO",
    "CACHE_TYPES",
    "CacheTypeError",
    "Component",
    "KVCodec",
    "bytes_per_vector",
    "check_cache_type",
    "is_quantized",
    "is_turbo",
    "kv_bytes_per_vector",
    "make_kv_codec",
]
