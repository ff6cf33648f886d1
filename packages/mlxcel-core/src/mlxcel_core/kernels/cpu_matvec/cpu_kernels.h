/* What the CPU kernels share: AVX2 lane helpers and the split of a call's work over two
 * threads. Every source of this folder is built into one library (native.py), whose name
 * hashes this header with them. */
#ifndef MLXCEL_CPU_KERNELS_H
#define MLXCEL_CPU_KERNELS_H

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "the CPU kernels need AVX2 and FMA"
#endif

#define LANES 8

/* The sum of v's eight lanes. */
static inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

/* A mask of the lanes below min(left, LANES), for masked loads and stores. */
static inline __m256i lanes_below(int64_t left) {
  const int count = left < LANES ? (int)left : LANES;
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* compute(first) on the calling thread and, when `second_has_work`, compute(second) on a
 * thread started for it, or after the first where none can be started; their results in
 * results[0] and results[1] (NULL for a second without work). */
static inline void compute_on_two_threads(void* (*compute)(void*), void* first, void* second,
                                          int second_has_work, void* results[2]) {
  pthread_t helper;
  results[1] = NULL;
  const int started = second_has_work && pthread_create(&helper, NULL, compute, second) == 0;
  results[0] = compute(first);
  if (started)
    pthread_join(helper, &results[1]);
  else if (second_has_work)
    results[1] = compute(second);
}

#endif
