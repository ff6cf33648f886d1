"""Paged decode attention as CUDA kernels (`mx.fast.cuda_kernel`): one pass, or split-KV.

One thread block serves one (row, KV head) pair and the H_q / H_kv query heads that share
that KV head, so each key and value is read from the pool once for the whole group. Its
threads walk the row's positions through the block table, `D / 8` lanes per position with
8 elements (one 16-byte load of a 16-bit dtype) each, several positions per lane loaded
before any is used, and keep an online softmax (running max, sum and weighted values) per
query head (Milakov and Gimelshein 2018, "Online normalizer calculation for softmax"),
updated once per such step; the states of the block's position lanes are merged in shared
memory at the end.

The split-KV variant (Flash-Decoding: Dao, Haziza, Massa and Sizov 2023) cuts each row's
context into partitions that separate blocks process at once, each writing its normalized
partial output with its max and sum; a merge kernel rescales and sums them. It fills the
GPU when rows x KV heads alone are too few blocks (long contexts, few rows).
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Mapping, Sequence

import mlx.core as mx

from mlxcel_core.autotune.buckets import PAGED_DECODE_PARTITIONS, paged_decode_bucket
from mlxcel_core.autotune.lookup import installed_tunings

# Threads per block of the attention kernel: 4 warps.
THREADS = 128
# Elements of a head each lane reads per position: 16 bytes of a 16-bit dtype.
LANE_ELEMENTS = 8
# Static shared memory a block may take (bytes).
MAX_SHARED_BYTES = 48 * 1024
# Blocks the split-KV variant aims to launch, and the fewest positions of a partition: on an
# H200 at 32k positions, 16-64 partitions of one row beat 4 and 256 (docs/benchmarks.md).
TARGET_BLOCKS = 2048
MIN_PARTITION_TOKENS = 512

HEADER = """
#define NEG_INF (-cuda::std::numeric_limits<float>::infinity())

__device__ __forceinline__ float lane_group_sum(float x, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffff, x, offset);
  }
  return x;
}
"""

# The start of an attention block: its (row, KV head, partition), its lanes, the positions
# it reads, and the shared memory of its softmax states.
BLOCK_SOURCE = """
  constexpr int WARPS = THREADS / 32;
  constexpr int VEC = LANE_ELEMENTS;
  constexpr int LANES_PER_TOKEN = D / VEC;
  constexpr int TOKENS_PER_WARP = 32 / LANES_PER_TOKEN;
  constexpr int STATES = WARPS * TOKENS_PER_WARP;
  __shared__ float shared_max[STATES * G];
  __shared__ float shared_sum[STATES * G];
  __shared__ float shared_acc[STATES * G * D];

  const int kv_head = blockIdx.x;
  const int row = blockIdx.y;
  const int partition = blockIdx.z;
  const int num_kv_heads = gridDim.x;
  const int num_partitions = gridDim.z;
  const int num_q_heads = num_kv_heads * G;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int token_lane = lane / LANES_PER_TOKEN;
  const int sub = lane % LANES_PER_TOKEN;
  const int state = warp * TOKENS_PER_WARP + token_lane;

  const int table_width = block_tables_shape[1];
  const int partition_size = (table_width * BLOCK_SIZE + num_partitions - 1) / num_partitions;
  const int length = context_lengths[row];
  const int begin = partition * partition_size;
  const int end = min(length, begin + partition_size);
"""

# The end of an attention block: merge the online-softmax states of its position lanes,
# kept in shared memory as (state, group head) maxes and sums and (state, group head, D)
# accumulators, then STORE each (query head, feature) result.
STATE_MERGE_SOURCE = """
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    if (sub == 0) {
      shared_max[state * G + g] = running_max[g];
      shared_sum[state * G + g] = running_sum[g];
    }
    #pragma unroll
    for (int i = 0; i < VEC; ++i) shared_acc[(state * G + g) * D + sub * VEC + i] = acc[g][i];
  }
  __syncthreads();

  for (int idx = threadIdx.x; idx < G * D; idx += THREADS) {
    const int g = idx / D;
    const int d = idx % D;
    float m = NEG_INF;
    for (int s = 0; s < STATES; ++s) m = fmaxf(m, shared_max[s * G + g]);
    float total = 0.0f;
    float out = 0.0f;
    if (m != NEG_INF) {
      for (int s = 0; s < STATES; ++s) {
        const float w = exp2f(shared_max[s * G + g] - m);
        total += shared_sum[s * G + g] * w;
        out += shared_acc[(s * G + g) * D + d] * w;
      }
    }
    const float normalized = total > 0.0f ? out / total : 0.0f;
    const size_t head = (size_t)row * num_q_heads + kv_head * G + g;
    STORE
  }
