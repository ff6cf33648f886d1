"""TurboQuant KV caches: outlier features kept, then a norm, a random rotation and a
Lloyd-Max code per coordinate.

Zandieh, Daliri, Hadian and Mirrokni, "TurboQuant: Online Vector Quantization with
Near-optimal Distortion Rate" (2025, arXiv 2504.19874), the MSE-optimal variant
(TurboQuant_mse), with an outlier treatment. Per key or value head-vector x of dimension D:

1. set aside its k = max(1, D / 64) features of largest magnitude ("outliers"): their
   positions (uint8, uint16 for D > 256) and values (float16) are stored as they are, and
   they are zeroed in x, leaving the rest r;
2. quantize u = r / ||r||, a unit vector: rotate, y = u R with R a random orthogonal matrix
   (`rotation.hadamard_rotation`), whose coordinates are then nearly independent and
   distributed as N(0, 1/D) whatever u was;
3. quantize each coordinate with the b-bit Lloyd-Max quantizer of N(0, 1/D)
   (`lloyd_max.gaussian_codebook`, scaled by 1/sqrt(D)) and pack the codes tightly.

Decoding looks the codes up, rotates back (y R^T), multiplies by the stored scale and
writes the outliers back over their positions.

Why the outliers: the paper treats outlier channels apart, with more bits (its KV cache
experiments). Real keys concentrate much of their norm in a few features (SmolLM2's keys:
the largest of 64 carries 35% of the energy on average), and TurboQuant's error is a fixed
fraction of the norm it quantizes, so taking the largest features out shrinks the error of
everything else. They are chosen per vector rather than as fixed channels per layer and
head, so encoding needs no statistics gathered from earlier tokens, and any vector, block
or prefix decodes alike wherever it is stored.

The codec is marked `centered`: in the paged cache, a row's keys past its first block are
encoded as k - m, with m that block's stored mean per head (its first position left out),
and m is added back on decoding (`mlxcel_core.cache.paged.centering`). Real keys share a
large common part per head (SmolLM2's mean key holds a median 63% of its head's key
energy), which the softmax does not see but the norm-relative error above does; centering
is exact, whatever m is.

One refinement over the paper's MSE variant: the stored scale is ||r|| / ||y_hat||, not
||r||, where y_hat is the quantized rotated vector. The decoded rest then has r's norm
exactly. A Lloyd-Max reconstruction is shorter than its input on average (each level is the
mean of its cell), which shrinks every attention score towards zero and flattens the
softmax; keeping the norm removes that shrinkage at no storage cost.

Not implemented: the paper's second stage (TurboQuant_prod), a 1-bit QJL sketch of the
residual that makes inner-product estimates unbiased: at equal bits (b - 1 MSE bits and
the sketch against b MSE bits) its variance more than doubled the attention error on
SmolLM2's keys (docs/benchmarks.md). The paper's codebook is for the exact coordinate law of
a rotated unit vector (a scaled Beta distribution); its Gaussian limit is used here, which
it approaches quickly for the head dims of real models (>= 64).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mlx.core as mx

from mlxcel_core.cache.quant.bitpack import pack_bits, packed_width, unpack_bits
from mlxcel_core.cache.quant.lloyd_max import gaussian_codebook
from mlxcel_core.cache.quant.protocol import Component
from mlxcel_core.cache.quant.rotation import hadamard_rotation, is_power_of_two, rotation_signs
from mlxcel_core.kernels.turbo_encode import (
    TurboCodebook,
    turbo_encode_backend,
    turbo_encode_kernel,
)

MIN_HEAD_DIM = 8
# One outlier feature per 64 keeps turbo4 under 0.3x float16's bytes at D = 64 and 128.
FEATURES_PER_OUTLIER = 64
_UINT8_POSITIONS = 256


def outlier_count(head_dim: int) -> int:
    """Features per head-vector that TurboQuant stores apart: max(1, D / 64)."""
    return max(1, head_dim // FEATURES_PER_OUTLIER)


class TurboQuantCodec:
    """`bits`-bit TurboQuant (MSE variant, outlier features kept) of head-vectors of
    dimension `head_dim`.

    Stores D * bits / 8 bytes of codes, a float16 scale, and per outlier feature its
    position (one byte, two for D > 256) and float16 value: 37 bytes for D = 64 at 4 bits
    (one outlier), against 128 in float16.

    Args:
        head_dim: features per head (D), a power of two >= 8.
        bits: bits per coordinate, 1 to 8.

    Attributes (what a kernel reading or writing the codes needs):
        rotation: (D, D) float32 R, `rotation.hadamard_rotation`.
        codebook: R's random signs (`rotation.rotation_signs`), the scaled Lloyd-Max
            boundaries and levels of a rotated coordinate, the bits, the outlier count and
            the positions' dtype; `signs`, `levels` and `outliers` read it. `encode` hands
            it to `turbo_encode_kernel` where `turbo_encode_backend` names a backend.

    Raises:
        ValueError: `head_dim` is not a power of two >= 8, or `bits` is outside [1, 8].
    """

    def __init__(self, head_dim: int, bits: int) -> None:
        if not is_power_of_two(head_dim) or head_dim < MIN_HEAD_DIM:
            raise ValueError(
                f"cache type turbo{bits} needs a head dim that is a power of two "
                f">= {MIN_HEAD_DIM}, got head_dim={head_dim}"
            )
        lloyd_max = gaussian_codebook(bits)
        scale = 1.0 / math.sqrt(head_dim)
        outliers = outlier_count(head_dim)
        position_dtype = mx.uint8 if head_dim <= _UINT8_POSITIONS else mx.uint16
        self.bits = bits
        self.head_dim = head_dim
        self.centered = True
        self.components = (
            Component(packed_width(bits, head_dim), mx.uint8),
            Component(1, mx.float16),
            Component(outliers, position_dtype),
            Component(outliers, mx.float16),
        )
        self.rotation = mx.array(hadamard_rotation(head_dim))
        self.codebook = TurboCodebook(
            signs=mx.array(rotation_signs(head_dim)),
            boundaries=mx.array(lloyd_max.boundaries, dtype=mx.float32) * scale,
            levels=mx.array(lloyd_max.levels, dtype=mx.float32) * scale,
            bits=bits,
            outliers=outliers,
            position_dtype=position_dtype,
        )
        # Compiled, the ~30 small operations of each run as a few fused kernels: a decode
        # step encodes one position per row and layer, where launches cost the most.
        self._encode = mx.compile(self._encode_float32)
        self._decode = mx.compile(self._decode_float32)

    @property
    def outliers(self) -> int:
        return self.codebook.outliers

    @property
    def levels(self) -> mx.array:
        return self.codebook.levels

    @property
    def signs(self) -> mx.array:
        return self.codebook.signs

    def encode(self, x: mx.array) -> tuple[mx.array, ...]:
        backend = turbo_encode_backend(mx.default_device(), self.head_dim)
        if backend is not None:
            return turbo_encode_kernel(x, self.codebook, backend=backend)
        return self._encode(x.astype(mx.float32))

    def decode(self, parts: Sequence[mx.array], dtype: mx.Dtype) -> mx.array:
        return self._decode(*parts).astype(dtype)

    def _encode_float32(self, x: mx.array) -> tuple[mx.array, ...]:
        positions = mx.argpartition(-mx.abs(x), kth=self.outliers - 1, axis=-1)
        positions = positions[..., : self.outliers]
        outliers = mx.take_along_axis(x, positions, axis=-1)
        rest = mx.put_along_axis(x, positions, mx.array(0.0), axis=-1)
        norm = mx.sqrt(mx.sum(rest * rest, axis=-1, keepdims=True))
        unit = rest / mx.where(norm > 0, norm, 1.0)
        # A dense (D, D) product: one operation, where the butterfly would take log2(D) stages.
        rotated = unit @ self.rotation
        codes = mx.sum(rotated[..., None] > self.codebook.boundaries, axis=-1).astype(mx.uint8)
        quantized = self.levels[codes]
        quantized_norm = mx.sqrt(mx.sum(quantized * quantized, axis=-1, keepdims=True))
        scale = norm / mx.where(quantized_norm > 0, quantized_norm, 1.0)
        return (
            pack_bits(codes, self.bits),
            scale.astype(mx.float16),
            positions.astype(self.components[2].dtype),
            outliers.astype(mx.float16),
        )

    def _decode_float32(
        self, packed: mx.array, scale: mx.array, positions: mx.array, outliers: mx.array
    ) -> mx.array:
        rotated = self.levels[unpack_bits(packed, self.bits)]
        rest = (rotated @ self.rotation.T) * scale.astype(mx.float32)
        return mx.put_along_axis(
            rest, positions.astype(mx.int32), outliers.astype(mx.float32), axis=-1
        )
