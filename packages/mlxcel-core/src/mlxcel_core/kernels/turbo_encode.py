"""TurboQuant encoding as one kernel source for CUDA and Metal, optionally centering keys
on their row's first block: what `TurboQuantCodec.encode` computes
(`mlxcel_core.cache.quant.turbo`), in one launch where the plain-MLX encoder takes some
thirty.

One warp (on Metal, a SIMD group of 32 threads making up the threadgroup) encodes one
head-vector x of D features:
1. with centering, subtract m, the mean of the row's anchor keys as the pool stores them,
   each decoded in the warp (codebook lookup, the inverse rotation, its outliers written
   back);
2. set aside the `OUTLIERS` features of largest magnitude (ties to the lower position),
   zero them, and take the norm of the rest r;
3. rotate r / ||r|| by R = diag(signs) H / sqrt(D), forming R's entries from the signs and
   the parity of p & i (Sylvester's H);
4. code each rotated coordinate by the boundaries it exceeds, and store the scale
   ||r|| / ||levels[codes]||, the codes packed bit plane by bit plane, and the outliers.

The codes can differ from the plain-MLX encoder's where a coordinate lies within rounding
of a boundary (its rotation is a float32 product, which CUDA may run in TF32); either
decodes with the same error bound.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.kernels.backend import Backend
from mlxcel_core.kernels.options import kernel_backend

# Shared with the TurboQuant decode attention's kernels.
HADAMARD_SIGN = """
// Entry (p, i) of Sylvester's Hadamard matrix.
$inline float hadamard_sign(int p, int i) {
  return ($popcount(p & i) & 1) ? -1.0f : 1.0f;
}
"""

# CUDA's sum over a warp; Metal has `simd_sum`.
_CUDA_WARP_SUM = """
__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffff, x, offset);
  return x;
}
"""

_CENTERING = """if (write_centered[n]) {
  const int num_anchors = anchor_slots_shape[1];
  const ${device}int* anchors = anchor_slots + (size_t)write_rows[n] * num_anchors;
  for (int d = lane; d < D; d += 32) mean[d] = 0.0f;
  for (int a = 0; a < num_anchors; ++a) {
    const size_t anchor = (size_t)anchors[a] * num_heads + head;
    $warp_barrier
    for (int r = lane; r < D / 8; r += 32) {
      const ${device}uint8_t* bytes = pool_codes + anchor * PACKED + r * BITS;
      for (int i = 0; i < 8; ++i) {
        int code = 0;
        for (int k = 0; k < BITS; ++k) code |= ((bytes[k] >> i) & 1) << k;
        work[r * 8 + i] = levels[code];
      }
    }
    $warp_barrier
    const float s = static_cast<float>(pool_scales[anchor]);
    for (int d = lane; d < D; d += 32) {
      float rest = 0.0f;
      for (int i = 0; i < D; ++i) rest += work[i] * hadamard_sign(d, i);
      float value = s * signs[d] * inv_sqrt_d * rest;
      for (int j = 0; j < OUTLIERS; ++j) {
        if (static_cast<int>(pool_positions[anchor * OUTLIERS + j]) == d) {
          value = static_cast<float>(pool_outliers[anchor * OUTLIERS + j]);
        }
      }
      mean[d] += value / num_anchors;
    }
  }
  for (int d = lane; d < D; d += 32) x[d] -= mean[d];
}"""

SOURCE = """
  constexpr int PACKED = D * BITS / 8;
  constexpr int NUM_LEVELS = 1 << BITS;
  $shared float x[D];
  $shared float work[D];
  $shared float mean[D];
  $shared int codes[D];

  const size_t vec = $block.x;
  const int num_heads = vectors_shape[1];
  const size_t n = vec / num_heads;
  const int head = vec % num_heads;
  const int lane = $thread_x;
  const float inv_sqrt_d = $rsqrt(static_cast<float>(D));

  for (int d = lane; d < D; d += 32) x[d] = static_cast<float>(vectors[vec * D + d]);
  $warp_barrier
  $centering
  $warp_barrier

  int positions[OUTLIERS];
  float values[OUTLIERS];
  for (int j = 0; j < OUTLIERS; ++j) {
    float best = -1.0f;
    int best_d = D;
    for (int d = lane; d < D; d += 32) {
      bool taken = false;
      for (int k = 0; k < j; ++k) taken |= positions[k] == d;
      const float magnitude = $abs(x[d]);
      if (!taken && (magnitude > best || (magnitude == best && d < best_d))) {
        best = magnitude;
        best_d = d;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = $shuffle_xor(best, offset);
      const int other_d = $shuffle_xor(best_d, offset);
      if (other > best || (other == best && other_d < best_d)) {
        best = other;
        best_d = other_d;
      }
    }
    positions[j] = best_d;
    values[j] = x[best_d];
  }
  $warp_barrier
  for (int d = lane; d < D; d += 32) {
    for (int j = 0; j < OUTLIERS; ++j) {
      if (positions[j] == d) x[d] = 0.0f;
    }
  }
  $warp_barrier

  float energy = 0.0f;
  for (int d = lane; d < D; d += 32) energy += x[d] * x[d];
  const float norm = $sqrt($warp_sum(energy));
  const float unit = norm > 0.0f ? 1.0f / norm : 1.0f;

  float quantized_energy = 0.0f;
  for (int i = lane; i < D; i += 32) {
    float rotated = 0.0f;
    for (int p = 0; p < D; ++p) rotated += x[p] * signs[p] * hadamard_sign(p, i);
    rotated *= unit * inv_sqrt_d;
    int code = 0;
    for (int b = 0; b < NUM_LEVELS - 1; ++b) code += rotated > boundaries[b];
    codes[i] = code;
    quantized_energy += levels[code] * levels[code];
  }
  const float quantized_norm = $sqrt($warp_sum(quantized_energy));
  $warp_barrier

  for (int index = lane; index < PACKED; index += 32) {
    const int run = index / BITS;
    const int plane = index % BITS;
    int byte = 0;
    for (int i = 0; i < 8; ++i) byte |= ((codes[run * 8 + i] >> plane) & 1) << i;
    packed[vec * PACKED + index] = static_cast<uint8_t>(byte);
  }
  if (lane == 0) {
    scales[vec] = static_cast<$half>(norm / (quantized_norm > 0.0f ? quantized_norm : 1.0f));
    for (int j = 0; j < OUTLIERS; ++j) {
      outlier_positions[vec * OUTLIERS + j] = static_cast<P>(positions[j]);
      outlier_values[vec * OUTLIERS + j] = static_cast<$half>(values[j]);
    }
  }
"""

CODEC_INPUTS = ["vectors", "signs", "boundaries", "levels"]
CENTERING_INPUTS = [
    "pool_codes",
    "pool_scales",
    "pool_positions",
    "pool_outliers",
    "anchor_slots",
    "write_rows",
    "write_centered",
]
OUTPUTS = ["packed", "scales", "outlier_positions", "outlier_values"]


# Head dims whose vectors one warp encodes with D floats of shared memory per array.
HEAD_DIMS = (8, 16, 32, 64, 128, 256)


def turbo_encode_backend(device: mx.Device, head_dim: int) -> Backend | None:
    """The backend whose `turbo_encode_kernel` encodes head-vectors of `head_dim` on
    `device` (`kernel_backend`'s, for a head dim of `HEAD_DIMS`), or None where the
    plain-MLX encoder runs."""
    return kernel_backend(device) if head_dim in HEAD_DIMS else None


@functools.cache
def kernels(backend: Backend) -> dict[bool, object]:
    """The encoders on `backend`, keyed by whether they center, built once."""
    header = backend.either(cuda=_CUDA_WARP_SUM, metal="") + backend.render(HADAMARD_SIGN)
    warp_sum = backend.either(cuda="warp_sum", metal="simd_sum")
    return {
        centered: backend.build_kernel(
            name="mlxcel_turbo_encode_centered" if centered else "mlxcel_turbo_encode",
            input_names=CODEC_INPUTS + (CENTERING_INPUTS if centered else []),
            output_names=OUTPUTS,
            source=backend.render(
                SOURCE, centering=_CENTERING if centered else "", warp_sum=warp_sum
            ),
            header=header,
        )
        for centered in (False, True)
    }


@dataclass(frozen=True)
class TurboCodebook:
    """What encoding with one TurboQuant codec needs.

    Attributes:
        signs: (D,) float32 random signs of the rotation R.
        boundaries: (2**bits - 1,) float32 ascending decision boundaries.
        levels: (2**bits,) float32 reconstruction levels.
        bits: bits per code.
        outliers: outlier features per head-vector.
        position_dtype: uint8 or uint16, the dtype outlier positions are stored in.
    """

    signs: mx.array
    boundaries: mx.array
    levels: mx.array
    bits: int
    outliers: int
    position_dtype: mx.Dtype


@dataclass(frozen=True)
class FirstBlockCentering:
    """Where each encoded key's row stores the keys it is centered on.

    Attributes:
        pool: the key pool's (slots, H, width) arrays, in the codec's component order
            (packed codes, scales, outlier positions, outlier values).
        anchor_slots: (B, A) int32 slots of each row's anchor positions.
        write_rows: (N,) int32 row of each encoded vector.
        write_centered: (N,) bool, which vectors to center (the rest are encoded as they
            are).
    """

    pool: tuple[mx.array, ...]
    anchor_slots: mx.array
    write_rows: mx.array
    write_centered: mx.array


def turbo_encode_kernel(
    vectors: mx.array,
    codebook: TurboCodebook,
    centering: FirstBlockCentering | None = None,
    *,
    backend: Backend,
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """Encode head-vectors with TurboQuant by `backend`'s kernel: one 32-thread block per
    head-vector.

    Args:
        vectors: (N, H, D) float keys or values; D one of `HEAD_DIMS`.
        codebook: the codec's rotation signs, codebook and outlier count.
        centering: center the vectors it marks on their row's first-block mean; None
            encodes every vector as it is.
        backend: `CUDA` or `METAL`, the default device's GPU backend.

    Returns:
        (N, H, D * bits / 8) uint8 packed codes, (N, H, 1) float16 scales,
        (N, H, outliers) outlier positions in `codebook.position_dtype` and
        (N, H, outliers) float16 outlier values: `TurboQuantCodec.encode`'s components.
    """
    N, H, D = vectors.shape
    inputs = [vectors, codebook.signs, codebook.boundaries, codebook.levels]
    if centering is not None:
        inputs += [
            *centering.pool,
            centering.anchor_slots.astype(mx.int32),
            centering.write_rows.astype(mx.int32),
            centering.write_centered,
        ]
    outliers = codebook.outliers
    encoders: Mapping[bool, object] = kernels(backend)
    return tuple(
        encoders[centering is not None](
            inputs=inputs,
            template=[
                ("D", D),
                ("BITS", codebook.bits),
                ("OUTLIERS", outliers),
                ("P", codebook.position_dtype),
            ],
            grid=(N * H * 32, 1, 1),
            threadgroup=(32, 1, 1),
            output_shapes=[
                (N, H, D * codebook.bits // 8),
                (N, H, 1),
                (N, H, outliers),
                (N, H, outliers),
            ],
            output_dtypes=[mx.uint8, mx.float16, codebook.position_dtype, mx.float16],
        )
    )
