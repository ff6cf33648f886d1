/* The SwiGLU activation out = silu(gate) * up = gate / (1 + exp(-gate)) * up, float32,
 * eight lanes at a time in AVX2 with FMA.
 *
 * exp is computed for non-positive arguments only, t = -|gate|, so it never overflows:
 * silu(g) = g / (1 + e) for g >= 0 and g * e / (1 + e) for g < 0, with e = exp(-|g|).
 * t is clamped at ln(2^-150), under which exp rounds to 0: there a negative gate gives 0
 * (the exact silu(g) is under 1e-43 in magnitude) and a positive one gives g. NaN stays
 * NaN, +inf gives inf, -inf gives 0.
 *
 * exp(t): t = n ln2 + r with n = round(t / ln2) and ln2 split in two constants so r
 * keeps nearly all its bits (Cody-Waite), then exp(r) by a degree-5 polynomial on |r| <= ln2 / 2 and 2^n by building
 * floats' exponent fields. Coefficients from Cephes' expf.c (Stephen L. Moshier, Cephes
 * Math Library 2.2), as in sse_mathfun / avx_mathfun; about 1 ulp. With the roundings of
 * the division and products, the result is within 3.5e-7 relative of the exact value
 * where silu(gate) is a normal float (MLX's float32 `sigmoid(g) * g * u`: 1.6e-6 for gates
 * of a few units, and 0 below about -88).
 *
 * Elements are handled identically however the work is split (a tail under eight elements
 * takes masked loads, not a scalar path), so one and two threads give the same bits.
 */
#include "cpu_kernels.h"
#include <stddef.h>

/* ln(2^-150): below it exp(t) rounds to 0, and |silu(g)| = |g| exp(g) < 1e-43 for gates
 * under it. */
#define EXP_MIN_ARGUMENT -103.97208f

/* exp(t) for t in [EXP_MIN_ARGUMENT, 0], as p * 2^half * 2^rest: 2^n for n down to -150
 * is two normal floats, so values down to the smallest denormal come out rounded once. */
typedef struct {
  __m256 p, scale_half, scale_rest;
} Exp;

static inline Exp exp_non_positive(__m256 t) {
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 ln2_high = _mm256_set1_ps(0.693359375f);
  const __m256 ln2_low = _mm256_set1_ps(-2.12194440e-4f);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(t, log2e),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, ln2_high, t);
  r = _mm256_fnmadd_ps(n, ln2_low, r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i whole = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(whole, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  Exp e;
  e.p = p;
  e.scale_half = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  e.scale_rest = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(whole, half), bias), 23));
  return e;
}

static inline __m256 scaled(__m256 x, Exp e) {
  return _mm256_mul_ps(_mm256_mul_ps(x, e.scale_half), e.scale_rest);
}

static inline __m256 swiglu8(__m256 g, __m256 u) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 lowest = _mm256_set1_ps(EXP_MIN_ARGUMENT);
  /* max returns its second operand for a NaN gate: exp stays finite, the NaN is kept in g. */
  const __m256 t = _mm256_max_ps(_mm256_or_ps(g, sign), lowest);
  const Exp e = exp_non_positive(t);
  /* g * exp(-|g|) for a negative gate, scaled last so a denormal is rounded only once. */
  __m256 numerator = _mm256_blendv_ps(g, scaled(_mm256_mul_ps(g, e.p), e), g);
  numerator = _mm256_andnot_ps(_mm256_cmp_ps(g, lowest, _CMP_LT_OQ), numerator);
  const __m256 silu =
      _mm256_div_ps(numerator, _mm256_add_ps(scaled(e.p, e), _mm256_set1_ps(1.0f)));
  return _mm256_mul_ps(silu, u);
}

typedef struct {
  const float* gate;
  const float* up;
  float* out;
  size_t n;
} Share;

static void* compute_share(void* argument) {
  const Share* s = argument;
  size_t i = 0;
  for (; i + LANES <= s->n; i += LANES)
    _mm256_storeu_ps(s->out + i,
                     swiglu8(_mm256_loadu_ps(s->gate + i), _mm256_loadu_ps(s->up + i)));
  if (i < s->n) {
    const int left = (int)(s->n - i);
    const __m256i mask = lanes_below(left);
    const __m256 g = _mm256_maskload_ps(s->gate + i, mask);
    const __m256 u = _mm256_maskload_ps(s->up + i, mask);
    _mm256_maskstore_ps(s->out + i, mask, swiglu8(g, u));
  }
  return NULL;
}

/* out[i] = silu(gate[i]) * up[i] for i < n. Returns 0, or -1 for threads other than 1 and
 * 2. With two threads, one is started for the second half (the caller's thread computes
 * the first), or none if it cannot be. */
int mlxcel_swiglu(const float* gate, const float* up, float* out, size_t n, int threads) {
  if (threads != 1 && threads != 2) return -1;
  const size_t half = threads == 2 ? n / 2 / LANES * LANES : n;
  Share first = {gate, up, out, half};
  Share second = {gate + half, up + half, out + half, n - half};
  void* results[2];
  compute_on_two_threads(compute_share, &first, &second, half < n, results);
  return 0;
}
