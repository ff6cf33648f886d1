"""Paged decode attention as Metal kernels (`mx.fast.metal_kernel`), the CUDA kernels'
design in Metal: one threadgroup per (row, KV head), 4 SIMD groups of 32 threads, an
online softmax per query head of the group, and the split-KV variant with its merge.

Untested on hardware: no Apple GPU was available when it was written. It was reviewed
line by line against `cuda.py` and the reference, and nothing dispatches to it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import mlx.core as mx

from mlxcel_core.kernels.paged_attention.cuda import (
    ONE_PASS_STORE,
    SPLIT_STORE,
    launch_paged_decode,
)

# The start of an attention threadgroup: its (row, KV head, partition), its lanes, the
# positions it reads, and the threadgroup memory of its softmax states.
BLOCK_SOURCE = """
  constexpr int WARPS = THREADS / 32;
  constexpr int VEC = LANE_ELEMENTS;
  constexpr int LANES_PER_TOKEN = D / VEC;
  constexpr int TOKENS_PER_WARP = 32 / LANES_PER_TOKEN;
  constexpr int STATES = WARPS * TOKENS_PER_WARP;

  threadgroup float shared_max[STATES * G];
  threadgroup float shared_sum[STATES * G];
  threadgroup float shared_acc[STATES * G * D];

  const int kv_head = threadgroup_position_in_grid.x;
  const int row = threadgroup_position_in_grid.y;
  const int partition = threadgroup_position_in_grid.z;
  const int num_kv_heads = threadgroups_per_grid.x;
  const int num_partitions = threadgroups_per_grid.z;
  const int num_q_heads = num_kv_heads * G;
  const int tid = thread_position_in_threadgroup.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int token_lane = lane / LANES_PER_TOKEN;
  const int sub = lane % LANES_PER_TOKEN;
  const int state = warp * TOKENS_PER_WARP + token_lane;

  const int table_width = block_tables_shape[1];
  const int partition_size = (table_width * BLOCK_SIZE + num_partitions - 1) / num_partitions;
  const int length = context_lengths[row];
  const int begin = partition * partition_size;
  const int end = min(length, begin + partition_size);

