"""Paged decode attention over TurboQuant KV blocks as Metal kernels, read as stored:
`turbo_cuda.py`'s design in Metal (`mx.fast.metal_kernel`).

Scores and values are taken in rotated coordinates, outlier features enter as
corrections, and centered keys get back the mean of their row's anchor scores, as
`turbo_cuda.py` explains. One threadgroup of 4 SIMD groups of 32 threads serves a (row,
KV head) and partition, `D / 8` lanes per position with 8 rotated coordinates each; the
online softmax, the split-KV variant and the merge are `metal.py`'s.

Untested on hardware: no Apple GPU was available when it was written. It was reviewed
line by line against `turbo_cuda.py` and the decode-then-attend reference
(`PagedKVStorage.gather`, then attention), and nothing dispatches to it.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from mlxcel_core.kernels.paged_attention.metal import (
    BLOCK_SOURCE,
    STATE_MERGE_SOURCE,
    attention_kernels,
)
from mlxcel_core.kernels.paged_attention.turbo_cuda import (
    TurboPool,
    launch_turbo_decode,
    supports_turbo,
)
from mlxcel_core.kernels.turbo_encode_metal import HADAMARD_SIGN_HEADER

# Threadgroup memory a kernel may take on Apple GPUs (bytes).
MAX_THREADGROUP_BYTES = 32 * 1024

_HEADER = (
    HADAMARD_SIGN_HEADER
    + """
inline float lane_group_sum(float x, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) {
    x += simd_shuffle_xor(x, ushort(offset));
  }
  return x;
}

// The levels of a run of 8 codes packed bit plane by bit plane: byte k of the run holds
// bit k of each code, code i in bit i (`mlxcel_core.cache.quant.bitpack`).
template <int BITS>
inline void unpack_run(
    const device uint8_t* bytes, const threadgroup float* levels, thread float* y) {
  uint plane[BITS];
  for (int k = 0; k < BITS; ++k) plane[k] = bytes[k];
  for (int i = 0; i < 8; ++i) {
    int code = 0;
    for (int k = 0; k < BITS; ++k) code |= ((plane[k] >> i) & 1) << k;
    y[i] = levels[code];
  }
}

// The G scores of head-vector `vec`'s key, uncentered: this lane's VEC rotated coordinates
// of each query (q, G x VEC, prescaled) against the key's levels, summed over the position's
// lanes, plus each outlier's correction against the plain queries (G x D). Every lane of a
// position's group takes part (the sums shuffle), whether or not the position is read.
template <int G, int D, int VEC, int BITS, int OUTLIERS, typename T, typename S, typename P,
          typename O>
