"""TurboQuant encoding as one Metal kernel (`mx.fast.metal_kernel`), optionally centering
keys on their row's first block: `turbo_encode_cuda`'s design in Metal, one SIMD group of
32 threads (one threadgroup) per head-vector, with SIMD-group shuffles and sums for the
warp's, and threadgroup barriers for its `__syncwarp`.

Untested on hardware: no Apple GPU was available when it was written. It was reviewed
line by line against `turbo_encode_cuda.py` and the plain-MLX encoder
(`TurboQuantCodec.encode`), and nothing dispatches to it.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from mlxcel_core.kernels.turbo_encode_cuda import (
    CENTERING_INPUTS,
    CODEC_INPUTS,
    OUTPUTS,
    FirstBlockCentering,
    TurboCodebook,
    launch_turbo_encode,
)

# Shared with the TurboQuant decode attention's Metal kernels.
HADAMARD_SIGN_HEADER = """
// Entry (p, i) of Sylvester's Hadamard matrix.
inline float hadamard_sign(int p, int i) {
  return (metal::popcount(p & i) & 1) ? -1.0f : 1.0f;
}
"""

_CENTERING = """
  if (write_centered[n]) {
    const int num_anchors = anchor_slots_shape[1];
    const device int32_t* anchors = anchor_slots + (size_t)write_rows[n] * num_anchors;
    for (int d = lane; d < D; d += 32) mean[d] = 0.0f;
    for (int a = 0; a < num_anchors; ++a) {
      const size_t anchor = (size_t)anchors[a] * num_heads + head;
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (int r = lane; r < D / 8; r += 32) {
        const device uint8_t* bytes = pool_codes + anchor * PACKED + r * BITS;
        for (int i = 0; i < 8; ++i) {
          int code = 0;
          for (int k = 0; k < BITS; ++k) code |= ((bytes[k] >> i) & 1) << k;
          work[r * 8 + i] = levels[code];
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
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
  }
"""

_SOURCE = """
  constexpr int PACKED = D * BITS / 8;
  constexpr int NUM_LEVELS = 1 << BITS;
  threadgroup float x[D];
  threadgroup float work[D];
  threadgroup float mean[D];
  threadgroup int codes[D];

  const size_t vec = threadgroup_position_in_grid.x;
  const int num_heads = vectors_shape[1];
  const size_t n = vec / num_heads;
  const int head = vec % num_heads;
  const int lane = thread_position_in_threadgroup.x;
  const float inv_sqrt_d = metal::rsqrt(static_cast<float>(D));

  for (int d = lane; d < D; d += 32) x[d] = static_cast<float>(vectors[vec * D + d]);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  CENTERING
  threadgroup_barrier(mem_flags::mem_threadgroup);

  int positions[OUTLIERS];
  float values[OUTLIERS];
  for (int j = 0; j < OUTLIERS; ++j) {
    float best = -1.0f;
    int best_d = D;
    for (int d = lane; d < D; d += 32) {
      bool taken = false;
      for (int k = 0; k < j; ++k) taken |= positions[k] == d;
      const float magnitude = metal::abs(x[d]);
      if (!taken && (magnitude > best || (magnitude == best && d < best_d))) {
        best = magnitude;
        best_d = d;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = simd_shuffle_xor(best, ushort(offset));
      const int other_d = simd_shuffle_xor(best_d, ushort(offset));
      if (other > best || (other == best && other_d < best_d)) {
        best = other;
        best_d = other_d;
      }
    }
    positions[j] = best_d;
    values[j] = x[best_d];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int d = lane; d < D; d += 32) {
    for (int j = 0; j < OUTLIERS; ++j) {
      if (positions[j] == d) x[d] = 0.0f;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  float energy = 0.0f;
  for (int d = lane; d < D; d += 32) energy += x[d] * x[d];
  const float norm = metal::sqrt(simd_sum(energy));
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
  const float quantized_norm = metal::sqrt(simd_sum(quantized_energy));
  threadgroup_barrier(mem_flags::mem_threadgroup);

  for (int index = lane; index < PACKED; index += 32) {
    const int run = index / BITS;
    const int plane = index % BITS;
    int byte = 0;
    for (int i = 0; i < 8; ++i) byte |= ((codes[run * 8 + i] >> plane) & 1) << i;
    packed[vec * PACKED + index] = static_cast<uint8_t>(byte);
  }
  if (lane == 0) {
    scales[vec] = static_cast<half>(norm / (quantized_norm > 0.0f ? quantized_norm : 1.0f));
    for (int j = 0; j < OUTLIERS; ++j) {
      outlier_positions[vec * OUTLIERS + j] = static_cast<P>(positions[j]);
      outlier_values[vec * OUTLIERS + j] = static_cast<half>(values[j]);
    }
  }
"""


@functools.cache
def _kernels() -> dict[bool, object]:
    return {
        centered: mx.fast.metal_kernel(
            name="mlxcel_turbo_encode_centered" if centered else "mlxcel_turbo_encode",
            input_names=CODEC_INPUTS + (CENTERING_INPUTS if centered else []),
            output_names=OUTPUTS,
            source=_SOURCE.replace("CENTERING", _CENTERING if centered else ""),
            header=HADAMARD_SIGN_HEADER,
        )
        for centered in (False, True)
    }


def turbo_encode_metal(
    vectors: mx.array,
    codebook: TurboCodebook,
    centering: FirstBlockCentering | None = None,
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """Encode head-vectors with TurboQuant on an Apple GPU.

    Arguments and result as `turbo_encode_cuda`: (N, H, D) float vectors, D a power of two
    from 8 to 256, give (N, H, D * bits / 8) uint8 packed codes, (N, H, 1) float16 scales,
    (N, H, outliers) positions in `codebook.position_dtype` and (N, H, outliers) float16
    outlier values. Untested on hardware.
    """
    return launch_turbo_encode(_kernels(), vectors, codebook, centering)