"""

# The end of an attention threadgroup: merge the online-softmax states of its position lanes,
# kept in threadgroup memory as (state, group head) maxes and sums and (state, group head, D)
# accumulators, then STORE each (query head, feature) result.
STATE_MERGE_SOURCE = """
  for (int g = 0; g < G; ++g) {
    if (sub == 0) {
      shared_max[state * G + g] = running_max[g];
      shared_sum[state * G + g] = running_sum[g];
    }
    for (int i = 0; i < VEC; ++i) shared_acc[(state * G + g) * D + sub * VEC + i] = acc[g][i];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  for (int idx = tid; idx < G * D; idx += THREADS) {
    const int g = idx / D;
    const int d = idx % D;
    float m = -INFINITY;
    for (int s = 0; s < STATES; ++s) m = metal::max(m, shared_max[s * G + g]);
    float total = 0.0f;
    float out = 0.0f;
    if (m != -INFINITY) {
      for (int s = 0; s < STATES; ++s) {
        const float w = metal::exp2(shared_max[s * G + g] - m);
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
  constexpr int UNROLL = 4;
  const float q_scale = as_type<float>(SCALE_BITS) * 1.4426950408889634f;
  float q[G][VEC];
  for (int g = 0; g < G; ++g) {
    const size_t q_offset = ((size_t)row * num_q_heads + kv_head * G + g) * D + sub * VEC;
    for (int i = 0; i < VEC; ++i) q[g][i] = static_cast<float>(queries[q_offset + i]) * q_scale;
  }
  float running_max[G];
  float running_sum[G];
  float acc[G][VEC];
  for (int g = 0; g < G; ++g) {
    running_max[g] = -INFINITY;
    running_sum[g] = 0.0f;
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.0f;
  }

  const size_t table = (size_t)row * table_width;
  for (int base = begin + warp * TOKENS_PER_WARP; base < end; base += STATES * UNROLL) {
    float k[UNROLL][VEC];
    float v[UNROLL][VEC];
    bool valid[UNROLL];
    for (int u = 0; u < UNROLL; ++u) {
      const int t = base + u * STATES + token_lane;
      valid[u] = t < end;
      if (valid[u]) {
        const size_t block = block_tables[table + t / BLOCK_SIZE];
        const size_t slot = block * BLOCK_SIZE + t % BLOCK_SIZE;
        const size_t offset = (slot * num_kv_heads + kv_head) * D + sub * VEC;
        for (int i = 0; i < VEC; ++i) {
          k[u][i] = static_cast<float>(key_pool[offset + i]);
          v[u][i] = static_cast<float>(value_pool[offset + i]);
        }
      } else {
        for (int i = 0; i < VEC; ++i) k[u][i] = v[u][i] = 0.0f;
      }
    }
    for (int g = 0; g < G; ++g) {
      float score[UNROLL];
      float step_max = -INFINITY;
      for (int u = 0; u < UNROLL; ++u) {
        float total = 0.0f;
        for (int i = 0; i < VEC; ++i) total += q[g][i] * k[u][i];
        for (int offset = LANES_PER_TOKEN / 2; offset > 0; offset /= 2) {
          total += simd_shuffle_xor(total, ushort(offset));
        }
        score[u] = valid[u] ? total : -INFINITY;
        step_max = metal::max(step_max, score[u]);
      }
      if (step_max == -INFINITY) continue;
      const float new_max = metal::max(running_max[g], step_max);
      const float correction = metal::exp2(running_max[g] - new_max);
      running_sum[g] *= correction;
      for (int i = 0; i < VEC; ++i) acc[g][i] *= correction;
      for (int u = 0; u < UNROLL; ++u) {
        if (!valid[u]) continue;
        const float p = metal::exp2(score[u] - new_max);
        running_sum[g] += p;
        for (int i = 0; i < VEC; ++i) acc[g][i] += p * v[u][i];
      }
      running_max[g] = new_max;
    }
  }

"""
    + STATE_MERGE_SOURCE
)

MERGE_SOURCE = """
  const size_t index = thread_position_in_grid.x;
  const int num_partitions = partial_max_shape[2];
  const int d = index % D;
  const size_t head = index / D;
  if (head >= (size_t)partial_max_shape[0] * partial_max_shape[1]) return;
  const size_t first = head * num_partitions;
  float m = -INFINITY;
  for (int p = 0; p < num_partitions; ++p) m = metal::max(m, partial_max[first + p]);
  float total = 0.0f;
  float out = 0.0f;
  if (m != -INFINITY) {
    for (int p = 0; p < num_partitions; ++p) {
      const float w = partial_sum[first + p] * metal::exp2(partial_max[first + p] - m);
      total += w;
      out += partial_out[(first + p) * D + d] * w;
    }
  }
  output[index] = static_cast<T>(total > 0.0f ? out / total : 0.0f);
"""

_INPUTS = ["queries", "key_pool", "value_pool", "block_tables", "context_lengths"]


def attention_kernels(
    name: str, input_names: Sequence[str], source: str, header: str, one_pass_store: str
) -> dict[str, object]:
    """The `one_pass`, `split` and `merge` Metal kernels of an attention threadgroup's
    `source`, whose STORE the one-pass kernel fills with `one_pass_store` and the split one
    with `SPLIT_STORE` (as `cuda.attention_kernels`)."""
    return {
        "one_pass": mx.fast.metal_kernel(
            name=name,
            input_names=list(input_names),
            output_names=["output"],
            source=source.replace("STORE", one_pass_store),
            header=header,
        ),
        "split": mx.fast.metal_kernel(
            name=f"{name}_split",
            input_names=list(input_names),
            output_names=["partial_out", "partial_max", "partial_sum"],
            source=source.replace("STORE", SPLIT_STORE),
            header=header,
        ),
        "merge": mx.fast.metal_kernel(
            name=f"{name}_merge",
            input_names=["partial_out", "partial_max", "partial_sum"],
            output_names=["output"],
            source=MERGE_SOURCE,
            header=header,
        ),
    }


@functools.cache
def _kernels() -> dict[str, object]:
    return attention_kernels("mlxcel_paged_decode", _INPUTS, _ATTENTION_SOURCE, "", ONE_PASS_STORE)


def paged_decode_attention_metal(
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
    """Paged decode attention read straight from the pools, on an Apple GPU.

    Arguments, result and errors as `paged_decode_attention_cuda`. Untested on hardware.
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