inline void key_scores(
    size_t vec,
    int sub,
    const device uint8_t* codes,
    const device S* scales,
    const device P* positions,
    const device O* outliers,
    const threadgroup float* level,
    const threadgroup float* rotation_row_sign,
    const thread float* q,
    const device T* plain_queries,
    float q_scale,
    thread float* score) {
  constexpr int LANES_PER_TOKEN = D / VEC;
  float y[VEC];
  unpack_run<BITS>(codes + vec * (D * BITS / 8) + sub * BITS, level, y);
  const float s = static_cast<float>(scales[vec]);
  for (int g = 0; g < G; ++g) {
    float partial = 0.0f;
    for (int i = 0; i < VEC; ++i) partial += q[g * VEC + i] * y[i];
    score[g] = s * lane_group_sum(partial, LANES_PER_TOKEN);
  }
  for (int j = 0; j < OUTLIERS; ++j) {
    const int p = metal::min(static_cast<int>(positions[vec * OUTLIERS + j]), D - 1);
    float partial = 0.0f;
    for (int i = 0; i < VEC; ++i) partial += y[i] * hadamard_sign(p, sub * VEC + i);
    const float rest = s * rotation_row_sign[p] * lane_group_sum(partial, LANES_PER_TOKEN);
    const float delta = static_cast<float>(outliers[vec * OUTLIERS + j]) - rest;
    for (int g = 0; g < G; ++g) {
      score[g] += static_cast<float>(plain_queries[g * D + p]) * q_scale * delta;
    }
  }
}
"""
)

_TURBO_SOURCE = (
    BLOCK_SOURCE
    + """
  constexpr int VALUE_BYTES = D * VALUE_BITS / 8;

  threadgroup float rotation_row_sign[D];
  threadgroup float key_level[1 << KEY_BITS];
  threadgroup float value_level[1 << VALUE_BITS];
  threadgroup float anchor_score[G];

  // R[p, i] = rotation_row_sign[p] * hadamard_sign(p, i).
  for (int i = tid; i < D; i += THREADS) {
    rotation_row_sign[i] = signs[i] * metal::rsqrt(static_cast<float>(D));
  }
  for (int i = tid; i < (1 << KEY_BITS); i += THREADS) key_level[i] = key_levels[i];
  for (int i = tid; i < (1 << VALUE_BITS); i += THREADS) {
    value_level[i] = value_levels[i];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // Scores are kept in base 2: q is prescaled by scale * log2(e) so exp2 gives the softmax.
  const float q_scale = as_type<float>(SCALE_BITS) * 1.4426950408889634f;
  const size_t first_head = (size_t)row * num_q_heads + kv_head * G;
  float q[G][VEC];
  for (int g = 0; g < G; ++g) {
    for (int i = 0; i < VEC; ++i) {
      q[g][i] = rotated_queries[(first_head + g) * D + sub * VEC + i] * q_scale;
    }
  }
  const device T* plain_queries = queries + first_head * D;

  const device int32_t* table = block_tables + (size_t)row * table_width;

  // q . m for the row's first-block mean m: the mean of its anchor positions' scores,
  // needed only where this partition reads positions past the first block.
  float anchor[G];
  for (int g = 0; g < G; ++g) anchor[g] = 0.0f;
  if (end > BLOCK_SIZE && begin < end) {
    float total[G];
    for (int g = 0; g < G; ++g) total[g] = 0.0f;
    for (int base = ANCHOR_BEGIN + warp * TOKENS_PER_WARP; base < BLOCK_SIZE; base += STATES) {
      const int t = base + token_lane;
      const bool valid = t < BLOCK_SIZE;
      const size_t slot = valid ? (size_t)table[0] * BLOCK_SIZE + t : 0;
      float score[G];
      key_scores<G, D, VEC, KEY_BITS, OUTLIERS>(
          slot * num_kv_heads + kv_head, sub, key_codes, key_scales, key_positions,
          key_outliers, key_level, rotation_row_sign, &q[0][0], plain_queries, q_scale, score);
      for (int g = 0; g < G; ++g) total[g] += valid ? score[g] : 0.0f;
    }
    for (int g = 0; g < G; ++g) {
      if (sub == 0) shared_max[state * G + g] = total[g];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid < G) {
      float sum = 0.0f;
      for (int s = 0; s < STATES; ++s) sum += shared_max[s * G + tid];
      anchor_score[tid] = sum / (BLOCK_SIZE - ANCHOR_BEGIN);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int g = 0; g < G; ++g) anchor[g] = anchor_score[g];
  }

  float running_max[G];
  float running_sum[G];
  float acc[G][VEC];
  for (int g = 0; g < G; ++g) {
    running_max[g] = -INFINITY;
    running_sum[g] = 0.0f;
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.0f;
  }

  for (int base = begin + warp * TOKENS_PER_WARP; base < end; base += STATES) {
    const int t = base + token_lane;
    const bool valid = t < end;
    const size_t slot = valid ? (size_t)table[t / BLOCK_SIZE] * BLOCK_SIZE + t % BLOCK_SIZE : 0;
    const size_t vec = slot * num_kv_heads + kv_head;
    float score[G];
    key_scores<G, D, VEC, KEY_BITS, OUTLIERS>(
        vec, sub, key_codes, key_scales, key_positions, key_outliers, key_level,
        rotation_row_sign, &q[0][0], plain_queries, q_scale, score);

    // The value in rotated coordinates, its outlier features folded in.
    float w[VEC];
    {
      float y[VEC];
      unpack_run<VALUE_BITS>(value_codes + vec * VALUE_BYTES + sub * VALUE_BITS, value_level, y);
      const float s = static_cast<float>(value_scales[vec]);
      for (int i = 0; i < VEC; ++i) w[i] = s * y[i];
      for (int j = 0; j < OUTLIERS; ++j) {
        const int p = metal::min(static_cast<int>(value_positions[vec * OUTLIERS + j]), D - 1);
        float partial = 0.0f;
        for (int i = 0; i < VEC; ++i) partial += y[i] * hadamard_sign(p, sub * VEC + i);
        const float rest = s * rotation_row_sign[p] * lane_group_sum(partial, LANES_PER_TOKEN);
        const float delta = static_cast<float>(value_outliers[vec * OUTLIERS + j]) - rest;
        for (int i = 0; i < VEC; ++i) {
          w[i] += delta * rotation_row_sign[p] * hadamard_sign(p, sub * VEC + i);
        }
      }
    }
    if (!valid) continue;
    const float shift = t >= BLOCK_SIZE ? 1.0f : 0.0f;
    for (int g = 0; g < G; ++g) {
      const float x = score[g] + shift * anchor[g];
      const float new_max = metal::max(running_max[g], x);
      const float correction = metal::exp2(running_max[g] - new_max);
      const float p = metal::exp2(x - new_max);
      running_sum[g] = running_sum[g] * correction + p;
      for (int i = 0; i < VEC; ++i) acc[g][i] = acc[g][i] * correction + p * w[i];
      running_max[g] = new_max;
    }
  }
"""
    + STATE_MERGE_SOURCE
)

# The one-pass kernel writes the rotated output in float32; it is rotated back after.
_ROTATED_STORE = "output[head * D + d] = normalized;"

_INPUTS = [
    "queries",
    "rotated_queries",
    "key_codes",
    "key_scales",
    "key_positions",
    "key_outliers",
    "value_codes",
    "value_scales",
    "value_positions",
    "value_outliers",
    "signs",
    "key_levels",
    "value_levels",
    "block_tables",
    "context_lengths",
]


@functools.cache
def _kernels() -> dict[str, object]:
    return attention_kernels(
        "mlxcel_turbo_paged_decode", _INPUTS, _TURBO_SOURCE, _HEADER, _ROTATED_STORE
    )


def supports_turbo_metal(
    group_size: int, key_dim: int, value_dim: int, key_bits: int, value_bits: int
) -> bool:
    """Whether the Metal kernels take this layer: as `supports_turbo`, within the 32 KiB of
    threadgroup memory of Apple GPUs (so fewer group sizes than on CUDA at head dim 128)."""
    return supports_turbo(
        group_size,
        key_dim,
        value_dim,
        key_bits,
        value_bits,
        max_shared_bytes=MAX_THREADGROUP_BYTES,
    )


def turbo_decode_attention_metal(
    queries: mx.array,
    keys: TurboPool,
    values: TurboPool,
    rotation: mx.array,
    signs: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    block_size: int,
    scale: float,
    num_partitions: int | None = None,
) -> mx.array:
    """Decode attention read straight from TurboQuant pools with centered keys, on an Apple
    GPU, for a layer `supports_turbo_metal` takes. Untested on hardware.

    Arguments, result and errors as `turbo_decode_attention_cuda`: (B, H_q, 1, D) queries
    give (B, H_q, 1, D) in their dtype.
    """
    return launch_turbo_decode(
        _kernels,
        queries,
        keys,
        values,
        rotation,
        signs,
        block_tables,
        context_lengths,
        block_size=block_size,
        scale=scale,
        num_partitions=num_partitions,
    )
