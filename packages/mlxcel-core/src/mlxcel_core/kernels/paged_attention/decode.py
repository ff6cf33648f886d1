"""Paged decode attention over float pools as one kernel source for CUDA and Metal:
one pass, or split-KV (`source.py` describes the blocks).

A block's threads walk the row's positions through the block table, `D / 8` lanes per
position with 8 elements each, several positions per lane loaded before any is used, and
update each query head's online softmax once per such step. On CUDA a lane loads its 8
elements as 16-byte vectors (one for a 16-bit dtype) and converts them where they are
used; on Metal it loads them one by one as floats.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from mlxcel_core.kernels.backend import Backend
from mlxcel_core.kernels.paged_attention.grid import (
    HEAD_DIMS,
    LANE_ELEMENTS,
    THREADS,
    check_launch,
    float_bits,
    launch_partitioned,
    num_partitions_for,
    shared_bytes,
)
from mlxcel_core.kernels.paged_attention.source import (
    BLOCK_SOURCE,
    ONE_PASS_STORE,
    STATE_MERGE_SOURCE,
    attention_kernels,
    render_header,
)
from mlxcel_core.tuning import PAGED_DECODE_PARTITIONS, installed_tunings, paged_decode_bucket

SOURCE = (
    BLOCK_SOURCE
    + """
  $unroll_count

  // Scores are kept in base 2: q is prescaled by scale * log2(e) so exp2 gives the softmax.
  const float q_scale = $as_float(SCALE_BITS) * 1.4426950408889634f;
  float q[G][VEC];
  $unroll
  for (int g = 0; g < G; ++g) {
    const ${device}T* q_row =
        queries + ((size_t)row * num_q_heads + kv_head * G + g) * D + sub * VEC;
    $unroll
    for (int i = 0; i < VEC; ++i) q[g][i] = static_cast<float>(q_row[i]) * q_scale;
  }
  float running_max[G];
  float running_sum[G];
  float acc[G][VEC];
  $unroll
  for (int g = 0; g < G; ++g) {
    running_max[g] = $neg_inf;
    running_sum[g] = 0.0f;
    $unroll
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.0f;
  }

  // Each iteration loads UNROLL positions per lane before using any, so that many loads
  // are in flight, and updates each softmax state once for all of them.
  const ${device}int* table = block_tables + (size_t)row * table_width;
  for (int base = begin + warp * TOKENS_PER_WARP; base < end; base += STATES * UNROLL) {
    $kv_registers
    bool valid[UNROLL];
    $unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int t = base + u * STATES + token_lane;
      valid[u] = t < end;
      $pad_position
      if (valid[u]) {
        const size_t slot = (size_t)table[t / BLOCK_SIZE] * BLOCK_SIZE + t % BLOCK_SIZE;
        const size_t offset = (slot * num_kv_heads + kv_head) * D + sub * VEC;
        $load_position
      }
    }
    $unroll
    for (int g = 0; g < G; ++g) {
      float score[UNROLL];
      float step_max = $neg_inf;
      $unroll
      for (int u = 0; u < UNROLL; ++u) {
        const ${thread}$element* k = $elements_of(k_raw[u]);
        float partial = 0.0f;
        $unroll
        for (int i = 0; i < VEC; ++i) partial += q[g][i] * static_cast<float>(k[i]);
        // Every lane takes part in the shuffles; positions past the end are dropped after.
        const float total = lane_group_sum(partial, LANES_PER_TOKEN);
        score[u] = valid[u] ? total : $neg_inf;
        step_max = $max(step_max, score[u]);
      }
      if (step_max == $neg_inf) continue;
      const float new_max = $max(running_max[g], step_max);
      const float correction = $exp2(running_max[g] - new_max);
      running_sum[g] *= correction;
      $unroll
      for (int i = 0; i < VEC; ++i) acc[g][i] *= correction;
      $unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (!valid[u]) continue;
        const ${thread}$element* v = $elements_of(v_raw[u]);
        const float p = $exp2(score[u] - new_max);
        running_sum[g] += p;
        $unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] += p * static_cast<float>(v[i]);
      }
      running_max[g] = new_max;
    }
  }

"""
    + STATE_MERGE_SOURCE
)

# What each backend loads a position's lane slice into. CUDA: `CHUNKS` 16-byte vectors of
# elements of T, four positions in flight for a 16-bit dtype and two for float32. Metal:
# VEC floats, four positions in flight, those past the end set to 0.
_CUDA_FRAGMENTS = {
    "unroll_count": """constexpr int CHUNKS = VEC * sizeof(T) / 16;
