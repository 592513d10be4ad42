// The three encoder-only layers a BERT sentence encoder (MiniLM) needs beyond its matrix
// products: exact-erf GELU, LayerNorm with its residual, and bidirectional attention over
// padded rows. MLX's CPU backend runs them as composite ops (erf alone took 227 ms of a 32-chunk
// batch's 510 ms per layer on 2 AVX2 cores); here each is one pass over the data.
//
// Every row's result depends only on that row (and, for attention, its own sequence's first
// `length` tokens), so a passage gets the same vector whatever it is batched or padded with.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pool.h"
#include "simd.h"

namespace targ {

// erf by Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7, float32's own resolution near 1).
constexpr float kErfP = 0.3275911f, kErfA1 = 0.254829592f, kErfA2 = -0.284496736f, kErfA3 = 1.421413741f,
                kErfA4 = -1.453152027f, kErfA5 = 1.061405429f;

inline float gelu_scalar(float x) {
  float z = std::fabs(x) * 0.70710678118654752f;
  float t = 1.f / (1.f + kErfP * z);
  float y = 1.f - (((((kErfA5 * t + kErfA4) * t) + kErfA3) * t + kErfA2) * t + kErfA1) * t * std::exp(-z * z);
  return 0.5f * x * (1.f + (x < 0 ? -y : y));
}

// out = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), the GELU BERT was trained with.
inline void gelu_erf(const float* x, size_t n, float* out) {
  auto body = [&](int b, int e) {
    size_t i = (size_t)b * 8, end = std::min(n, (size_t)e * 8);
#if TARG_AVX2 || TARG_AVX512
    const __m256 sign = _mm256_set1_ps(-0.f), one = _mm256_set1_ps(1.f), half = _mm256_set1_ps(0.5f);
    for (; i + 8 <= end; i += 8) {
      __m256 v = _mm256_loadu_ps(x + i);
      __m256 z = _mm256_mul_ps(_mm256_andnot_ps(sign, v), _mm256_set1_ps(0.70710678118654752f));
      __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(kErfP), z, one));
      __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(kErfA5), t, _mm256_set1_ps(kErfA4));
      p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kErfA3));
      p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kErfA2));
      p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(kErfA1));
      p = _mm256_mul_ps(p, t);
      __m256 y = _mm256_fnmadd_ps(p, exp256(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(z, z))), one);
      y = _mm256_or_ps(y, _mm256_and_ps(sign, v));  // erf is odd: take x's sign
      _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, y)));
    }
#endif
    for (; i < end; i++) out[i] = gelu_scalar(x[i]);
  };
  int blocks = (int)((n + 7) / 8);
  if (n >= (1 << 15)) parallel_range(blocks, 1, 1024, body);
  else body(0, blocks);
}

// y = LayerNorm(x + r) * w + b per row of H (r may be null). Sums run in double: H is small and
// the mean of a residual stream can be large next to its spread.
inline void layer_norm(const float* x, const float* r, const float* w, const float* b, float eps, int rows, int H,
                       float* y) {
  auto body = [&](int r0, int r1) {
    std::vector<float> h(H);
    for (int row = r0; row < r1; row++) {
      const float* xr = x + (size_t)row * H;
      const float* rr = r ? r + (size_t)row * H : nullptr;
      double s = 0;
      for (int j = 0; j < H; j++) {
        h[j] = rr ? xr[j] + rr[j] : xr[j];
        s += h[j];
      }
      float mean = (float)(s / H);
      double v = 0;
      for (int j = 0; j < H; j++) {
        float d = h[j] - mean;
        v += (double)d * d;
      }
      float rstd = (float)(1.0 / std::sqrt(v / H + eps));
      float* yr = y + (size_t)row * H;
      for (int j = 0; j < H; j++) yr[j] = (h[j] - mean) * rstd * w[j] + b[j];
    }
  };
  if ((long)rows * H >= (1 << 14)) parallel_range(rows, 1, 16, body);
  else body(0, rows);
}

