/* Decode attention over paged float32 KV pools: one query per row attends to that row's
 * positions [0, length), read through its block table (position p of a row lies in slot
 * table[p / block_size] * block_size + p % block_size of the pools), so no context is
 * gathered.
 *
 * Per (row, kv head): the scores of the group's query heads (q_heads / kv_heads of them,
 * query head h * group + g on kv head h) against every position, a softmax that subtracts
 * each head's maximum, then the probabilities' weighted sum of the values. The query-key
 * products are eight lanes of FMA over the head dimension, up to four query heads sharing
 * each key load; the value sums hold four heads by sixteen values in registers while they
 * walk the positions. A head dimension that is not a multiple of eight ends in masked
 * loads, so the pools are never read past a row's last value.
 *
 * exp(t) for t <= 0: t = n ln2 + r (Cody-Waite, ln2 in two constants), exp(r) by Cephes'
 * degree-5 polynomial (Stephen L. Moshier, Cephes Math Library 2.2, as in swiglu.c), 2^n
 * built in the exponent field. Arguments under -87, whose exp is under 1.7e-38 of the
 * head's largest probability, give 0.
 *
 * (row, kv head) pairs may be split over two threads at the middle of the work (positions
 * summed); each pair is computed the same way on either, so the thread count does not
 * change the result. AVX2 and FMA only: the library is not built for other CPUs.
 */
#include "cpu_kernels.h"
#include <math.h>
#include <stdlib.h>

#define HEADS_AT_ONCE 4
#define EXP_MIN_ARGUMENT -87.0f

typedef struct {
  const float* q;
  const float* key_pool;
  const float* value_pool;
  const int32_t* block_tables;
  const int32_t* context_lengths;
  float* out;
  int64_t q_heads, kv_heads, head_dim, value_dim, max_blocks, block_size;
  int64_t longest;
  float scale;
  int64_t first_pair, last_pair;
} Share;

/* The eight values at p, or the `left` (< 8) there and zeros. */
static inline __m256 load_chunk(const float* p, int64_t left) {
  return left >= LANES ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_below(left));
}

static inline void store_chunk(float* p, int64_t left, __m256 v) {
  if (left >= LANES)
    _mm256_storeu_ps(p, v);
  else
    _mm256_maskstore_ps(p, lanes_below(left), v);
}

static inline float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

static inline __m256 exp_non_positive(__m256 t) {
  const __m256 lowest = _mm256_set1_ps(EXP_MIN_ARGUMENT);
  const __m256 below = _mm256_cmp_ps(t, lowest, _CMP_LT_OQ);
  t = _mm256_max_ps(t, lowest);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), t);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  const __m256 power = _mm256_castsi256_ps(_mm256_slli_epi32(exponent, 23));
  return _mm256_andnot_ps(below, _mm256_mul_ps(p, power));
}

/* scores[j * stride + p] = q_j . key(p) for `heads` (<= HEADS_AT_ONCE, a constant where
 * inlined) query heads `q` (head_dim padded to whole chunks with zeros, `padded` apart). */
static inline __attribute__((always_inline)) void score_heads(
    const int heads, const Share* s, const int32_t* table, int64_t length, int64_t h,
    const float* q, int64_t padded, float* scores, int64_t stride) {
  const int64_t D = s->head_dim, bs = s->block_size, step = s->kv_heads * D;
  int64_t position = 0;
  for (int64_t b = 0; position < length; ++b) {
    const int64_t count = length - position < bs ? length - position : bs;
    const float* key = s->key_pool + ((int64_t)table[b] * bs * s->kv_heads + h) * D;
    for (int64_t i = 0; i < count; ++i, ++position, key += step) {
      __m256 acc[HEADS_AT_ONCE];
      for (int j = 0; j < heads; ++j) acc[j] = _mm256_setzero_ps();
      for (int64_t c = 0; c < D; c += LANES) {
        const __m256 k = load_chunk(key + c, D - c);
        for (int j = 0; j < heads; ++j)
          acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * padded + c), k, acc[j]);
      }
      for (int j = 0; j < heads; ++j) scores[j * stride + position] = horizontal_sum(acc[j]);
    }
  }
}

