"""The TurboQuant decode attention kernels' source, one template for CUDA and Metal: the
float kernels' block (`source.py`) around scores taken in rotated coordinates, outlier
corrections and the anchor scores of centered keys (`turbo.py` explains them). A key's
scores are one lambda on CUDA; Metal, which has no lambdas, takes the same lines inline
where they are used.
"""

from __future__ import annotations

import functools
import textwrap

from mlxcel_core.kernels.backend import Backend
from mlxcel_core.kernels.paged_attention.source import (
    BLOCK_SOURCE,
    STATE_MERGE_SOURCE,
    attention_kernels,
    render_header,
)
from mlxcel_core.kernels.turbo_encode import HADAMARD_SIGN

UNPACK_RUN = """
// The levels of a run of 8 codes packed bit plane by bit plane: byte k of the run holds
// bit k of each code, code i in bit i (`mlxcel_core.cache.quant.bitpack`).
template <int BITS>
$inline void unpack_run(
    $unpack_run_parameters) {
  uint32_t plane[BITS];
  $unroll
  for (int k = 0; k < BITS; ++k) plane[k] = bytes[k];
  $unroll
  for (int i = 0; i < 8; ++i) {
    int code = 0;
    $unroll
    for (int k = 0; k < BITS; ++k) code |= ((plane[k] >> i) & 1) << k;
    y[i] = levels[code];
  }
}"""

# The G scores of head-vector `vec`'s key into `score`, uncentered.
KEY_SCORES = """float y[VEC];
unpack_run<KEY_BITS>(key_codes + vec * KEY_BYTES + sub * KEY_BITS, key_level, y);
const float s = static_cast<float>(key_scales[vec]);
$unroll
for (int g = 0; g < G; ++g) {
  float partial = 0.0f;
  $unroll
  for (int i = 0; i < VEC; ++i) partial += q[g][i] * y[i];
  score[g] = s * lane_group_sum(partial, LANES_PER_TOKEN);
}
$unroll
for (int j = 0; j < OUTLIERS; ++j) {
  const int p = $min(static_cast<int>(key_positions[vec * OUTLIERS + j]), D - 1);
  float partial = 0.0f;
  $unroll
  for (int i = 0; i < VEC; ++i) partial += y[i] * hadamard_sign(p, sub * VEC + i);
  const float rest = s * rotation_row_sign[p] * lane_group_sum(partial, LANES_PER_TOKEN);
  const float delta = static_cast<float>(key_outliers[vec * OUTLIERS + j]) - rest;
  $unroll
  for (int g = 0; g < G; ++g) {
    score[g] += static_cast<float>(plain_queries[g * D + p]) * q_scale * delta;
  }
}"""

SOURCE = (
    BLOCK_SOURCE
    + """
  constexpr int KEY_BYTES = D * KEY_BITS / 8;
  constexpr int VALUE_BYTES = D * VALUE_BITS / 8;

  $shared float rotation_row_sign[D];
  $shared float key_level[1 << KEY_BITS];
  $shared float value_level[1 << VALUE_BITS];
  $shared float anchor_score[G];

  // R[p, i] = rotation_row_sign[p] * hadamard_sign(p, i).
  for (int i = $thread_x; i < D; i += THREADS) {
    rotation_row_sign[i] = signs[i] * $rsqrt(static_cast<float>(D));
  }
  for (int i = $thread_x; i < (1 << KEY_BITS); i += THREADS) key_level[i] = key_levels[i];
  for (int i = $thread_x; i < (1 << VALUE_BITS); i += THREADS) {
    value_level[i] = value_levels[i];
  }
  $barrier

  // Scores are kept in base 2: q is prescaled by scale * log2(e) so exp2 gives the softmax.
  const float q_scale = $as_float(SCALE_BITS) * 1.4426950408889634f;
  const size_t first_head = (size_t)row * num_q_heads + kv_head * G;
  float q[G][VEC];
  $unroll
  for (int g = 0; g < G; ++g) {
    $unroll
    for (int i = 0; i < VEC; ++i) {
      q[g][i] = rotated_queries[(first_head + g) * D + sub * VEC + i] * q_scale;
    }
  }
  const ${device}T* plain_queries = queries + first_head * D;

  $key_scores_lambda

  const ${device}int* table = block_tables + (size_t)row * table_width;

  // q . m for the row's first-block mean m: the mean of its anchor positions' scores,
  // needed only where this partition reads positions past the first block.
  float anchor[G];
  $unroll
  for (int g = 0; g < G; ++g) anchor[g] = 0.0f;
  if (end > BLOCK_SIZE && begin < end) {
    float total[G];
    $unroll
    for (int g = 0; g < G; ++g) total[g] = 0.0f;
    for (int base = ANCHOR_BEGIN + warp * TOKENS_PER_WARP; base < BLOCK_SIZE; base += STATES) {
      const int t = base + token_lane;
      const bool valid = t < BLOCK_SIZE;
      const size_t slot = valid ? (size_t)table[0] * BLOCK_SIZE + t : 0;
      float score[G];
      $anchor_key_scores
      $unroll
      for (int g = 0; g < G; ++g) total[g] += valid ? score[g] : 0.0f;
    }
    $unroll
    for (int g = 0; g < G; ++g) {
      if (sub == 0) shared_max[state * G + g] = total[g];
    }
    $barrier
    if ($thread_x < G) {
      float sum = 0.0f;
      for (int s = 0; s < STATES; ++s) sum += shared_max[s * G + $thread_x];
      anchor_score[$thread_x] = sum / (BLOCK_SIZE - ANCHOR_BEGIN);
    }
    $barrier
    $unroll
    for (int g = 0; g < G; ++g) anchor[g] = anchor_score[g];
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

  for (int base = begin + warp * TOKENS_PER_WARP; base < end; base += STATES) {
    const int t = base + token_lane;
    const bool valid = t < end;
    const size_t slot = valid ? (size_t)table[t / BLOCK_SIZE] * BLOCK_SIZE + t % BLOCK_SIZE : 0;
    const size_t vec = slot * num_kv_heads + kv_head;
    float score[G];
    $key_scores

    // The value in rotated coordinates, its outlier features folded in.
    float w[VEC];
    {
      float y[VEC];
      unpack_run<VALUE_BITS>(value_codes + vec * VALUE_BYTES + sub * VALUE_BITS, value_level, y);
      const float s = static_cast<float>(value_scales[vec]);
      $unroll
      for (int i = 0; i < VEC; ++i) w[i] = s * y[i];
      $unroll
      for (int j = 0; j < OUTLIERS; ++j) {
        const int p = $min(static_cast<int>(value_positions[vec * OUTLIERS + j]), D - 1);
        float partial = 0.0f;
        $unroll
        for (int i = 0; i < VEC; ++i) partial += y[i] * hadamard_sign(p, sub * VEC + i);
        const float rest = s * rotation_row_sign[p] * lane_group_sum(partial, LANES_PER_TOKEN);
        const float delta = static_cast<float>(value_outliers[vec * OUTLIERS + j]) - rest;
        $unroll
        for (int i = 0; i < VEC; ++i) {
          w[i] += delta * rotation_row_sign[p] * hadamard_sign(p, sub * VEC + i);
        }
      }
    }
    if (!valid) continue;
    const float shift = t >= BLOCK_SIZE ? 1.0f : 0.0f;
    $unroll
    for (int g = 0; g < G; ++g) {
      const float x = score[g] + shift * anchor[g];
      const float new_max = $max(running_max[g], x);
      const float correction = $exp2(running_max[g] - new_max);
      const float p = $exp2(x - new_max);
      running_sum[g] = running_sum[g] * correction + p;
      $unroll
      for (int i = 0; i < VEC; ++i) acc[g][i] = acc[g][i] * correction + p * w[i];
      running_max[g] = new_max;
    }
  }
"""
    + STATE_MERGE_SOURCE
)


