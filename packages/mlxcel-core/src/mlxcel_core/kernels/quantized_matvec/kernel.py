"""The product of a few rows of activations with an affine-quantized weight, as one kernel
source for CUDA and Metal that reads each packed weight once and keeps loads in flight.

Decode multiplies 1-8 rows of activations by every weight of the model, so its cost is the
weight bytes read, and a GEMV reaches the card's bandwidth only with enough bytes in flight
per SM and few instructions per weight (the design of llama.cpp's `mul_mat_vec_q` and of
MLX's own `qmv`: a warp per output row, lanes striding 16-byte loads along it, a warp
shuffle reduction). Here:

- One warp computes `ROWS` consecutive outputs (rows of W) for all M rows of x, with no
  block barrier: the block's `WARPS` warps are independent. Lane l takes the 16-byte chunks
  (32 levels at 4 bits, 16 at 8) l, l + 32, ... of each of its weight rows, so each load
  instruction of the warp reads 512 contiguous bytes, and every chunk is read once.
- A step is `UNROLL` chunks of each of the warp's rows: `UNROLL * ROWS` 16-byte loads per
  lane, issued together, with their scales and biases. The loads of step s + 1 are issued
  before step s is computed (a software pipeline in registers), so a warp always has a
  step in flight. Weights are loaded with the streaming hint (evict first) on CUDA, so
  that x, which every warp of an SM reads, stays in L1.
- A chunk lies in one quantization group, so sum_i (s q_i + b) x_i = s * sum_i q_i x_i +
  b * sum_i x_i: the scale and bias apply once per chunk, not per level. A level is made a
  float without shifting it down: `level << (BITS * p)` masked in place, under the
  exponent bits of 2^23, minus 2^23, is the exact float q * 2^(BITS * p); the products with
  x are summed per position p and scaled by 2^-(BITS * p) (exact) once per chunk. A level
  costs one logic operation, one add and one multiply-add per row of x.
- float32 sums per (output, row of x), reduced by warp shuffles (Metal's `simd_sum`); one
  rounding to the output dtype.

MLX's affine layout (`mx.quantize`): W (N, K) is stored as (N, K * bits / 32) uint32, level
j of a word in bits [j * bits, (j + 1) * bits), with per-group scales and biases (N, K /
group_size): w = scale * level + bias.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.kernels.backend import Backend

# Rows of activations the kernel takes: decode batches. More rows are matrix work.
MAX_ROWS = 8
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
FLOAT_DTYPES = (mx.float16, mx.bfloat16, mx.float32)


@dataclass(frozen=True)
class MatvecTactic:
    """How the kernel spreads a product over the GPU.

    Attributes:
        rows_per_warp: outputs (rows of W) each warp computes; each 16-byte chunk of x
            read feeds this many rows.
        warps_per_block: independent warps of a thread block.
        unroll: chunks of each output row a lane loads per step; a lane has
            `unroll * rows_per_warp` 16-byte loads in flight, and as many again for the
            next step.

    Raises:
        ValueError: a field below 1, or more than 32 warps (1,024 threads) a block.
    """

    rows_per_warp: int = 2
    warps_per_block: int = 4
    unroll: int = 2

    def __post_init__(self) -> None:
        for name in ("rows_per_warp", "warps_per_block", "unroll"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warps_per_block > 32:
            raise ValueError(f"warps_per_block must be <= 32, got {self.warps_per_block}")


def default_tactic(num_rows: int) -> MatvecTactic:
    """The tactic for `num_rows` rows of x, from registers and bytes in flight.

    Two outputs a warp halve the work on x (loads, conversions, sums) per weight, and with
    two chunks a row per step a lane keeps 64 bytes in flight and 64 more issued: at 16
    warps an SM (what ~120 registers a thread leave resident), about 32 KiB an SM, beyond
    the ~20 KiB an H100 SM needs to cover DRAM latency at full bandwidth (2.9 TB/s over 132
    SMs, ~1 µs). The per-position sums cost 5 registers per (output, row of x), so past
    4 rows of x a warp takes one output to stay near that register budget.
    """
    if num_rows <= 4:
        return MatvecTactic(rows_per_warp=2, warps_per_block=4, unroll=2)
    return MatvecTactic(rows_per_warp=1, warps_per_block=4, unroll=2)


HEADER = """
__device__ __forceinline__ float qmv_warp_sum(float x) {
  #pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffff, x, offset);
  return x;
}

