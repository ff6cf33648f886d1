"""The quantized matrix-vector product as a Metal kernel (`mx.fast.metal_kernel`): the
CUDA kernel's design in Metal, one threadgroup per `ROWS` outputs, its threads walking the
weight rows' 16-byte chunks, SIMD-group sums and threadgroup memory for the reduction.

Untested on hardware: no Apple GPU was available when it was written. It was reviewed
line by line against `cuda.py` and run on CPU threads through the tests' Metal stand-in;
nothing dispatches to it.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from mlxcel_core.kernels.quantized_matvec.cuda import (
    INPUTS,
    ROWS_PER_BLOCK,
    launch_quantized_matvec,
)

SOURCE = """
  constexpr int PACK = 32 / BITS;
  constexpr int CHUNK = 4 * PACK;
  constexpr int STEP = 8;
  constexpr int WARPS = THREADS / 32;
  constexpr uint LEVEL_MASK = (1u << BITS) - 1u;
  threadgroup float partial[WARPS * ROWS * M];

  const int N = weight_shape[0];
  const int K = x_shape[1];
  const int chunks = K / CHUNK;
  const int groups = K / GROUP;
  const int first = threadgroup_position_in_grid.x * ROWS;
  const int tid = thread_position_in_threadgroup.x;

  float acc[ROWS][M];
  for (int r = 0; r < ROWS; ++r) {
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  }

  for (int c = tid; c < chunks; c += THREADS) {
    const int g = c * CHUNK / GROUP;
    uint words[ROWS][4];
    float scale[ROWS];
    float bias[ROWS];
    for (int r = 0; r < ROWS; ++r) {
      // The last threadgroup's rows past N read row N - 1; their sums are never stored.
      const size_t n = metal::min(first + r, N - 1);
      for (int j = 0; j < 4; ++j) words[r][j] = weight[(n * chunks + c) * 4 + j];
      scale[r] = static_cast<float>(scales[n * groups + g]);
      bias[r] = static_cast<float>(biases[n * groups + g]);
    }
    for (int s = 0; s < CHUNK / STEP; ++s) {
      float w[ROWS][STEP];
      for (int r = 0; r < ROWS; ++r) {
        for (int i = 0; i < STEP; ++i) {
          const int v = s * STEP + i;
          const uint q = (words[r][v / PACK] >> ((v % PACK) * BITS)) & LEVEL_MASK;
          w[r][i] = metal::fma(scale[r], static_cast<float>(q), bias[r]);
        }
      }
      for (int m = 0; m < M; ++m) {
        const size_t offset = (size_t)m * K + c * CHUNK + s * STEP;
        float xv[STEP];
        for (int i = 0; i < STEP; ++i) xv[i] = static_cast<float>(x[offset + i]);
        for (int r = 0; r < ROWS; ++r) {
          for (int i = 0; i < STEP; ++i) acc[r][m] = metal::fma(xv[i], w[r][i], acc[r][m]);
        }
      }
    }
  }

  const int warp = tid / 32;
  const int lane = tid % 32;
  for (int r = 0; r < ROWS; ++r) {
    for (int m = 0; m < M; ++m) {
      const float total = simd_sum(acc[r][m]);
      if (lane == 0) partial[warp * ROWS * M + r * M + m] = total;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int idx = tid; idx < ROWS * M; idx += THREADS) {
    const int n = first + idx / M;
    const int m = idx % M;
    if (n < N) {
      float total = 0.0f;
      for (int k = 0; k < WARPS; ++k) total += partial[k * ROWS * M + idx];
      y[(size_t)m * N + n] = static_cast<T>(total);
    }
  }
"""


@functools.cache
def _kernel() -> object:
    return mx.fast.metal_kernel(
        name="mlxcel_quantized_matvec",
        input_names=INPUTS,
        output_names=["y"],
        source=SOURCE,
    )


def quantized_matvec_metal(
    x: mx.array,
    weight: mx.array,
    scales: mx.array,
    biases: mx.array,
    *,
    group_size: int,
    bits: int,
    rows_per_block: int = ROWS_PER_BLOCK,
) -> mx.array:
    """`x @ W.T` for an affine-quantized W, on an Apple GPU.

    Arguments, result and errors as `quantized_matvec_cuda`. Untested on hardware.
    """
    return launch_quantized_matvec(
        _kernel,
        x,
        weight,
        scales,
        biases,
        group_size=group_size,
        bits=bits,
        rows_per_block=rows_per_block,
    )
