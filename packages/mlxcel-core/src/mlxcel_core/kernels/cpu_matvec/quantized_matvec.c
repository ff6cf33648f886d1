/* y = x @ W.T for a few rows of float32 activations x (rows, k) and a weight W (n, k) in
 * MLX's affine quantization: uint32 words of 32 / bits levels, level j of a word at bits
 * [j * bits, (j + 1) * bits), w = scale * level + bias per group of `group_size` values,
 * scales and biases float32 (n, k / group_size).
 *
 * Per group, sum_i w_i x_i = scale * sum_i level_i x_i + bias * sum_i x_i: the levels are
 * widened eight at a time into float lanes and multiplied with x, the bias term uses the
 * group's sum of x, computed once per call. Each packed weight is read once for all rows.
 * The outputs may be split over two threads (the caller's and one more), each computing
 * half of them. AVX2 and FMA only: the library is not built for other CPUs.
 */
#include "cpu_kernels.h"
#include <stdlib.h>

#define MAX_BLOCK_ROWS 4

/* Eight levels starting at word `p`, as floats. */
static inline __m256 levels4(const uint32_t* p) {
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)p[0]), shifts);
  return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
}

static inline __m256 levels8(const uint32_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

/* Outputs [first, last) of n for `block` rows of x at once (block <= MAX_BLOCK_ROWS, a
 * constant where inlined), two accumulators a row so consecutive chunks do not wait on each
 * other. */
static inline __attribute__((always_inline)) void rows_block(
    const int bits, const int block, const float* x, const float* xsum, const uint32_t* w,
    const float* scales, const float* biases, float* y, int first, int last, int n, int k,
    int group_size) {
  const int groups = k / group_size;
  const int chunks = group_size / 8;
  const int words_per_chunk = bits / 4;
  const int words_per_row = k * bits / 32;
  for (int o = first; o < last; ++o) {
    const uint32_t* row = w + (size_t)o * words_per_row;
    const float* scale = scales + (size_t)o * groups;
    const float* bias = biases + (size_t)o * groups;
    __m256 acc[MAX_BLOCK_ROWS];
    float bias_acc[MAX_BLOCK_ROWS];
    for (int m = 0; m < block; ++m) {
      acc[m] = _mm256_setzero_ps();
      bias_acc[m] = 0.0f;
    }
    for (int g = 0; g < groups; ++g) {
      __m256 even[MAX_BLOCK_ROWS], odd[MAX_BLOCK_ROWS];
      for (int m = 0; m < block; ++m) even[m] = odd[m] = _mm256_setzero_ps();
      const uint32_t* words = row + (size_t)g * chunks * words_per_chunk;
      for (int c = 0; c < chunks; c += 2) {
        const __m256 l0 = bits == 4 ? levels4(words + c) : levels8(words + 2 * c);
        const __m256 l1 = bits == 4 ? levels4(words + c + 1) : levels8(words + 2 * c + 2);
        for (int m = 0; m < block; ++m) {
          const float* xc = x + (size_t)m * k + g * group_size + c * 8;
          even[m] = _mm256_fmadd_ps(l0, _mm256_loadu_ps(xc), even[m]);
          odd[m] = _mm256_fmadd_ps(l1, _mm256_loadu_ps(xc + 8), odd[m]);
        }
      }
      const __m256 s = _mm256_set1_ps(scale[g]);
      for (int m = 0; m < block; ++m) {
        acc[m] = _mm256_fmadd_ps(s, _mm256_add_ps(even[m], odd[m]), acc[m]);
        bias_acc[m] += bias[g] * xsum[(size_t)m * groups + g];
      }
    }
    for (int m = 0; m < block; ++m) y[(size_t)m * n + o] = horizontal_sum(acc[m]) + bias_acc[m];
  }
}

#define BLOCK_CASE(BITS, ROWS, GROUP)                                                    \
  case ROWS:                                                                              \
    rows_block(BITS, ROWS, x, xsum, w, scales, biases, y, first, last, n, k, GROUP);      \
    return;

#define BLOCKS(BITS, GROUP)                                                                \
  switch (block) {                                                                        \
    BLOCK_CASE(BITS, 1, GROUP) BLOCK_CASE(BITS, 2, GROUP) BLOCK_CASE(BITS, 3, GROUP)       \
    BLOCK_CASE(BITS, 4, GROUP)                                                            \
  }

/* MLX's group sizes, as constants so that the chunk loops unroll. */
#define GROUPS(BITS)                                                                       \
  switch (group_size) {                                                                   \
    case 32: BLOCKS(BITS, 32) break;                                                      \
    case 64: BLOCKS(BITS, 64) break;                                                      \
    case 128: BLOCKS(BITS, 128) break;                                                    \
  }

static void block_of(int bits, int block, const float* x, const float* xsum,
                     const uint32_t* w, const float* scales, const float* biases, float* y,
                     int first, int last, int n, int k, int group_size) {
  if (bits == 4) {
    GROUPS(4)
  } else {
    GROUPS(8)
  }
}

/* One thread's share of a product: outputs [first, last) for every row of x. */
typedef struct {
  const float* x;
  const float* xsum;
  const uint32_t* w;
  const float* scales;
  const float* biases;
  float* y;
  int rows, first, last, n, k, bits, group_size;
} Share;

static void* compute_share(void* argument) {
  const Share* s = argument;
  const int groups = s->k / s->group_size;
  for (int m = 0; m < s->rows; m += MAX_BLOCK_ROWS) {
    const int block = s->rows - m < MAX_BLOCK_ROWS ? s->rows - m : MAX_BLOCK_ROWS;
    block_of(s->bits, block, s->x + (size_t)m * s->k, s->xsum + (size_t)m * groups, s->w,
             s->scales, s->biases, s->y + (size_t)m * s->n, s->first, s->last, s->n, s->k,
             s->group_size);
  }
  return NULL;
}

/* Returns 0, or -1 for a layout the kernel does not take (bits other than 4 and 8, a group
 * size other than 32, 64 and 128, k not a whole number of groups, rows < 1, threads other
 * than 1 and 2) or no memory. With two threads, one is started for the second half of the
 * outputs (the caller's thread computes the first), or none if it cannot be. */
int mlxcel_quantized_matvec(const float* x, const uint32_t* w, const float* scales,
                            const float* biases, float* y, int rows, int n, int k, int bits,
                            int group_size, int threads) {
  if ((bits != 4 && bits != 8) || (group_size != 32 && group_size != 64 && group_size != 128) ||
      k % group_size || rows < 1 || n < 0 || (threads != 1 && threads != 2))
    return -1;
  const int groups = k / group_size;
  float* xsum = malloc(sizeof(float) * (size_t)rows * groups);
  if (xsum == NULL) return -1;
  for (int m = 0; m < rows; ++m)
    for (int g = 0; g < groups; ++g) {
      float s = 0.0f;
      for (int i = 0; i < group_size; ++i) s += x[(size_t)m * k + g * group_size + i];
      xsum[(size_t)m * groups + g] = s;
    }
  const int half = threads == 2 ? n / 2 : n;
  Share first = {x, xsum, w, scales, biases, y, rows, 0, half, n, k, bits, group_size};
  Share second = first;
  second.first = half;
  second.last = n;
  void* results[2];
  compute_on_two_threads(compute_share, &first, &second, half < n, results);
  free(xsum);
  return 0;
}
