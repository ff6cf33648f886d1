"""TurboQuant KV caches: a norm, a random rotation and a Lloyd-Max code per coordinate.

Zandieh, Daliri, Hadian and Mirrokni, "TurboQuant: Online Vector Quantization with
Near-optimal Distortion Rate" (2025, arXiv 2504.19874), the MSE-optimal variant
(TurboQuant_mse). Per key or value head-vector x of dimension D:

1. keep ||x|| (float16) and quantize u = x / ||x||, a unit vector;
2. rotate, y = u R with R a random orthogonal matrix (`rotation.hadamard_rotation`): the
   coordinates of y are then nearly independent and distributed as N(0, 1/D) whatever u was;
3. quantize each coordinate with the b-bit Lloyd-Max quantizer of N(0, 1/D)
   (`lloyd_max.gaussian_codebook`, scaled by 1/sqrt(D)) and pack the codes tightly.

Decoding looks the codes up, rotates back (y R^T) and multiplies by the stored scale.

One refinement over the paper's MSE variant: the stored scale is ||x|| / ||y_hat||, not
||x||, where y_hat is the quantized rotated vector. The decoded vector then has x's norm
exactly. A Lloyd-Max reconstruction is shorter than its input on average (each level is the
mean of its cell), which shrinks every attention score towards zero and flattens the
softmax; keeping the norm removes that shrinkage at no storage cost.

Not implemented: the paper's second stage (TurboQuant_prod), a 1-bit QJL sketch of the
residual that makes inner-product estimates unbiased; this is the MSE-optimal variant,
whose inner products are biased towards zero (the norm-keeping scale above removes the part
of that bias due to the reconstruction's length). The paper's codebook is for the exact
coordinate law of a rotated unit vector (a scaled Beta distribution); its Gaussian
limit is used here, which it approaches quickly for the head dims of real models (>= 64).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mlx.core as mx

from mlxcel_core.cache.quant.bitpack import pack_bits, packed_width, unpack_bits
from mlxcel_core.cache.quant.lloyd_max import gaussian_codebook
from mlxcel_core.cache.quant.protocol import Component
from mlxcel_core.cache.quant.rotation import hadamard_rotation, is_power_of_two

MIN_HEAD_DIM = 8


class TurboQuantCodec:
    """`bits`-bit TurboQuant (MSE variant) of head-vectors of dimension `head_dim`.

    Stores D * bits / 8 bytes of codes and a float16 norm per head-vector: 34 bytes for
    D = 64 at 4 bits, against 128 in float16.

    Args:
        head_dim: features per head (D), a power of two >= 8.
        bits: bits per coordinate, 1 to 8.

    Raises:
        ValueError: `head_dim` is not a power of two >= 8, or `bits` is outside [1, 8].
    """

    def __init__(self, head_dim: int, bits: int) -> None:
        if not is_power_of_two(head_dim) or head_dim < MIN_HEAD_DIM:
            raise ValueError(
                f"cache type turbo{bits} needs a head dim that is a power of two "
                f">= {MIN_HEAD_DIM}, got head_dim={head_dim}"
            )
        codebook = gaussian_codebook(bits)
        scale = 1.0 / math.sqrt(head_dim)
        self.bits = bits
        self.components = (
            Component(packed_width(bits, head_dim), mx.uint8),
            Component(1, mx.float16),
        )
        self._rotation = mx.array(hadamard_rotation(head_dim))
        self._inverse_rotation = self._rotation.T
        self._levels = mx.array(codebook.levels, dtype=mx.float32) * scale
        self._boundaries = mx.array(codebook.boundaries, dtype=mx.float32) * scale

    def encode(self, x: mx.array) -> tuple[mx.array, ...]:
        x = x.astype(mx.float32)
        norm = mx.sqrt(mx.sum(x * x, axis=-1, keepdims=True))
        unit = x / mx.where(norm > 0, norm, 1.0)
        # A dense (D, D) product: one operation, where the butterfly would take log2(D) stages.
        rotated = unit @ self._rotation
        codes = mx.sum(rotated[..., None] > self._boundaries, axis=-1).astype(mx.uint8)
        quantized = self._levels[codes]
        quantized_norm = mx.sqrt(mx.sum(quantized * quantized, axis=-1, keepdims=True))
        scale = norm / mx.where(quantized_norm > 0, quantized_norm, 1.0)
        return pack_bits(codes, self.bits), scale.astype(mx.float16)

    def decode(self, parts: Sequence[mx.array], dtype: mx.Dtype) -> mx.array:
        packed, norm = parts
        rotated = self._levels[unpack_bits(packed, self.bits)]
        return ((rotated @ self._inverse_rotation) * norm.astype(mx.float32)).astype(dtype)