/* out_j = sum_p probabilities[j * stride + p] * value(p), sixteen values at a time. */
static inline __attribute__((always_inline)) void weigh_values(
    const int heads, const Share* s, const int32_t* table, int64_t length, int64_t h,
    const float* probabilities, int64_t stride, float* out) {
  const int64_t Dv = s->value_dim, bs = s->block_size, step = s->kv_heads * Dv;
  for (int64_t c = 0; c < Dv; c += 2 * LANES) {
    __m256 low[HEADS_AT_ONCE], high[HEADS_AT_ONCE];
    for (int j = 0; j < heads; ++j) low[j] = high[j] = _mm256_setzero_ps();
    const int64_t left = Dv - c;
    int64_t position = 0;
    for (int64_t b = 0; position < length; ++b) {
      const int64_t count = length - position < bs ? length - position : bs;
      const float* value = s->value_pool + ((int64_t)table[b] * bs * s->kv_heads + h) * Dv + c;
      for (int64_t i = 0; i < count; ++i, ++position, value += step) {
        const __m256 v0 = load_chunk(value, left);
        const __m256 v1 = left > LANES ? load_chunk(value + LANES, left - LANES)
                                       : _mm256_setzero_ps();
        for (int j = 0; j < heads; ++j) {
          const __m256 w = _mm256_broadcast_ss(probabilities + j * stride + position);
          low[j] = _mm256_fmadd_ps(w, v0, low[j]);
          high[j] = _mm256_fmadd_ps(w, v1, high[j]);
        }
      }
    }
    for (int j = 0; j < heads; ++j) {
      store_chunk(out + j * Dv + c, left, low[j]);
      if (left > LANES) store_chunk(out + j * Dv + c + LANES, left - LANES, high[j]);
    }
  }
}

/* scores[0, length) become their softmax, in place (`stride` floats allocated). */
static void softmax(float* scores, int64_t length) {
  __m256 highest = _mm256_set1_ps(-INFINITY);
  for (int64_t p = 0; p < length; p += LANES) {
    const __m256i mask = lanes_below(length - p);
    const __m256 x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(scores + p),
                                      _mm256_castsi256_ps(mask));
    highest = _mm256_max_ps(highest, x);
  }
  const __m256 top = _mm256_set1_ps(horizontal_max(highest));
  __m256 total = _mm256_setzero_ps();
  for (int64_t p = 0; p < length; p += LANES) {
    const __m256 mask = _mm256_castsi256_ps(lanes_below(length - p));
    const __m256 e = _mm256_and_ps(
        mask, exp_non_positive(_mm256_sub_ps(_mm256_loadu_ps(scores + p), top)));
    _mm256_storeu_ps(scores + p, e);
    total = _mm256_add_ps(total, e);
  }
  const __m256 inverse = _mm256_set1_ps(1.0f / horizontal_sum(total));
  for (int64_t p = 0; p < length; p += LANES)
    _mm256_storeu_ps(scores + p, _mm256_mul_ps(_mm256_loadu_ps(scores + p), inverse));
}

static inline __attribute__((always_inline)) void attend_heads(
    const int heads, const Share* s, const int32_t* table, int64_t length, int64_t h,
    const float* q, int64_t padded, float* scores, int64_t stride, float* out) {
  score_heads(heads, s, table, length, h, q, padded, scores, stride);
  for (int j = 0; j < heads; ++j) softmax(scores + j * stride, length);
  weigh_values(heads, s, table, length, h, scores, stride, out);
}

static void attend_pair(const Share* s, int64_t pair, float* q, int64_t padded, float* scores,
                        int64_t stride) {
  const int64_t row = pair / s->kv_heads, h = pair % s->kv_heads;
  const int64_t group = s->q_heads / s->kv_heads, D = s->head_dim, Dv = s->value_dim;
  const int64_t length = s->context_lengths[row];
  const int64_t first_head = row * s->q_heads + h * group;
  float* out = s->out + first_head * Dv;
  if (length == 0) {
    for (int64_t i = 0; i < group * Dv; ++i) out[i] = 0.0f;
    return;
  }
  for (int64_t g = 0; g < group; ++g)
    for (int64_t i = 0; i < padded; ++i)
      q[g * padded + i] = i < D ? s->q[(first_head + g) * D + i] * s->scale : 0.0f;
  const int32_t* table = s->block_tables + row * s->max_blocks;
  for (int64_t g = 0; g < group; g += HEADS_AT_ONCE) {
    const float* qg = q + g * padded;
    float* og = out + g * Dv;
    switch (group - g < HEADS_AT_ONCE ? group - g : HEADS_AT_ONCE) {
      case 1: attend_heads(1, s, table, length, h, qg, padded, scores, stride, og); break;
      case 2: attend_heads(2, s, table, length, h, qg, padded, scores, stride, og); break;
      case 3: attend_heads(3, s, table, length, h, qg, padded, scores, stride, og); break;
      default: attend_heads(4, s, table, length, h, qg, padded, scores, stride, og); break;
    }
  }
}

