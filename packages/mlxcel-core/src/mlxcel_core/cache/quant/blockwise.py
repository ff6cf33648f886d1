"""llama.cpp's block quantizations of the KV cache: q8_0 and q4_0 (32 values per scale).

Each head-vector is cut into groups of 32 features with one float16 scale `d` per group,
quantized as llama.cpp's `quantize_row_q8_0_ref` and `quantize_row_q4_0_ref` do
(ggml/src/ggml-quants.c):

- q8_0: d = max|x| / 127, q = round(x / d) in [-127, 127], x ~ q * d. 34 bytes per 32.
- q4_0: d = m / -8 where m is the group's value of largest magnitude (sign kept), then
  q = min(15, floor(x / d + 8.5)), x ~ (q - 8) * d; so m itself is exact and the range is
  [-8, 7] steps. 18 bytes per 32.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from mlxcel_core.cache.quant.bitpack import pack_bits, packed_width, unpack_bits
from mlxcel_core.cache.quant.protocol import Component

GROUP_SIZE = 32


def _groups(x: mx.array) -> mx.array:
    """(N, H, D) -> (N, H, D / 32, 32) float32."""
    N, H, D = x.shape
    return x.astype(mx.float32).reshape(N, H, D // GROUP_SIZE, GROUP_SIZE)


def _inverse(scale: mx.array) -> mx.array:
    """1 / scale, and 0 for an all-zero group (as llama.cpp)."""
    return mx.where(scale != 0, 1.0 / mx.where(scale != 0, scale, 1.0), 0.0)


def _check_head_dim(name: str, head_dim: int) -> None:
    if head_dim % GROUP_SIZE:
        raise ValueError(
            f"cache type {name} needs a head dim that is a multiple of {GROUP_SIZE}, "
            f"got head_dim={head_dim}"
        )


class Q8_0Codec:
    """int8 codes with one float16 scale per 32 features (llama.cpp's q8_0).

    Args:
        head_dim: features per head (D), a multiple of 32.

    Raises:
        ValueError: `head_dim` is not a multiple of 32.
    """

    def __init__(self, head_dim: int) -> None:
        _check_head_dim("q8_0", head_dim)
        self.centered = False
        self.components = (
            Component(head_dim, mx.int8),
            Component(head_dim // GROUP_SIZE, mx.float16),
        )

    def encode(self, x: mx.array) -> tuple[mx.array, ...]:
        N, H, D = x.shape
        groups = _groups(x)
        scale = mx.max(mx.abs(groups), axis=-1, keepdims=True) / 127.0
        codes = mx.round(groups * _inverse(scale)).astype(mx.int8)
        return codes.reshape(N, H, D), scale.squeeze(-1).astype(mx.float16)

    def decode(self, parts: Sequence[mx.array], dtype: mx.Dtype) -> mx.array:
        codes, scale = parts
        *lead, D = codes.shape
        groups = codes.reshape(*lead, D // GROUP_SIZE, GROUP_SIZE).astype(mx.float32)
        return (groups * scale[..., None].astype(mx.float32)).reshape(*lead, D).astype(dtype)


class Q4_0Codec:
    """4-bit codes (two per byte) with one float16 scale per 32 features (llama.cpp's q4_0).

    Args:
        head_dim: features per head (D), a multiple of 32.

    Raises:
        ValueError: `head_dim` is not a multiple of 32.
    """

    def __init__(self, head_dim: int) -> None:
        _check_head_dim("q4_0", head_dim)
        self.centered = False
        self.components = (
            Component(packed_width(4, head_dim), mx.uint8),
            Component(head_dim // GROUP_SIZE, mx.float16),
        )

    def encode(self, x: mx.array) -> tuple[mx.array, ...]:
        N, H, D = x.shape
        groups = _groups(x)
        largest = mx.take_along_axis(
            groups, mx.argmax(mx.abs(groups), axis=-1, keepdims=True), axis=-1
        )
        scale = largest / -8.0
        codes = mx.minimum(mx.floor(groups * _inverse(scale) + 8.5), 15).astype(mx.uint8)
        return pack_bits(codes.reshape(N, H, D), 4), scale.squeeze(-1).astype(mx.float16)

    def decode(self, parts: Sequence[mx.array], dtype: mx.Dtype) -> mx.array:
        packed, scale = parts
        codes = unpack_bits(packed, 4)
        *lead, D = codes.shape
        steps = codes.reshape(*lead, D // GROUP_SIZE, GROUP_SIZE).astype(mx.float32) - 8.0
        return (steps * scale[..., None].astype(mx.float32)).reshape(*lead, D).astype(dtype)
