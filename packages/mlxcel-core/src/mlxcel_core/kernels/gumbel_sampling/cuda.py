"""Gumbel-max sampling as one CUDA kernel (`mx.fast.cuda_kernel`).

One thread block draws one row. Each thread takes groups of 4 consecutive tokens: it
reads their logits (each logit read once), and unless all 4 are -inf, runs one
Philox-4x32-10 call at counter (group, 0, 0, 0) under the row's key for their 4 uniforms,
scores each token logit / T - log(-log(u)), and keeps its best (score, token). The block
then reduces those pairs, warp by warp with shuffles and across warps in shared memory;
ties go to the lower token, as `mx.argmax` breaks them. Where MLX's categorical draw takes
several launches over (B, V) (random bits, two logs, an add, an argmax), this is one.

The uniforms are the reference's bit for bit (`philox.token_uniforms`); only the float
logarithms and division may round differently, so the kernel picks the reference's token
except where two scores lie within rounding of each other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import mlx.core as mx

from mlxcel_core.kernels.gumbel_sampling.reference import check_arguments

# Threads per block: enough to cover a 128k vocabulary in 32 groups per thread when a
# single row is drawn, the common batch of one.
THREADS = 1024

HEADER = """
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
  #pragma unroll
  for (int r = 0; r < 10; ++r) {
    const unsigned int hi0 = __umulhi(0xD2511F53u, c.x);
    const unsigned int lo0 = 0xD2511F53u * c.x;
    const unsigned int hi1 = __umulhi(0xCD9E8D57u, c.z);
    const unsigned int lo1 = 0xCD9E8D57u * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += 0x9E3779B9u;
    k.y += 0xBB67AE85u;
  }
  return c;
}

// The Gumbel noise of one Philox word: u = (top 24 bits | 1) * 2^-24, exact in float32.
__device__ __forceinline__ float gumbel_noise(unsigned int bits) {
  const float u = static_cast<float>((bits >> 8) | 1u) * 5.9604644775390625e-8f;
  return -logf(-logf(u));
}

__device__ __forceinline__ void keep_best(float& best, int& best_token, float score, int token) {
  if (score > best || (score == best && token < best_token)) {
    best = score;
    best_token = token;
  }
}

__device__ __forceinline__ void warp_best(float& best, int& best_token) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffff, best, offset);
    const int other_token = __shfl_xor_sync(0xffffffff, best_token, offset);
    keep_best(best, best_token, other, other_token);
  }
}
"""

SOURCE = """
  constexpr int WARPS = THREADS / 32;
  __shared__ float shared_best[WARPS];
  __shared__ int shared_token[WARPS];

  const int row = blockIdx.x;
  const int vocab_size = logits_shape[1];
  const T* row_logits = logits + (size_t)row * vocab_size;
  const float temperature = temperatures[row];
  const uint2 key = make_uint2(seeds[2 * row], seeds[2 * row + 1]);
  const float neg_inf = -cuda::std::numeric_limits<float>::infinity();

  // A row of all -inf keeps (-inf, 0): token 0, as the reference's argmax gives.
  float best = neg_inf;
  int best_token = 0;
  for (int group = threadIdx.x; group * 4 < vocab_size; group += THREADS) {
    const int first = group * 4;
    float x[4];
    bool any_finite = false;
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[i] = first + i < vocab_size ? static_cast<float>(row_logits[first + i]) : neg_inf;
      any_finite |= x[i] != neg_inf;
    }
    if (!any_finite) continue;
    const uint4 bits = philox4x32_10(make_uint4(group, 0u, 0u, 0u), key);
    const unsigned int words[4] = {bits.x, bits.y, bits.z, bits.w};
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (x[i] == neg_inf) continue;
      keep_best(best, best_token, x[i] / temperature + gumbel_noise(words[i]), first + i);
    }
  }

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  warp_best(best, best_token);
  if (lane == 0) {
    shared_best[warp] = best;
    shared_token[warp] = best_token;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < WARPS ? shared_best[lane] : neg_inf;
    best_token = lane < WARPS ? shared_token[lane] : 0;
    warp_best(best, best_token);
    if (lane == 0) tokens[row] = best_token;
  }
"""


@functools.cache
def _kernel() -> object:
    return mx.fast.cuda_kernel(
        name="mlxcel_gumbel_max_sample",
        input_names=["logits", "temperatures", "seeds"],
        output_names=["tokens"],
        source=SOURCE,
        header=HEADER,
    )


def gumbel_max_sample_cuda(logits: mx.array, temperatures: mx.array, seeds: mx.array) -> mx.array:
    """Gumbel-max draw of one token per row, on a CUDA device.

    Arguments, result and errors as `gumbel_max_sample_reference`, whose token it picks
    except on float near-ties of the two best scores.
    """
    return launch_gumbel_max(_kernel, logits, temperatures, seeds)


def launch_gumbel_max(
    kernel: Callable[[], object], logits: mx.array, temperatures: mx.array, seeds: mx.array
) -> mx.array:
    """Check the arguments, then launch the kernel `kernel` builds (the CUDA one or the
    Metal one, which take the same inputs, template and grid) with one block per row.

    Raises:
        ValueError: as `check_arguments`.
    """
    check_arguments(logits, temperatures, seeds)
    B = logits.shape[0]
    (tokens,) = kernel()(
        inputs=[logits, temperatures, seeds],
        template=[("T", logits.dtype), ("THREADS", THREADS)],
        grid=(B * THREADS, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(B,)],
        output_dtypes=[mx.int32],
    )
    return tokens