"""

_ATTENTION_SOURCE = (
    BLOCK_SOURCE
    + """
  constexpr int CHUNKS = VEC * sizeof(T) / 16;
  constexpr int UNROLL = CHUNKS == 1 ? 4 : 2;

  // Scores are kept in base 2: q is prescaled by scale * log2(e) so exp2 gives the softmax.
  const float q_scale = __int_as_float(SCALE_BITS) * 1.4426950408889634f;
  float q[G][VEC];
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    const T* q_row = queries + ((size_t)row * num_q_heads + kv_head * G + g) * D + sub * VEC;
    #pragma unroll
    for (int i = 0; i < VEC; ++i) q[g][i] = static_cast<float>(q_row[i]) * q_scale;
  }
  float running_max[G];
  float running_sum[G];
  float acc[G][VEC];
  #pragma unroll
  for (int g = 0; g < G; ++g) {
    running_max[g] = NEG_INF;
    running_sum[g] = 0.0f;
    #pragma unroll
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.0f;
  }

  // Each iteration loads UNROLL positions per lane before using any, so that many loads
  // are in flight, and updates each softmax state once for all of them.
  const int* table = block_tables + (size_t)row * table_width;
  for (int base = begin + warp * TOKENS_PER_WARP; base < end; base += STATES * UNROLL) {
    uint4 k_raw[UNROLL][CHUNKS];
    uint4 v_raw[UNROLL][CHUNKS];
    bool valid[UNROLL];
    #pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int t = base + u * STATES + token_lane;
      valid[u] = t < end;
      if (valid[u]) {
        const size_t slot = (size_t)table[t / BLOCK_SIZE] * BLOCK_SIZE + t % BLOCK_SIZE;
        const size_t offset = (slot * num_kv_heads + kv_head) * D + sub * VEC;
        #pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
          k_raw[u][c] = reinterpret_cast<const uint4*>(key_pool + offset)[c];
          v_raw[u][c] = reinterpret_cast<const uint4*>(value_pool + offset)[c];
        }
      }
    }
    #pragma unroll
    for (int g = 0; g < G; ++g) {
      float score[UNROLL];
      float step_max = NEG_INF;
      #pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const T* k = reinterpret_cast<const T*>(k_raw[u]);
        float partial = 0.0f;
        #pragma unroll
        for (int i = 0; i < VEC; ++i) partial += q[g][i] * static_cast<float>(k[i]);
        // Every lane takes part in the shuffles; positions past the end are dropped after.
        const float total = lane_group_sum(partial, LANES_PER_TOKEN);
        score[u] = valid[u] ? total : NEG_INF;
        step_max = fmaxf(step_max, score[u]);
      }
      if (step_max == NEG_INF) continue;
      const float new_max = fmaxf(running_max[g], step_max);
      const float correction = exp2f(running_max[g] - new_max);
      running_sum[g] *= correction;
      #pragma unroll
      for (int i = 0; i < VEC; ++i) acc[g][i] *= correction;
      #pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (!valid[u]) continue;
        const T* v = reinterpret_cast<const T*>(v_raw[u]);
        const float p = exp2f(score[u] - new_max);
        running_sum[g] += p;
        #pragma unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] += p * static_cast<float>(v[i]);
      }
      running_max[g] = new_max;
    }
  }

"""
    + STATE_MERGE_SOURCE
)

# How a block stores each (query head, feature) result: the one-pass kernel writes the output;
# a split-KV partition writes its normalized output, and its max and sum once per head.
ONE_PASS_STORE = "output[head * D + d] = static_cast<T>(normalized);"
SPLIT_STORE = """const size_t part = head * num_partitions + partition;
    partial_out[part * D + d] = normalized;
    if (d == 0) {
      partial_max[part] = m;
      partial_sum[part] = total;
    }"""

MERGE_SOURCE = """
  const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int num_partitions = partial_max_shape[2];
  const int d = index % D;
  const size_t head = index / D;
  if (head >= (size_t)partial_max_shape[0] * partial_max_shape[1]) return;
  const float* maxes = partial_max + head * num_partitions;
  const float* sums = partial_sum + head * num_partitions;
  float m = NEG_INF;
  for (int p = 0; p < num_partitions; ++p) m = fmaxf(m, maxes[p]);
  float total = 0.0f;
  float out = 0.0f;
  if (m != NEG_INF) {
    for (int p = 0; p < num_partitions; ++p) {
      const float w = sums[p] * exp2f(maxes[p] - m);
      total += w;
      out += partial_out[(head * num_partitions + p) * D + d] * w;
    }
  }
  output[index] = static_cast<T>(total > 0.0f ? out / total : 0.0f);