__device__ __forceinline__ unsigned qmv_word(const uint4& chunk, int i) {
  return i == 0 ? chunk.x : i == 1 ? chunk.y : i == 2 ? chunk.z : chunk.w;
}

// COUNT values of x from p (16- or 8-byte aligned), as floats, in 16- or 8-byte loads.
template <typename T, int COUNT>
__device__ __forceinline__ void qmv_load_x(const T* p, float* out) {
  constexpr int BYTES = COUNT * sizeof(T);
  if constexpr (BYTES % 16 == 0) {
    constexpr int PER_LOAD = 16 / sizeof(T);
    #pragma unroll
    for (int l = 0; l < BYTES / 16; ++l) {
      const uint4 loaded = reinterpret_cast<const uint4*>(p)[l];
      const T* values = reinterpret_cast<const T*>(&loaded);
      #pragma unroll
      for (int i = 0; i < PER_LOAD; ++i) out[l * PER_LOAD + i] = static_cast<float>(values[i]);
    }
  } else {
    const uint2 loaded = *reinterpret_cast<const uint2*>(p);
    const T* values = reinterpret_cast<const T*>(&loaded);
    #pragma unroll
    for (int i = 0; i < COUNT; ++i) out[i] = static_cast<float>(values[i]);
  }
}
"""

SOURCE = """
  constexpr int PACK = 32 / BITS;
  constexpr int CHUNK = 4 * PACK;
  // Levels 0 .. LOW - 1 of a word lie below bit 23 where they are; the others are read
  // from the word shifted right by HIGH_SHIFT, at positions PACK - LOW and up.
  constexpr int LOW = 23 / BITS;
  constexpr int HIGH_SHIFT = (PACK - LOW) * BITS;
  constexpr unsigned LEVEL_MASK = (1u << BITS) - 1u;
  constexpr unsigned FLOAT_2_23 = 0x4B000000u;
  constexpr int STEP_CHUNKS = 32 * UNROLL;

  const int N = weight_shape[0];
  const int K = x_shape[1];
  const int chunks = K / CHUNK;
  const int groups = K / GROUP;
  const int steps = (chunks + STEP_CHUNKS - 1) / STEP_CHUNKS;
  const int lane = $thread_x % 32;
  const int first = ($block.x * WARPS + $thread_x / 32) * ROWS;
  if (first >= N) {
    return;
  }
  $weight_chunks

  $chunk_registers(cur)
  $chunk_registers(next)
  S cur_scale[UNROLL][ROWS];
  S cur_bias[UNROLL][ROWS];
  S next_scale[UNROLL][ROWS];
  S next_bias[UNROLL][ROWS];
  $unroll
  for (int u = 0; u < UNROLL; ++u) {
    $unroll
    for (int r = 0; r < ROWS; ++r) {
      $zero_chunk(next[u][r]);
      next_scale[u][r] = static_cast<S>(0.0f);
      next_bias[u][r] = static_cast<S>(0.0f);
    }
  }
  float acc[ROWS][M];
  $unroll
  for (int r = 0; r < ROWS; ++r) {
    $unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  }

  // Iteration s issues step s's loads, then computes step s - 1 from the registers the
  // previous iteration loaded.
  for (int s = 0; s <= steps; ++s) {
    $unroll
    for (int u = 0; u < UNROLL; ++u) {
      $unroll
      for (int r = 0; r < ROWS; ++r) {
        $copy_chunk(cur[u][r], next[u][r]);
        cur_scale[u][r] = next_scale[u][r];
        cur_bias[u][r] = next_bias[u][r];
      }
    }
    if (s < steps) {
      $unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int c = s * STEP_CHUNKS + u * 32 + lane;
        if (c < chunks) {
          const int g = c * CHUNK / GROUP;
          $unroll
          for (int r = 0; r < ROWS; ++r) {
            // A warp's rows past N read row N - 1; their sums are never stored.
            const size_t n = $min(first + r, N - 1);
            $load_chunk(next[u][r], n, c);
            next_scale[u][r] = scales[n * groups + g];
            next_bias[u][r] = biases[n * groups + g];
          }
        }
      }
    }
    if (s == 0) {
      continue;
    }
    $unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = (s - 1) * STEP_CHUNKS + u * 32 + lane;
      if (c >= chunks) {
        continue;
      }
      // dot[r][m][p]: the chunk's sum of (level << BITS * p) * x over the levels at
      // position p; x_sum[m]: the chunk's sum of x.
      float dot[ROWS][M][LOW];
      float x_sum[M];
      $unroll
      for (int m = 0; m < M; ++m) {
        x_sum[m] = 0.0f;
        $unroll
        for (int r = 0; r < ROWS; ++r) {
          $unroll
          for (int p = 0; p < LOW; ++p) dot[r][m][p] = 0.0f;
        }
      }
      $unroll
      for (int i = 0; i < 4; ++i) {
        float level[ROWS][PACK];
        $unroll
        for (int r = 0; r < ROWS; ++r) {
          const unsigned word = $chunk_word(cur[u][r], i);
          const unsigned high = word >> HIGH_SHIFT;
          $unroll
          for (int j = 0; j < PACK; ++j) {
            const int p = j < LOW ? j : j - (PACK - LOW);
            const unsigned source = j < LOW ? word : high;
            const unsigned bits = (source & (LEVEL_MASK << (BITS * p))) | FLOAT_2_23;
            level[r][j] = $as_float((int)bits) - 8388608.0f;
          }
        }
        $unroll
        for (int m = 0; m < M; ++m) {
          float xv[PACK];
          $load_x((size_t)m * K + c * CHUNK + i * PACK, xv);
          $unroll
          for (int j = 0; j < PACK; ++j) {
            const int p = j < LOW ? j : j - (PACK - LOW);
            x_sum[m] += xv[j];
            $unroll
            for (int r = 0; r < ROWS; ++r) dot[r][m][p] = $fma(level[r][j], xv[j], dot[r][m][p]);
          }
        }
      }
      $unroll
      for (int r = 0; r < ROWS; ++r) {
        const float scale = static_cast<float>(cur_scale[u][r]);
        const float bias = static_cast<float>(cur_bias[u][r]);
        $unroll
        for (int m = 0; m < M; ++m) {
          float total = 0.0f;
          $unroll
          for (int p = 0; p < LOW; ++p) {
            total = $fma(dot[r][m][p], 1.0f / (float)(1u << (BITS * p)), total);
          }
          acc[r][m] = $fma(scale, total, $fma(bias, x_sum[m], acc[r][m]));
        }
      }
    }
  }

  $unroll
  for (int r = 0; r < ROWS; ++r) {
    $unroll
    for (int m = 0; m < M; ++m) {
      const float total = $warp_sum(acc[r][m]);
      if (lane == 0 && first + r < N) y[(size_t)m * N + first + r] = static_cast<T>(total);
    }
  }