constexpr int UNROLL = CHUNKS == 1 ? 4 : 2;""",
    "kv_registers": "uint4 k_raw[UNROLL][CHUNKS];\nuint4 v_raw[UNROLL][CHUNKS];",
    "pad_position": "",
    "load_position": """#pragma unroll
for (int c = 0; c < CHUNKS; ++c) {
  k_raw[u][c] = reinterpret_cast<const uint4*>(key_pool + offset)[c];
  v_raw[u][c] = reinterpret_cast<const uint4*>(value_pool + offset)[c];
}""",
    "element": "T",
    "elements_of": "reinterpret_cast<const T*>({0})",
}
_METAL_FRAGMENTS = {
    "unroll_count": "constexpr int UNROLL = 4;",
    "kv_registers": "float k_raw[UNROLL][VEC];\nfloat v_raw[UNROLL][VEC];",
    "pad_position": "for (int i = 0; i < VEC; ++i) k_raw[u][i] = v_raw[u][i] = 0.0f;",
    "load_position": """for (int i = 0; i < VEC; ++i) {
  k_raw[u][i] = static_cast<float>(key_pool[offset + i]);
  v_raw[u][i] = static_cast<float>(value_pool[offset + i]);
}""",
    "element": "float",
    "elements_of": "{0}",
}

INPUTS = ["queries", "key_pool", "value_pool", "block_tables", "context_lengths"]


@functools.cache
def kernels(backend: Backend) -> dict[str, object]:
    """The `one_pass`, `split` and `merge` kernels on `backend`, built once."""
    fragments = backend.either(cuda=_CUDA_FRAGMENTS, metal=_METAL_FRAGMENTS)
    return attention_kernels(
        backend,
        "mlxcel_paged_decode",
        INPUTS,
        SOURCE,
        render_header(backend),
        ONE_PASS_STORE,
        fragments,
    )


def supports(
    backend: Backend, dtype: mx.Dtype, group_size: int, key_dim: int, value_dim: int
) -> bool:
    """Whether the kernels on `backend` take this layer: a float pool, one head dim of
    `HEAD_DIMS`, and shared memory to spare on `backend`."""
    return (
        dtype in (mx.float32, mx.float16, mx.bfloat16)
        and key_dim == value_dim
        and key_dim in HEAD_DIMS
        and shared_bytes(group_size, key_dim) <= backend.max_shared_bytes
    )


def paged_decode_attention_kernel(
    queries: mx.array,
    key_pool: mx.array,
    value_pool: mx.array,
    block_tables: mx.array,
    context_lengths: mx.array,
    *,
    block_size: int,
    scale: float,
    backend: Backend,
    num_partitions: int | None = None,
) -> mx.array:
    """Paged decode attention read straight from the pools, by `backend`'s kernels.

    Arguments and result as `paged_decode_attention_reference`, with `supports(...)`
    true of the layer; a row of length 0 gives zeros. Block table entries past a row's
    length are never read.

    Args:
        backend: `CUDA` or `METAL`, the default device's GPU backend.
        num_partitions: split each row's block-table capacity into this many partitions
            (1 runs the one-pass kernel); None takes the value `mlxcel tune` stored for
            this shape in the installed tunings (`mlxcel_core.tuning`), else
            `num_partitions_for`'s.

    Raises:
        ValueError: `num_partitions` is < 1, `scale` is not > 0, or a pool's dtype is not
            the queries'.
    """
    B, H_q, _, D = queries.shape
    H_kv = key_pool.shape[1]
    group = H_q // H_kv
    if num_partitions is None:
        capacity = block_tables.shape[1] * block_size
        num_partitions = tuned_partitions(queries.dtype, group, D, H_kv, B, capacity)
    check_launch(num_partitions, scale)
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
        kernels(backend),
        inputs,
        template,
        shape=(B, H_q, H_kv, D),
        num_partitions=num_partitions,
        output_dtype=queries.dtype,
    )


def tuned_partitions(
    dtype: mx.Dtype,
    group_size: int,
    head_dim: int,
    num_kv_heads: int,
    num_rows: int,
    capacity: int,
) -> int:
    """The split count for this shape (`capacity` tokens in each row's block table):
    `mlxcel tune`'s where the installed tunings hold one, else `num_partitions_for`'s."""
    default = num_partitions_for(num_rows, num_kv_heads, capacity)
    tunings = installed_tunings()
    if not tunings.enabled:
        return default
    bucket = paged_decode_bucket(
        dtype=dtype,
        group_size=group_size,
        head_dim=head_dim,
        num_kv_heads=num_kv_heads,
        num_rows=num_rows,
        capacity_tokens=capacity,
    )
    return tunings.value(PAGED_DECODE_PARTITIONS, bucket, default)