"""


_INPUTS = ["queries", "key_pool", "value_pool", "block_tables", "context_lengths"]


def attention_kernels(
    name: str, input_names: Sequence[str], source: str, header: str, one_pass_store: str
) -> dict[str, object]:
    """The `one_pass`, `split` and `merge` CUDA kernels of an attention block's `source`,
    whose STORE the one-pass kernel fills with `one_pass_store` and the split one with
    `SPLIT_STORE`."""
    return {
        "one_pass": mx.fast.cuda_kernel(
            name=name,
            input_names=list(input_names),
            output_names=["output"],
            source=source.replace("STORE", one_pass_store),
            header=header,
        ),
        "split": mx.fast.cuda_kernel(
            name=f"{name}_split",
            input_names=list(input_names),
            output_names=["partial_out", "partial_max", "partial_sum"],
            source=source.replace("STORE", SPLIT_STORE),
            header=header,
        ),
        "merge": mx.fast.cuda_kernel(
            name=f"{name}_merge",
            input_names=["partial_out", "partial_max", "partial_sum"],
            output_names=["output"],
            source=MERGE_SOURCE,
            header=header,
        ),
    }


@functools.cache
def _kernels() -> dict[str, object]:
    return attention_kernels(
        "mlxcel_paged_decode", _INPUTS, _ATTENTION_SOURCE, HEADER, ONE_PASS_STORE
    )


def float_bits(value: float) -> int:
    """The float32 bit pattern of `value` as a signed int: kernel template arguments are
    ints, and a model's attention scale is one constant, so it is compiled in."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


def shared_bytes(group_size: int, head_dim: int) -> int:
    """Static shared memory of one attention block (bytes): per position lane, a max and
    a sum per query head of the group and a (group, head_dim) accumulator, in float32."""
    lanes_per_token = head_dim // LANE_ELEMENTS
    states = THREADS // 32 * (32 // lanes_per_token)
    return states * group_size * (head_dim + 2) * 4


def supports(dtype: mx.Dtype, group_size: int, key_dim: int, value_dim: int) -> bool:
    """Whether the kernels take this layer: a float pool and one head dim that 8-element
    lane slices tile within a warp (8, 16, 32, 64, 128 or 256), and shared memory to spare."""
    return (
        dtype in (mx.float32, mx.float16, mx.bfloat16)
        and key_dim == value_dim
        and key_dim in (8, 16, 32, 64, 128, 256)
        and shared_bytes(group_size, key_dim) <= MAX_SHARED_BYTES
    )


