"""Gumbel-max sampling as a Metal kernel (`mx.fast.metal_kernel`), the CUDA kernel's
design in Metal: one threadgroup of 1024 threads per row, one Philox-4x32-10 call per
4 tokens, and a reduction of (score, token) pairs by SIMD-group shuffles and threadgroup
memory.

Untested on hardware: no Apple GPU was available when it was written. It was reviewed
line by line against `cuda.py` and the reference, and nothing dispatches to it.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from mlxcel_core.kernels.gumbel_sampling.cuda import launch_gumbel_max

HEADER = """
inline uint4 philox4x32_10(uint4 c, uint2 k) {
  for (int r = 0; r < 10; ++r) {
    const uint hi0 = mulhi(0xD2511F53u, c.x);
    const uint lo0 = 0xD2511F53u * c.x;
    const uint hi1 = mulhi(0xCD9E8D57u, c.z);
    const uint lo1 = 0xCD9E8D57u * c.z;
    c = uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += 0x9E3779B9u;
    k.y += 0xBB67AE85u;
  }
  return c;
}

// The Gumbel noise of one Philox word: u = (top 24 bits | 1) * 2^-24, exact in float32.
inline float gumbel_noise(uint bits) {
  const float u = static_cast<float>((bits >> 8) | 1u) * 5.9604644775390625e-8f;
  return -metal::precise::log(-metal::precise::log(u));
}

inline void keep_best(thread float& best, thread int& best_token, float score, int token) {
  if (score > best || (score == best && token < best_token)) {
    best = score;
    best_token = token;
  }
}

inline void simd_best(thread float& best, thread int& best_token) {
  for (ushort offset = 16; offset > 0; offset /= 2) {
    const float other = simd_shuffle_xor(best, offset);
    const int other_token = simd_shuffle_xor(best_token, offset);
    keep_best(best, best_token, other, other_token);
  }
}
"""

SOURCE = """
  constexpr int WARPS = THREADS / 32;
  threadgroup float shared_best[WARPS];
  threadgroup int shared_token[WARPS];

  const int row = threadgroup_position_in_grid.x;
  const int tid = thread_position_in_threadgroup.x;
  const int vocab_size = logits_shape[1];
  const size_t row_offset = (size_t)row * vocab_size;
  const float temperature = temperatures[row];
  const uint2 key = uint2(seeds[2 * row], seeds[2 * row + 1]);

  // A row of all -inf keeps (-inf, 0): token 0, as the reference's argmax gives.
  float best = -INFINITY;
  int best_token = 0;
  for (int group = tid; group * 4 < vocab_size; group += THREADS) {
    const int first = group * 4;
    float x[4];
    bool any_finite = false;
    for (int i = 0; i < 4; ++i) {
      const int token = first + i;
      x[i] = token < vocab_size ? static_cast<float>(logits[row_offset + token]) : -INFINITY;
      any_finite |= x[i] != -INFINITY;
    }
    if (!any_finite) continue;
    const uint4 bits = philox4x32_10(uint4(uint(group), 0u, 0u, 0u), key);
    for (int i = 0; i < 4; ++i) {
      if (x[i] == -INFINITY) continue;
      keep_best(best, best_token, x[i] / temperature + gumbel_noise(bits[i]), first + i);
    }
  }

  const int warp = tid / 32;
  const int lane = tid % 32;
  simd_best(best, best_token);
  if (lane == 0) {
    shared_best[warp] = best;
    shared_token[warp] = best_token;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (warp == 0) {
    best = lane < WARPS ? shared_best[lane] : -INFINITY;
    best_token = lane < WARPS ? shared_token[lane] : 0;
    simd_best(best, best_token);
    if (lane == 0) tokens[row] = best_token;
  }
"""


@functools.cache
def _kernel() -> object:
    return mx.fast.metal_kernel(
        name="mlxcel_gumbel_max_sample",
        input_names=["logits", "temperatures", "seeds"],
        output_names=["tokens"],
        source=SOURCE,
        header=HEADER,
    )


def gumbel_max_sample_metal(logits: mx.array, temperatures: mx.array, seeds: mx.array) -> mx.array:
    """Gumbel-max draw of one token per row, on an Apple GPU; untested on hardware.

    Arguments, result and errors as `gumbel_max_sample_reference`.
    """
    return launch_gumbel_max(_kernel, logits, temperatures, seeds)
