"""Gumbel-max sampling as one kernel source for CUDA and Metal.

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

import mlx.core as mx

from mlxcel_core.kernels.backend import Backend
from mlxcel_core.kernels.gumbel_sampling.reference import check_arguments

# Threads per block: enough to cover a 128k vocabulary in 32 groups per thread when a
# single row is drawn, the common batch of one.
THREADS = 1024

HEADER = """
$inline uint4 philox4x32_10(uint4 c, uint2 k) {
  $unroll
  for (int r = 0; r < 10; ++r) {
    const unsigned int hi0 = $mulhi(0xD2511F53u, c.x);
    const unsigned int lo0 = 0xD2511F53u * c.x;
    const unsigned int hi1 = $mulhi(0xCD9E8D57u, c.z);
    const unsigned int lo1 = 0xCD9E8D57u * c.z;
    c = $make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += 0x9E3779B9u;
    k.y += 0xBB67AE85u;
  }
  return c;
}

// The Gumbel noise of one Philox word: u = (top 24 bits | 1) * 2^-24, exact in float32.
$inline float gumbel_noise(unsigned int bits) {
  const float u = static_cast<float>((bits >> 8) | 1u) * 5.9604644775390625e-8f;
  return -$log(-$log(u));
}

$inline void keep_best(${thread}float& best, ${thread}int& best_token, float score, int token) {
  if (score > best || (score == best && token < best_token)) {
    best = score;
    best_token = token;
  }
}

$inline void warp_best(${thread}float& best, ${thread}int& best_token) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = $shuffle_xor(best, offset);
    const int other_token = $shuffle_xor(best_token, offset);
    keep_best(best, best_token, other, other_token);
  }
}
"""

SOURCE = """
  constexpr int WARPS = THREADS / 32;
  $shared float shared_best[WARPS];
  $shared int shared_token[WARPS];

  const int row = $block.x;
  const int vocab_size = logits_shape[1];
  const ${device}T* row_logits = logits + (size_t)row * vocab_size;
  const float temperature = temperatures[row];
  const uint2 key = $make_uint2(seeds[2 * row], seeds[2 * row + 1]);
  const float neg_inf = $negative_infinity;

  // A row of all -inf keeps (-inf, 0): token 0, as the reference's argmax gives.
  float best = neg_inf;
  int best_token = 0;
  for (int group = $thread_x; group * 4 < vocab_size; group += THREADS) {
    const int first = group * 4;
    float x[4];
    bool any_finite = false;
    $unroll
    for (int i = 0; i < 4; ++i) {
      x[i] = first + i < vocab_size ? static_cast<float>(row_logits[first + i]) : neg_inf;
      any_finite |= x[i] != neg_inf;
    }
    if (!any_finite) continue;
    const uint4 bits = philox4x32_10($counter, key);
    const unsigned int words[4] = {bits.x, bits.y, bits.z, bits.w};
    $unroll
    for (int i = 0; i < 4; ++i) {
      if (x[i] == neg_inf) continue;
      keep_best(best, best_token, x[i] / temperature + gumbel_noise(words[i]), first + i);
    }
  }

  const int warp = $thread_x / 32;
  const int lane = $thread_x % 32;
  warp_best(best, best_token);
  if (lane == 0) {
    shared_best[warp] = best;
    shared_token[warp] = best_token;
  }
  $barrier
  if (warp == 0) {
    best = lane < WARPS ? shared_best[lane] : neg_inf;
    best_token = lane < WARPS ? shared_token[lane] : 0;
    warp_best(best, best_token);
    if (lane == 0) tokens[row] = best_token;
  }
"""


@functools.cache
def kernel(backend: Backend) -> object:
    """The kernel on `backend`, built once."""
    source = backend.render(
        SOURCE,
        negative_infinity=backend.either(
            cuda="-cuda::std::numeric_limits<float>::infinity()", metal="-INFINITY"
        ),
        counter=backend.either(
            cuda="make_uint4(group, 0u, 0u, 0u)", metal="uint4(uint(group), 0u, 0u, 0u)"
        ),
    )
    return backend.build_kernel(
        name="mlxcel_gumbel_max_sample",
        input_names=["logits", "temperatures", "seeds"],
        output_names=["tokens"],
        source=source,
        header=backend.render(HEADER),
    )


def gumbel_max_sample_kernel(
    logits: mx.array, temperatures: mx.array, seeds: mx.array, *, backend: Backend
) -> mx.array:
    """Gumbel-max draw of one token per row by `backend`'s kernel, one block per row.

    Arguments, result and errors as `gumbel_max_sample_reference`, whose token it picks
    except on float near-ties of the two best scores; `backend` is `CUDA` or `METAL`, the
    default device's GPU backend.
    """
    check_arguments(logits, temperatures, seeds)
    B = logits.shape[0]
    (tokens,) = kernel(backend)(
        inputs=[logits, temperatures, seeds],
        template=[("T", logits.dtype), ("THREADS", THREADS)],
        grid=(B * THREADS, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(B,)],
        output_dtypes=[mx.int32],
    )
    return tokens