def num_partitions_for(num_rows: int, num_kv_heads: int, capacity_tokens: int) -> int:
    """Partitions per row: 1 (the one-pass kernel) when rows x KV heads already make
    `TARGET_BLOCKS` blocks, else enough to reach it, each of at least
    `MIN_PARTITION_TOKENS` positions of the block tables' capacity."""
    blocks = num_rows * num_kv_heads
    wanted = math.ceil(TARGET_BLOCKS / blocks)
    most = max(1, capacity_tokens // MIN_PARTITION_TOKENS)
    return max(1, min(wanted, most))


def paged_decode_attention_cuda(
    queries: mx.array,
    key_pool: mx.array,
    value_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    block_size: int,
    scale: float,
    num_partitions: int | None = None,
) -> mx.array:
    """Paged decode attention read straight from the pools, on a CUDA device.

    Arguments and result as `paged_decode_attention_reference`, with `supports(...)`
    true of the layer; a row of length 0 gives zeros. Block table entries past a row's
    length are never read.

    Args:
        num_partitions: split each row's block-table capacity into this many partitions
            (1 runs the one-pass kernel); None takes the value `mlxcel tune` stored for
            this shape in the installed tunings (`mlxcel_core.autotune`), else
            `num_partitions_for`'s.

    Raises:
        ValueError: `num_partitions` is < 1, `scale` is not > 0, or a pool's dtype is not
            the queries'.
    """
    return launch_paged_decode(
        _kernels,
        queries,
        key_pool,
        value_pool,
        block_tables,
        context_lengths,
        block_size=block_size,
        scale=scale,
        num_partitions=num_partitions,
    )


def launch_paged_decode(
    kernels: Callable[[], dict[str, object]],
    queries: mx.array,
    key_pool: mx.array,
    value_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    block_size: int,
    scale: float,
    num_partitions: int | None,
) -> mx.array:
    """Check the arguments, then launch the `one_pass`, or `split` then `merge`, kernels
    that `kernels` builds (the CUDA ones or the Metal ones, which take the same inputs,
    template and grid).

    Raises:
        ValueError: as `paged_decode_attention_cuda`.
    """
    B, H_q, _, D = queries.shape
    H_kv = key_pool.shape[1]
    group = H_q // H_kv
    capacity = block_tables.shape[1] * block_size
    if num_partitions is None:
        num_partitions = num_partitions_for(B, H_kv, capacity)
        tunings = installed_tunings()
        if tunings.enabled:
            bucket = paged_decode_bucket(
                dtype=queries.dtype,
                group_size=group,
                head_dim=D,
                num_kv_heads=H_kv,
                num_rows=B,
                capacity_tokens=capacity,
            )
            num_partitions = tunings.value(PAGED_DECODE_PARTITIONS, bucket, num_partitions)
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if key_pool.dtype != queries.dtype or value_pool.dtype != queries.dtype:
        raise ValueError(
            f"pools must hold the queries' dtype {queries.dtype}, "
            f"got {key_pool.dtype} and {value_pool.dtype}"
        )
    inputs = [
        queries,
        key_pool,
        value_pool,
        block_tables.astype(mx.int32),
        context_lengths.astype(mx.int32),
    ]
    template = [
        ("T", queries.dtype),
        ("G", group),
        ("D", D),
        ("BLOCK_SIZE", block_size),
        ("THREADS", THREADS),
        ("LANE_ELEMENTS", LANE_ELEMENTS),
        ("SCALE_BITS", float_bits(scale)),
    ]
    return launch_partitioned(
        kernels(),
        inputs,
        template,
        shape=(B, H_q, H_kv, D),
        num_partitions=num_partitions,
        output_dtype=queries.dtype,
    )


def launch_partitioned(
    kernels: Mapping[str, object],
    inputs: Sequence[mx.array],
    template: Sequence[tuple[str, object]],
    *,
    shape: tuple[int, int, int, int],
    num_partitions: int,
    output_dtype: mx.Dtype,
) -> mx.array:
    """Launch `kernels`' one-pass kernel over a grid of one block per (KV head, row), or
    its split kernel over `num_partitions` partitions of each row, then the merge.

    Args:
        kernels: as `attention_kernels` (or the Metal port) builds them.
        inputs: the attention kernel's inputs.
        template: its template arguments.
        shape: (B, H_q, H_kv, D): rows, query heads, KV heads, output features.
        num_partitions: 1 for the one-pass kernel.
        output_dtype: the dtype of the (B, H_q, 1, D) result.
    """
    B, H_q, H_kv, D = shape
    grid = (H_kv * THREADS, B, num_partitions)
    if num_partitions == 1:
        (output,) = kernels["one_pass"](
            inputs=inputs,
            template=template,
            grid=grid,
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(B, H_q, 1, D)],
            output_dtypes=[output_dtype],
        )
        return output
    parts = (B, H_q, num_partitions)
    partial_out, partial_max, partial_sum = kernels["split"](
        inputs=inputs,
        template=template,
        grid=grid,
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(*parts, D), parts, parts],
        output_dtypes=[mx.float32, mx.float32, mx.float32],
    )
    (output,) = kernels["merge"](
        inputs=[partial_out, partial_max, partial_sum],
        template=[("T", output_dtype), ("D", D)],
        grid=(B * H_q * D, 1, 1),
        threadgroup=(min(256, B * H_q * D), 1, 1),
        output_shapes=[(B, H_q, 1, D)],
        output_dtypes=[output_dtype],
    )
    return output
