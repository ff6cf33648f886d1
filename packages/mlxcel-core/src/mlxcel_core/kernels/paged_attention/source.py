"""The source the paged decode attention kernels share, as templates for either backend
(`mlxcel_core.kernels.backend`): the start and end of an attention block, the split-KV
partials' merge kernel, and `attention_kernels`, which builds the three kernels of a block.

One block (a Metal threadgroup) serves one (row, KV head) pair and partition, with the
H_q / H_kv query heads that share that KV head; `D / 8` lanes of a warp (SIMD group) read
each position and keep an online softmax per query head (Milakov and Gimelshein 2018,
"Online normalizer calculation for softmax"), whose states the block merges in shared
memory at the end. The split-KV variant (Flash-Decoding: Dao, Haziza, Massa and Sizov
2023) has each partition write its normalized output with its max and sum, and a merge
kernel rescale and sum them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mlxcel_core.kernels.backend import Backend

HEADER = """
$neg_inf_definition

$inline float lane_group_sum(float x, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) {
    x += $shuffle_xor(x, offset);
  }
  return x;
}
"""


def render_header(backend: Backend) -> str:
    """`HEADER` for `backend`: the sum over a position's lanes, and CUDA's `NEG_INF`."""
    definition = "#define NEG_INF (-cuda::std::numeric_limits<float>::infinity())"
    return backend.render(HEADER, neg_inf_definition=backend.either(cuda=definition, metal=""))


# The start of an attention block: its (row, KV head, partition), its lanes, the positions
# it reads, and the shared memory of its softmax states.
BLOCK_SOURCE = """
  constexpr int WARPS = THREADS / 32;
  constexpr int VEC = LANE_ELEMENTS;
  constexpr int LANES_PER_TOKEN = D / VEC;
  constexpr int TOKENS_PER_WARP = 32 / LANES_PER_TOKEN;
  constexpr int STATES = WARPS * TOKENS_PER_WARP;
  $shared float shared_max[STATES * G];
  $shared float shared_sum[STATES * G];
  $shared float shared_acc[STATES * G * D];

  const int kv_head = $block.x;
  const int row = $block.y;
  const int partition = $block.z;
  const int num_kv_heads = $grid.x;
  const int num_partitions = $grid.z;
  const int num_q_heads = num_kv_heads * G;
  const int warp = $thread_x / 32;
  const int lane = $thread_x % 32;
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
# accumulators, then `$store` each (query head, feature) result.
STATE_MERGE_SOURCE = """
  $unroll
  for (int g = 0; g < G; ++g) {
    if (sub == 0) {
      shared_max[state * G + g] = running_max[g];
      shared_sum[state * G + g] = running_sum[g];
    }
    $unroll
    for (int i = 0; i < VEC; ++i) shared_acc[(state * G + g) * D + sub * VEC + i] = acc[g][i];
  }
  $barrier

  for (int idx = $thread_x; idx < G * D; idx += THREADS) {
    const int g = idx / D;
    const int d = idx % D;
    float m = $neg_inf;
    for (int s = 0; s < STATES; ++s) m = $max(m, shared_max[s * G + g]);
    float total = 0.0f;
    float out = 0.0f;
    if (m != $neg_inf) {
      for (int s = 0; s < STATES; ++s) {
        const float w = $exp2(shared_max[s * G + g] - m);
        total += shared_sum[s * G + g] * w;
        out += shared_acc[(s * G + g) * D + d] * w;
      }
    }
    const float normalized = total > 0.0f ? out / total : 0.0f;
    const size_t head = (size_t)row * num_q_heads + kv_head * G + g;
    $store
  }
"""

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
  const size_t index = $global_x;
  const int num_partitions = partial_max_shape[2];
  const int d = index % D;
  const size_t head = index / D;
  if (head >= (size_t)partial_max_shape[0] * partial_max_shape[1]) return;
  const ${device}float* maxes = partial_max + head * num_partitions;
  const ${device}float* sums = partial_sum + head * num_partitions;
  float m = $neg_inf;
  for (int p = 0; p < num_partitions; ++p) m = $max(m, maxes[p]);
  float total = 0.0f;
  float out = 0.0f;
  if (m != $neg_inf) {
    for (int p = 0; p < num_partitions; ++p) {
      const float w = sums[p] * $exp2(maxes[p] - m);
      total += w;
      out += partial_out[(head * num_partitions + p) * D + d] * w;
    }
  }
  output[index] = static_cast<T>(total > 0.0f ? out / total : 0.0f);
"""


def attention_kernels(
    backend: Backend,
    name: str,
    input_names: Sequence[str],
    source: str,
    header: str,
    one_pass_store: str,
    fragments: Mapping[str, str],
) -> dict[str, object]:
    """The `one_pass`, `split` and `merge` kernels of an attention block's template
    `source` on `backend`, rendered with the kernel's `fragments`, whose `$store` the
    one-pass kernel spells `one_pass_store` and the split one `SPLIT_STORE`; `header` is
    rendered already."""
    return {
        "one_pass": backend.build_kernel(
            name=name,
            input_names=input_names,
            output_names=["output"],
            source=backend.render(source, store=one_pass_store, **fragments),
            header=header,
        ),
        "split": backend.build_kernel(
            name=f"{name}_split",
            input_names=input_names,
            output_names=["partial_out", "partial_max", "partial_sum"],
            source=backend.render(source, store=SPLIT_STORE, **fragments),
            header=header,
        ),
        "merge": backend.build_kernel(
            name=f"{name}_merge",
            input_names=["partial_out", "partial_max", "partial_sum"],
            output_names=["output"],
            source=backend.render(MERGE_SOURCE),
            header=header,
        ),
    }
