"""KV cache types by name, as `-ctk/--cache-type-k` and `-ctv/--cache-type-v` take them."""

from __future__ import annotations

import mlx.core as mx

from mlxcel_core.cache.quant.blockwise import Q4_0Codec, Q8_0Codec
from mlxcel_core.cache.quant.floats import FloatCodec
from mlxcel_core.cache.quant.protocol import KVCodec, bytes_per_vector
from mlxcel_core.cache.quant.turbo import TurboQuantCodec
from mlxcel_core.errors import InputError

# "auto" keeps keys and values in the dtype the model makes them in (vLLM's name for it).
AUTO = "auto"
CACHE_TYPES = ("auto", "f32", "f16", "bf16", "q8_0", "q4_0", "turbo2", "turbo3", "turbo4")
_FLOAT_TYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}


class CacheTypeError(InputError, ValueError):
    """A cache type cannot store a model's keys or values (their head dim does not fit)."""


def check_cache_type(name: str, cache_type: str) -> None:
    """Raise ValueError naming `name` unless `cache_type` is one of `CACHE_TYPES`."""
    if cache_type not in CACHE_TYPES:
        raise ValueError(f"{name} must be one of {', '.join(CACHE_TYPES)}; got {cache_type!r}")


def is_quantized(cache_type: str) -> bool:
    """Whether `cache_type` stores codes rather than floats (q8_0, q4_0 and TurboQuant)."""
    return cache_type != AUTO and cache_type not in _FLOAT_TYPES


def is_turbo(cache_type: str) -> bool:
    """Whether `cache_type` is a TurboQuant type (turbo2, turbo3, turbo4)."""
    return cache_type.startswith("turbo")


def make_kv_codec(cache_type: str, head_dim: int) -> KVCodec | None:
    """The codec of `cache_type` for head-vectors of `head_dim` features; None for "auto".

    Raises:
        ValueError: `cache_type` is unknown.
        CacheTypeError: its codec cannot take `head_dim` (q8_0 and q4_0 need a multiple
            of 32, the turbo types a power of two >= 8).
    """
    check_cache_type("cache_type", cache_type)
    try:
        if cache_type == AUTO:
            return None
        if cache_type in _FLOAT_TYPES:
            return FloatCodec(head_dim, _FLOAT_TYPES[cache_type])
        if cache_type == "q8_0":
            return Q8_0Codec(head_dim)
        if cache_type == "q4_0":
            return Q4_0Codec(head_dim)
        return TurboQuantCodec(head_dim, bits=int(cache_type.removeprefix("turbo")))
    except ValueError as error:
        raise CacheTypeError(str(error)) from error


def kv_bytes_per_vector(cache_type: str, head_dim: int, dtype: mx.Dtype) -> int:
    """Bytes one head-vector takes stored as `cache_type`; "auto" stores it in `dtype`.

    Raises:
        ValueError: as `make_kv_codec` (a `CacheTypeError` where the head dim does not fit).
    """
    codec = make_kv_codec(cache_type, head_dim)
    return head_dim * dtype.size if codec is None else bytes_per_vector(codec)
