/* y = x w^T in float32 for a few rows of x, reading each weight from memory once, in AVX2
 * lanes with FMA.
 *
 * A BLAS GEMM copies ("packs") the whole weight into its own layout on every call, which
 * pays when many rows share the copy; at decode's few rows the copy is most of the
 * product's time. Here the outputs are taken four at a time: their four weight rows are
 * read once from memory and then, from the first-level cache, against every row of x,
 * three rows at a time (twelve accumulators of eight lanes).
 *
 * Each output y[m][o] is a sum over k in eight lanes, in order, then across the lanes (a K
 * not a multiple of eight ends with masked loads); the blocking never changes it. So a row's
 * result does not depend on the other rows of the batch, and one and two threads give the
 * same bits.
 */
#include "cpu_kernels.h"

#define ROW_BLOCK 3
#define OUTPUT_BLOCK 4

/* y[m][o] for `rows` rows of x and `outputs` outputs from o = 0 of the pointers given
 * (constants where inlined, so the accumulators stay in registers). */
static inline __attribute__((always_inline)) void tile(const int rows, const int outputs,
                                                       const float* x, const float* w,
                                                       float* y, int64_t n, int64_t k) {
  __m256 acc[ROW_BLOCK][OUTPUT_BLOCK];
  for (int m = 0; m < rows; ++m)
    for (int o = 0; o < outputs; ++o) acc[m][o] = _mm256_setzero_ps();
  const int64_t whole = k - k % LANES;
  for (int64_t i = 0; i < whole; i += LANES) {
    __m256 wv[OUTPUT_BLOCK];
    for (int o = 0; o < outputs; ++o) wv[o] = _mm256_loadu_ps(w + o * k + i);
    for (int m = 0; m < rows; ++m) {
      const __m256 xv = _mm256_loadu_ps(x + m * k + i);
      for (int o = 0; o < outputs; ++o) acc[m][o] = _mm256_fmadd_ps(xv, wv[o], acc[m][o]);
    }
  }
  if (whole < k) {
    const __m256i mask = lanes_below(k - whole);
    __m256 wv[OUTPUT_BLOCK];
    for (int o = 0; o < outputs; ++o) wv[o] = _mm256_maskload_ps(w + o * k + whole, mask);
    for (int m = 0; m < rows; ++m) {
      const __m256 xv = _mm256_maskload_ps(x + m * k + whole, mask);
      for (int o = 0; o < outputs; ++o) acc[m][o] = _mm256_fmadd_ps(xv, wv[o], acc[m][o]);
    }
  }
  for (int m = 0; m < rows; ++m)
    for (int o = 0; o < outputs; ++o) y[m * n + o] = horizontal_sum(acc[m][o]);
}

#define TILE_CASE(ROWS, OUTPUTS) \
  case OUTPUTS:                  \
    tile(ROWS, OUTPUTS, x, w, y, n, k); \
    return;

#define TILES(ROWS)                                                             \
  case ROWS:                                                                    \
    switch (outputs) { TILE_CASE(ROWS, 1) TILE_CASE(ROWS, 2) TILE_CASE(ROWS, 3) \
                       TILE_CASE(ROWS, 4) }                                     \
    return;

static void tile_of(int rows, int outputs, const float* x, const float* w, float* y,
                    int64_t n, int64_t k) {
  switch (rows) { TILES(1) TILES(2) TILES(3) }
}

/* One thread's share of a product: outputs [first, last) for every row of x. */
typedef struct {
  const float* x;
  const float* w;
  float* y;
  int64_t rows, first, last, n, k;
} Share;

static void* compute_share(void* argument) {
  const Share* s = argument;
  for (int64_t o = s->first; o < s->last; o += OUTPUT_BLOCK) {
    const int outputs = s->last - o < OUTPUT_BLOCK ? (int)(s->last - o) : OUTPUT_BLOCK;
    for (int64_t m = 0; m < s->rows; m += ROW_BLOCK) {
      const int rows = s->rows - m < ROW_BLOCK ? (int)(s->rows - m) : ROW_BLOCK;
      tile_of(rows, outputs, s->x + m * s->k, s->w + o * s->k, s->y + m * s->n + o, s->n,
              s->k);
    }
  }
  return NULL;
}

/* y (rows x n) = x (rows x k) times w (n x k) transposed, all row-major float32. Returns 0,
 * or -1 for sizes the kernel does not take (rows < 1, n < 0, k < 1, threads other than 1
 * and 2). With two threads, one is started for the second half of the outputs (the
 * caller's thread computes the first), or none if it cannot be. */
int mlxcel_dense_matvec(const float* x, const float* w, float* y, int64_t rows, int64_t n,
                        int64_t k, int threads) {
  if (rows < 1 || n < 0 || k < 1 || (threads != 1 && threads != 2)) return -1;
  /* The halves start at a whole block of outputs, so neither shares a tile. */
  const int64_t half = threads == 2 ? n / 2 - n / 2 % OUTPUT_BLOCK : n;
  Share first = {x, w, y, rows, 0, half, n, k};
  Share second = first;
  second.first = half;
  second.last = n;
  void* results[2];
  compute_on_two_threads(compute_share, &first, &second, half < n, results);
  return 0;
}