"""

_CUDA_FRAGMENTS = {
    "weight_chunks": "const uint4* weight_chunks = reinterpret_cast<const uint4*>(weight);",
    "chunk_registers": "uint4 {0}[UNROLL][ROWS];",
    "zero_chunk": "{0} = make_uint4(0u, 0u, 0u, 0u)",
    "copy_chunk": "{0} = {1}",
    "load_chunk": "{0} = __ldcs(weight_chunks + {1} * chunks + {2})",
    "chunk_word": "qmv_word({0}, {1})",
    "load_x": "qmv_load_x<T, PACK>(x + {0}, {1})",
    "warp_sum": "qmv_warp_sum",
}
_METAL_FRAGMENTS = {
    "weight_chunks": "",
    "chunk_registers": "uint {0}[UNROLL][ROWS][4];",
    "zero_chunk": "for (int w = 0; w < 4; ++w) {0}[w] = 0u",
    "copy_chunk": "for (int w = 0; w < 4; ++w) {0}[w] = {1}[w]",
    "load_chunk": "for (int w = 0; w < 4; ++w) {0}[w] = weight[({1} * chunks + {2}) * 4 + w]",
    "chunk_word": "{0}[{1}]",
    "load_x": "for (int v = 0; v < PACK; ++v) {1}[v] = static_cast<float>(x[{0} + v])",
    "warp_sum": "simd_sum",
}

INPUTS = ["x", "weight", "scales", "biases"]


@functools.cache
def kernel(backend: Backend) -> object:
    """The kernel on `backend`, built once."""
    return backend.build_kernel(
        name="mlxcel_quantized_matvec",
        input_names=INPUTS,
        output_names=["y"],
        source=backend.render(
            SOURCE, **backend.either(cuda=_CUDA_FRAGMENTS, metal=_METAL_FRAGMENTS)
        ),
        header=backend.either(cuda=HEADER, metal=""),
    )


def supports(dtype: mx.Dtype, bits: int, group_size: int, num_rows: int) -> bool:
    """Whether the kernel takes activations of `dtype` and `num_rows` rows against a
    weight quantized with `bits` and `group_size`."""
    return (
        dtype in FLOAT_DTYPES
        and bits in BITS
        and group_size in GROUP_SIZES
        and 1 <= num_rows <= MAX_ROWS
    )


def check_arguments(
    x: mx.array,
    weight: mx.array,
    scales: mx.array,
    biases: mx.array,
    *,
    group_size: int,
    bits: int,
) -> None:
    """Raise `ValueError` for arguments the kernels do not take: a layout `supports`
    refuses, too many rows, or shapes that disagree."""
    num_rows = x.size // x.shape[-1]
    if not supports(x.dtype, bits, group_size, num_rows):
        raise ValueError(
            f"the quantized matvec kernel takes {MAX_ROWS} rows or fewer of float16, bfloat16 "
            f"or float32 against {BITS}-bit weights in groups of {GROUP_SIZES}; got {num_rows} "
            f"rows of {x.dtype}, bits {bits}, group_size {group_size}"
        )
    if weight.dtype != mx.uint32 or weight.ndim != 2:
        raise ValueError(f"weight must be 2-D uint32, got {weight.ndim}-D {weight.dtype}")
    N, packed = weight.shape
    K = x.shape[-1]
    if packed * 32 != K * bits:
        raise ValueError(f"x has {K} features but weight packs {packed * 32 // bits}")
    groups = (N, K // group_size)
    if scales.shape != groups or biases.shape != groups:
        raise ValueError(
            f"scales and biases must be {groups}, got {scales.shape} and {biases.shape}"
        )
    if scales.dtype != biases.dtype:
        raise ValueError(
            f"scales and biases must share a dtype, got {scales.dtype} and {biases.dtype}"
        )


def quantized_matvec_kernel(
    x: mx.array,
    weight: mx.array,
    scales: mx.array,
    biases: mx.array,
    *,
    group_size: int,
    bits: int,
    backend: Backend,
    tactic: MatvecTactic | None = None,
) -> mx.array:
    """`x @ W.T` for a weight W in MLX's affine quantization, by `backend`'s kernel.

    Args:
        x: (..., K) activations, float16, bfloat16 or float32, at most `MAX_ROWS` rows
            (all leading axes together).
        weight: (N, K * bits / 32) uint32 packed levels.
        scales: (N, K / group_size) per-group scales, any float dtype.
        biases: (N, K / group_size) per-group offsets, the dtype of `scales`.
        group_size: 32, 64 or 128.
        bits: 4 or 8.
        backend: `CUDA` or `METAL`, the default device's GPU backend.
        tactic: how the work is spread; `default_tactic` of the rows when None.

    Returns:
        (..., N) in x's dtype; sums are accumulated in float32.

    Raises:
        ValueError: as `check_arguments`.
    """
    check_arguments(x, weight, scales, biases, group_size=group_size, bits=bits)
    K = x.shape[-1]
    N = weight.shape[0]
    M = x.size // K
    tactic = tactic or default_tactic(M)
    outputs_per_block = tactic.rows_per_warp * tactic.warps_per_block
    threads = 32 * tactic.warps_per_block
    (y,) = kernel(backend)(
        inputs=[x.reshape(M, K), weight, scales, biases],
        template=[
            ("T", x.dtype),
            ("S", scales.dtype),
            ("BITS", bits),
            ("GROUP", group_size),
            ("M", M),
            ("ROWS", tactic.rows_per_warp),
            ("WARPS", tactic.warps_per_block),
            ("UNROLL", tactic.unroll),
        ],
        grid=(-(-N // outputs_per_block) * threads, 1, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[(M, N)],
        output_dtypes=[x.dtype],
    )
    return y.reshape(*x.shape[:-1], N)
