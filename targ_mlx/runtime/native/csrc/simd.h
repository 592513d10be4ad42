// Vector helpers shared by the kernels: a fast exp and horizontal sums.
//
// exp: Cody-Waite range reduction and a degree-6 polynomial, ~1 ulp on [-87, 88]; the libm
// exp is scalar, which made MLX's softmax the slowest part of a decode step on CPU.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__AVX512F__)
#define TARG_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define TARG_AVX2 1
#include <immintrin.h>
#endif

namespace targ {

inline float exp_scalar(float x) { return std::exp(x); }

#if TARG_AVX512
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.3f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}
inline float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }

// 16 outputs of SwiGLU: g / (1 + exp(-g)) * u (layers.h's swiglu, and the AMX products that
// finish with it: one formula, so the two give the same bits).
inline void swiglu16(const float* g, const float* u, float* o) {
  const __m512 gv = _mm512_loadu_ps(g);
  const __m512 sg = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
  _mm512_storeu_ps(o, _mm512_mul_ps(sg, _mm512_loadu_ps(u)));
}
#endif

// (AVX-512 machines have AVX2 too: encoder kernels use the 256-bit forms on both)
#if TARG_AVX2 || TARG_AVX512
inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n: add n to the exponent field
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// out[i] = exp(x[i] - shift); returns the sum (float lanes, then added in order).
inline float exp_sub_sum(const float* x, float shift, float* out, int n) {
  int i = 0;
  float total = 0.f;
#if TARG_AVX512
  __m512 acc = _mm512_setzero_ps(), s = _mm512_set1_ps(shift);
  for (; i + 16 <= n; i += 16) {
    __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    if (out) _mm512_storeu_ps(out + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  total = hsum512(acc);
#elif TARG_AVX2
  __m256 acc = _mm256_setzero_ps(), s = _mm256_set1_ps(shift);
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    if (out) _mm256_storeu_ps(out + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  total = hsum256(acc);
#endif
  for (; i < n; i++) {
    float e = exp_scalar(x[i] - shift);
    if (out) out[i] = e;
    total += e;
  }
  return total;
}

}  // namespace targ
