"""The product of a few rows of activations with an affine-quantized weight, as one kernel
source for CUDA and Metal that reads each packed weight once.

Decode multiplies 1-8 rows of activations by every weight of the model, so its cost is the
weight bytes read: a 4-bit weight should take a quarter of the time of its bf16 copy. One
thread block computes `ROWS` consecutive outputs (rows of W) for all M rows of x. Its
threads walk the weight rows' 16-byte chunks (32 levels at 4 bits, 16 at 8), thread t
taking chunks t, t + THREADS, ..., so each warp loads 512 contiguous bytes of a row at once
and every chunk of W is read by exactly one thread. A chunk lies within one quantization
group (group sizes are multiples of the chunk), so its scale and bias are loaded once into
registers and each level is dequantized with one multiply-add, once, for all M rows. x is
read 8 values (16 bytes of a 16-bit dtype) at a time and shared by the block's `ROWS`
outputs; it stays in L1 across the blocks of an SM. Each thread accumulates (ROWS, M)
float sums; warp shuffles (Metal's `simd_sum`), then shared memory across warps, reduce
them. On CUDA a thread loads its weight chunk and 8 values of x as 16-byte vectors; on
Metal it loads them word by word and value by value.

MLX's affine layout (`mx.quantize`): W (N, K) is stored as (N, K * bits / 32) uint32, level
j of a word in bits [j * bits, (j + 1) * bits), with per-group scales and biases (N, K /
group_size): w = scale * level + bias.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from mlxcel_core.kernels.backend import Backend

# Rows of activations the kernel takes: decode batches. More rows are matrix work.
MAX_ROWS = 8
# Outputs per thread block, and the most threads a block has.
ROWS_PER_BLOCK = 4
MAX_THREADS = 128
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
FLOAT_DTYPES = (mx.float16, mx.bfloat16, mx.float32)
# Bytes of one weight load: a chunk of a weight row.
CHUNK_BYTES = 16

HEADER = """
// The float value of a level q < 2^23: q under 2^23's exponent bits, minus 2^23 (exact).
__device__ __forceinline__ float qmv_level_value(unsigned q) {
  return __uint_as_float(0x4B000000u | q) - 8388608.0f;
}

__device__ __forceinline__ float qmv_warp_sum(float x) {
  #pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffff, x, offset);
  return x;
}
"""

SOURCE = """
  constexpr int PACK = 32 / BITS;
  constexpr int CHUNK = 4 * PACK;
  constexpr int STEP = 8;
  $x_load_sizes
  constexpr int WARPS = THREADS / 32;
  constexpr unsigned LEVEL_MASK = (1u << BITS) - 1u;
  $shared float partial[WARPS][ROWS * M];

  const int N = weight_shape[0];
  const int K = x_shape[1];
  const int chunks = K / CHUNK;
  const int groups = K / GROUP;
  const int first = $block.x * ROWS;
  $weight_chunks

  float acc[ROWS][M];
  $unroll
  for (int r = 0; r < ROWS; ++r) {
    $unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  }

  for (int c = $thread_x; c < chunks; c += THREADS) {
    const int g = c * CHUNK / GROUP;
    $weight_registers
    float scale[ROWS];
    float bias[ROWS];
    // Every load of the chunk is issued before any level is used.
    $unroll
    for (int r = 0; r < ROWS; ++r) {
      // The last block's rows past N read row N - 1; their sums are never stored.
      const size_t n = $min(first + r, N - 1);
      $load_weight_chunk
      scale[r] = static_cast<float>(scales[n * groups + g]);
      bias[r] = static_cast<float>(biases[n * groups + g]);
    }
    $unroll
    for (int s = 0; s < CHUNK / STEP; ++s) {
      float w[ROWS][STEP];
      $unroll
      for (int r = 0; r < ROWS; ++r) {
        $row_words
        $unroll
        for (int i = 0; i < STEP; ++i) {
          const int v = s * STEP + i;
          const unsigned q = (words[v / PACK] >> ((v % PACK) * BITS)) & LEVEL_MASK;
          w[r][i] = $fma(scale[r], $level_value(q), bias[r]);
        }
      }
      $unroll
      for (int m = 0; m < M; ++m) {
        $load_x
        $unroll
        for (int r = 0; r < ROWS; ++r) {
          $unroll
          for (int i = 0; i < STEP; ++i) acc[r][m] = $fma(xv[i], w[r][i], acc[r][m]);
        }
      }
    }
  }

  const int warp = $thread_x / 32;
  const int lane = $thread_x % 32;
  $unroll
  for (int r = 0; r < ROWS; ++r) {
    $unroll
    for (int m = 0; m < M; ++m) {
      const float total = $warp_sum(acc[r][m]);
      if (lane == 0) partial[warp][r * M + m] = total;
    }
  }
  $barrier
  for (int idx = $thread_x; idx < ROWS * M; idx += THREADS) {
    const int n = first + idx / M;
    const int m = idx % M;
    if (n < N) {
      float total = 0.0f;
      $unroll
      for (int k = 0; k < WARPS; ++k) total += partial[k][idx];
      y[(size_t)m * N + n] = static_cast<T>(total);
    }
  }