/* Computes the share's pairs; returns its status through itself (NULL, or non-NULL when
 * its scratch could not be allocated). */
static void* compute_share(void* argument) {
  const Share* s = argument;
  const int64_t group = s->q_heads / s->kv_heads;
  const int64_t padded = (s->head_dim + LANES - 1) / LANES * LANES;
  const int64_t stride = (s->longest + LANES - 1) / LANES * LANES;
  const int64_t heads = group < HEADS_AT_ONCE ? group : HEADS_AT_ONCE;
  float* q = malloc(sizeof(float) * (size_t)(group * padded));
  float* scores = malloc(sizeof(float) * (size_t)(heads * stride + LANES));
  void* status = q == NULL || scores == NULL ? argument : NULL;
  if (status == NULL)
    for (int64_t pair = s->first_pair; pair < s->last_pair; ++pair)
      attend_pair(s, pair, q, padded, scores, stride);
  free(q);
  free(scores);
  return status;
}

/* The checks that keep every read inside the pools: each length within the table, each
 * block a row reads within `slots`. Sets *longest and *positions (all rows' lengths). */
static int check_rows(const int32_t* block_tables, const int32_t* context_lengths, int64_t rows,
                      int64_t max_blocks, int64_t block_size, int64_t slots, int64_t* longest,
                      int64_t* positions) {
  *longest = *positions = 0;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t length = context_lengths[row];
    if (length < 0 || length > max_blocks * block_size) return -1;
    for (int64_t b = 0; b * block_size < length; ++b) {
      const int64_t id = block_tables[row * max_blocks + b];
      const int64_t count = length - b * block_size < block_size ? length - b * block_size
                                                                 : block_size;
      if (id < 0 || id * block_size + count > slots) return -1;
    }
    if (length > *longest) *longest = length;
    *positions += length;
  }
  return 0;
}

/* q (rows, q_heads, head_dim), pools (slots, kv_heads, head_dim | value_dim), block_tables
 * (rows, max_blocks), context_lengths (rows), out (rows, q_heads, value_dim); a row of
 * length 0 gets zeros. Returns 0; -1 for sizes it does not take (q_heads not a multiple of
 * kv_heads, a dimension under 1, threads other than 1 and 2), a length past the table or
 * under 0, or a block past the pools, all checked before anything is written; -2 for no
 * memory. With two threads, one is started for the pairs of the second half of the
 * positions (the caller's thread computes the first), or none if it cannot be. */
int mlxcel_paged_decode_attention(const float* q, const float* key_pool, const float* value_pool,
                                  const int32_t* block_tables, const int32_t* context_lengths,
                                  float* out, int64_t rows, int64_t q_heads, int64_t kv_heads,
                                  int64_t head_dim, int64_t value_dim, int64_t max_blocks,
                                  int64_t block_size, int64_t slots, float scale, int threads) {
  if (rows < 0 || q_heads < 1 || kv_heads < 1 || q_heads % kv_heads || head_dim < 1 ||
      value_dim < 1 || max_blocks < 0 || block_size < 1 || slots < 0 ||
      (threads != 1 && threads != 2))
    return -1;
  int64_t longest, positions;
  if (check_rows(block_tables, context_lengths, rows, max_blocks, block_size, slots, &longest,
                 &positions))
    return -1;
  const int64_t pairs = rows * kv_heads;
  int64_t half = pairs;
  if (threads == 2) {
    int64_t done = 0;
    for (half = 0; half < pairs && 2 * done < positions * kv_heads; ++half)
      done += context_lengths[half / kv_heads];
  }
  Share first = {.q = q,
                 .key_pool = key_pool,
                 .value_pool = value_pool,
                 .block_tables = block_tables,
                 .context_lengths = context_lengths,
                 .out = out,
                 .q_heads = q_heads,
                 .kv_heads = kv_heads,
                 .head_dim = head_dim,
                 .value_dim = value_dim,
                 .max_blocks = max_blocks,
                 .block_size = block_size,
                 .longest = longest,
                 .scale = scale,
                 .first_pair = 0,
                 .last_pair = half};
  Share second = first;
  second.first_pair = half;
  second.last_pair = pairs;
  void* results[2];
  compute_on_two_threads(compute_share, &first, &second, half < pairs, results);
  return results[0] == NULL && results[1] == NULL ? 0 : -2;
}