def _inline(text: str, *, vec: str | None = None) -> str:
    """`text` in a block of its own, `vec` bound first where given."""
    binding = "" if vec is None else f"  const size_t vec = {vec};\n"
    return "{\n" + binding + textwrap.indent(text, "  ") + "\n}"


_CUDA_FRAGMENTS = {
    "unpack_run_parameters": "const uint8_t* bytes, const float* levels, float (&y)[8]",
    "key_scores_lambda": (
        "// The scores of head-vector `vec`'s key, uncentered. Every lane of a position's group\n"
        "// takes part (the sums shuffle), whether or not the position is read.\n"
        "auto key_scores = [&](size_t vec, float (&score)[G]) {\n"
        + textwrap.indent(KEY_SCORES, "  ")
        + "\n};"
    ),
    "anchor_key_scores": "key_scores(slot * num_kv_heads + kv_head, score);",
    "key_scores": "key_scores(vec, score);",
}
_METAL_FRAGMENTS = {
    "unpack_run_parameters": (
        "const device uint8_t* bytes, const threadgroup float* levels, thread float* y"
    ),
    "key_scores_lambda": "",
    "anchor_key_scores": _inline(KEY_SCORES, vec="slot * num_kv_heads + kv_head"),
    "key_scores": _inline(KEY_SCORES),
}

# The one-pass kernel writes the rotated output in float32; it is rotated back after.
_ROTATED_STORE = "output[head * D + d] = normalized;"

INPUTS = [
    "queries",
    "rotated_queries",
    "key_codes",
    "key_scales",
    "key_positions",
    "key_outliers",
    "value_codes",
    "value_scales",
    "value_positions",
    "value_outliers",
    "signs",
    "key_levels",
    "value_levels",
    "block_tables",
    "context_lengths",
]


def render_turbo_header(backend: Backend) -> str:
    """The header of the kernels on `backend`: the float kernels', then code unpacking
    and the Hadamard matrix's signs."""
    fragments = backend.either(cuda=_CUDA_FRAGMENTS, metal=_METAL_FRAGMENTS)
    unpack = backend.render(UNPACK_RUN, unpack_run_parameters=fragments["unpack_run_parameters"])
    return render_header(backend) + unpack + "\n" + backend.render(HADAMARD_SIGN)


@functools.cache
def kernels(backend: Backend) -> dict[str, object]:
    """The `one_pass`, `split` and `merge` kernels on `backend`, built once."""
    fragments = backend.either(cuda=_CUDA_FRAGMENTS, metal=_METAL_FRAGMENTS)
    return attention_kernels(
        backend,
        "mlxcel_turbo_paged_decode",
        INPUTS,
        SOURCE,
        render_turbo_header(backend),
        _ROTATED_STORE,
        fragments,
    )