// Bidirectional attention for one batch of padded sequences.
//   qkv (B, L, 3 * NH * D): each token's [q heads | k heads | v heads], as one linear makes them
//   lengths (B): real tokens of each row; positions >= length are padding, attended by nobody
//   out (B, L, NH * D): softmax(scale * q k^T) v per head; padding rows are zero
inline void bidir_attention(const float* qkv, const int32_t* lengths, int B, int L, int NH, int D, float scale,
                            float* out) {
  const int H = NH * D, W = 3 * H;
  auto body = [&](int t0, int t1) {
    std::vector<float> kt, v, s;
    for (int task = t0; task < t1; task++) {
      const int bi = task / NH, h = task % NH;
      const int n = std::max(0, std::min(L, (int)lengths[bi]));
      const float* base = qkv + (size_t)bi * L * W;
      float* ob = out + (size_t)bi * L * H + h * D;
      for (int i = n; i < L; i++) std::memset(ob + (size_t)i * H, 0, D * sizeof(float));
      if (n == 0) continue;
      const int n8 = (n + 7) / 8 * 8;
      kt.assign((size_t)D * n8, 0.f);  // keys transposed: kt[d * n8 + j] = k_j[d]
      v.resize((size_t)n * D);
      s.resize(n8);
      for (int j = 0; j < n; j++) {
        const float* kj = base + (size_t)j * W + H + h * D;
        for (int d = 0; d < D; d++) kt[(size_t)d * n8 + j] = kj[d];
        std::memcpy(v.data() + (size_t)j * D, kj + H, D * sizeof(float));
      }
      for (int i = 0; i < n; i++) {
        const float* q = base + (size_t)i * W + h * D;
        float* o = ob + (size_t)i * H;
        int j = 0;
#if TARG_AVX2 || TARG_AVX512
        for (; j + 32 <= n8; j += 32) {  // four key blocks: four independent FMA chains
          __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
          for (int d = 0; d < D; d++) {
            __m256 qd = _mm256_set1_ps(q[d]);
            const float* kr = kt.data() + (size_t)d * n8 + j;
            a0 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kr), a0);
            a1 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kr + 8), a1);
            a2 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kr + 16), a2);
            a3 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kr + 24), a3);
          }
          _mm256_storeu_ps(s.data() + j, a0);
          _mm256_storeu_ps(s.data() + j + 8, a1);
          _mm256_storeu_ps(s.data() + j + 16, a2);
          _mm256_storeu_ps(s.data() + j + 24, a3);
        }
        for (; j < n8; j += 8) {
          __m256 a0 = _mm256_setzero_ps();
          for (int d = 0; d < D; d++)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), _mm256_loadu_ps(kt.data() + (size_t)d * n8 + j), a0);
          _mm256_storeu_ps(s.data() + j, a0);
        }
#else
        for (; j < n; j++) {
          float a = 0;
          for (int d = 0; d < D; d++) a += q[d] * kt[(size_t)d * n8 + j];
          s[j] = a;
        }
#endif
        float mx = -INFINITY;
        for (j = 0; j < n; j++) mx = std::max(mx, s[j] *= scale);
        float sum = exp_sub_sum(s.data(), mx, s.data(), n);
        float inv = 1.f / sum;
        int d = 0;
#if TARG_AVX2 || TARG_AVX512
        for (; d + 16 <= D; d += 16) {  // two key parities: independent chains
          __m256 e0 = _mm256_setzero_ps(), e1 = e0, f0 = e0, f1 = e0;
          int jj = 0;
          for (; jj + 2 <= n; jj += 2) {
            __m256 p0 = _mm256_set1_ps(s[jj]), p1 = _mm256_set1_ps(s[jj + 1]);
            const float* v0 = v.data() + (size_t)jj * D + d;
            e0 = _mm256_fmadd_ps(p0, _mm256_loadu_ps(v0), e0);
            e1 = _mm256_fmadd_ps(p0, _mm256_loadu_ps(v0 + 8), e1);
            f0 = _mm256_fmadd_ps(p1, _mm256_loadu_ps(v0 + D), f0);
            f1 = _mm256_fmadd_ps(p1, _mm256_loadu_ps(v0 + D + 8), f1);
          }
          if (jj < n) {
            __m256 p0 = _mm256_set1_ps(s[jj]);
            const float* v0 = v.data() + (size_t)jj * D + d;
            e0 = _mm256_fmadd_ps(p0, _mm256_loadu_ps(v0), e0);
            e1 = _mm256_fmadd_ps(p0, _mm256_loadu_ps(v0 + 8), e1);
          }
          __m256 iv = _mm256_set1_ps(inv);
          _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_add_ps(e0, f0), iv));
          _mm256_storeu_ps(o + d + 8, _mm256_mul_ps(_mm256_add_ps(e1, f1), iv));
        }
#endif
        for (; d < D; d++) {
          float a = 0;
          for (int jj = 0; jj < n; jj++) a += s[jj] * v[(size_t)jj * D + d];
          o[d] = a * inv;
        }
      }
    }
  };
  parallel_range(B * NH, 1, 1, body);
}

}  // namespace targ