"""

_CUDA_FRAGMENTS = {
    "x_load_sizes": (
        "constexpr int X_PER_LOAD = 16 / sizeof(T);\nconstexpr int X_LOADS = STEP / X_PER_LOAD;"
    ),
    "weight_chunks": "const uint4* weight_chunks = reinterpret_cast<const uint4*>(weight);",
    "weight_registers": "uint4 raw[ROWS];",
    "load_weight_chunk": "raw[r] = weight_chunks[n * chunks + c];",
    "row_words": "const unsigned words[4] = {raw[r].x, raw[r].y, raw[r].z, raw[r].w};",
    "load_x": """const uint4* x_loads =
    reinterpret_cast<const uint4*>(x + (size_t)m * K + c * CHUNK + s * STEP);
float xv[STEP];
#pragma unroll
for (int l = 0; l < X_LOADS; ++l) {
  const uint4 loaded = x_loads[l];
  const T* values = reinterpret_cast<const T*>(&loaded);
  #pragma unroll
  for (int i = 0; i < X_PER_LOAD; ++i) {
    xv[l * X_PER_LOAD + i] = static_cast<float>(values[i]);
  }
}""",
    "level_value": "qmv_level_value",
    "warp_sum": "qmv_warp_sum",
}
_METAL_FRAGMENTS = {
    "x_load_sizes": "",
    "weight_chunks": "",
    "weight_registers": "uint raw[ROWS][4];",
    "load_weight_chunk": (
        "for (int j = 0; j < 4; ++j) raw[r][j] = weight[(n * chunks + c) * 4 + j];"
    ),
    "row_words": "const thread uint* words = raw[r];",
    "load_x": """const size_t offset = (size_t)m * K + c * CHUNK + s * STEP;
float xv[STEP];
for (int i = 0; i < STEP; ++i) xv[i] = static_cast<float>(x[offset + i]);""",
    "level_value": "static_cast<float>",
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


def threads_for(input_dims: int, bits: int) -> int:
    """Threads per block: one per 16-byte chunk of a weight row, in whole warps, at most
    `MAX_THREADS`, so that short rows leave no thread idle."""
    chunks = input_dims * bits // (8 * CHUNK_BYTES)
    return max(32, min(MAX_THREADS, 32 * -(-chunks // 32)))


def check_arguments(
    x: mx.array,
    weight: mx.array,
    scales: mx.array,
    biases: mx.array,
    *,
    group_size: int,
    bits: int,
    rows_per_block: int,
    threads: int | None = None,
) -> None:
    """Raise `ValueError` for arguments the kernels do not take: a layout `supports`
    refuses, too many rows, shapes that disagree, `rows_per_block` < 1, or `threads` not
    a whole number of warps up to `MAX_THREADS`."""
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
    if rows_per_block < 1:
        raise ValueError(f"rows_per_block must be >= 1, got {rows_per_block}")
    if threads is not None and (threads % 32 or not 32 <= threads <= MAX_THREADS):
        raise ValueError(f"threads must be a multiple of 32 up to {MAX_THREADS}, got {threads}")


def quantized_matvec_kernel(
    x: mx.array,
    weight: mx.array,
    scales: mx.array,
    biases: mx.array,
    *,
    group_size: int,
    bits: int,
    backend: Backend,
    rows_per_block: int = ROWS_PER_BLOCK,
    threads: int | None = None,
) -> mx.array:
    """`x @ W.T` for a weight W in MLX's affine quantization, by `backend`'s kernel: one
    block of `threads` threads per `rows_per_block` outputs.

    Args:
        x: (..., K) activations, float16, bfloat16 or float32, at most `MAX_ROWS` rows
            (all leading axes together).
        weight: (N, K * bits / 32) uint32 packed levels.
        scales: (N, K / group_size) per-group scales, any float dtype.
        biases: (N, K / group_size) per-group offsets, as `scales`.
        group_size: 32, 64 or 128.
        bits: 4 or 8.
        backend: `CUDA` or `METAL`, the default device's GPU backend.
        rows_per_block: outputs each thread block computes.
        threads: threads per block, a multiple of 32 up to `MAX_THREADS`; each walks the
            weight rows' chunks `threads` apart. None: `threads_for(K, bits)`.

    Returns:
        (..., N) in x's dtype; sums are accumulated in float32.

    Raises:
        ValueError: as `check_arguments`.
    """
    check_arguments(
        x,
        weight,
        scales,
        biases,
        group_size=group_size,
        bits=bits,
        rows_per_block=rows_per_block,
        threads=threads,
    )
    K = x.shape[-1]
    N = weight.shape[0]
    M = x.size // K
    threads = threads or threads_for(K, bits)
    blocks = -(-N // rows_per_block)
    (y,) = kernel(backend)(
        inputs=[x.reshape(M, K), weight, scales, biases],
        template=[
            ("T", x.dtype),
            ("BITS", bits),
            ("GROUP", group_size),
            ("M", M),
            ("ROWS", rows_per_block),
            ("THREADS", threads),
        ],
        grid=(blocks * threads, 1, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[(M, N)],
        output_dtypes=[x.dtype],
    )
    return y.reshape(*x.shape[:-1], N)
