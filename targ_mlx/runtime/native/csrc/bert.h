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

#if TARG_AVX512
// gelu_scalar's operations 16 lanes at a time (the same bits: exp512 scales by 2^n exactly); inline
// for the products that apply it to a tile's outputs while they are in registers.
inline __m512 gelu512(__m512 v) {
  const __m512 one = _mm512_set1_ps(1.f), half = _mm512_set1_ps(0.5f);
  __m512 z = _mm512_mul_ps(_mm512_abs_ps(v), _mm512_set1_ps(0.70710678118654752f));
  __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(kErfP), z, one));
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(kErfA5), t, _mm512_set1_ps(kErfA4));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kErfA3));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kErfA2));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(kErfA1));
  p = _mm512_mul_ps(p, t);
  __m512 y = _mm512_fnmadd_ps(p, exp512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(z, z))), one);
  y = _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_castps_si512(y), _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN))));
  return _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, y));
}
#endif

// out = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), the GELU BERT was trained with.
inline void gelu_erf(const float* x, size_t n, float* out) {
  auto body = [&](int b, int e) {
    size_t i = (size_t)b * 8, end = std::min(n, (size_t)e * 8);
#if TARG_AVX512
    for (; i + 16 <= end; i += 16) _mm512_storeu_ps(out + i, gelu512(_mm512_loadu_ps(x + i)));
#endif
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
// the mean of a residual stream can be large next to its spread. A row's sums are one chain of
// dependent adds in k order; RN rows' chains run side by side (the same order per row, so the
// same bits), where one chain at a time waited ~4 cycles an element (a 384-wide row: 3 us).
inline void layer_norm(const float* x, const float* r, const float* w, const float* b, float eps, int rows, int H,
                       float* y) {
  constexpr int RN = 8;
  auto body = [&](int r0, int r1) {
    std::vector<float> hb((size_t)RN * H);
    for (int row = r0; row < r1; row += RN) {
      const int rn = std::min(RN, r1 - row);
      float* h[RN];
      double s[RN] = {}, v[RN] = {};
      for (int i = 0; i < rn; i++) {
        h[i] = hb.data() + (size_t)i * H;
        const float* xr = x + (size_t)(row + i) * H;
        const float* rr = r ? r + (size_t)(row + i) * H : nullptr;
        for (int j = 0; j < H; j++) h[i][j] = rr ? xr[j] + rr[j] : xr[j];
      }
      for (int i = rn; i < RN; i++) h[i] = h[0];  // idle chains (their sums unused)
      for (int j = 0; j < H; j++)
        for (int i = 0; i < RN; i++) s[i] += h[i][j];
      float mean[RN];
      for (int i = 0; i < RN; i++) mean[i] = (float)(s[i] / H);
      for (int j = 0; j < H; j++)
        for (int i = 0; i < RN; i++) {
          float d = h[i][j] - mean[i];
          v[i] += (double)d * d;
        }
      for (int i = 0; i < rn; i++) {
        float rstd = (float)(1.0 / std::sqrt(v[i] / H + eps));
        float* yr = y + (size_t)(row + i) * H;
        for (int j = 0; j < H; j++) yr[j] = (h[i][j] - mean[i]) * rstd * w[j] + b[j];
      }
    }
  };
  if ((long)rows * H >= (1 << 14)) parallel_range((rows + RN - 1) / RN, 1, 2, [&](int a, int e) { body(a * RN, std::min(rows, e * RN)); });
  else body(0, rows);
}

#if TARG_AVX2 || TARG_AVX512
// QN query rows of one head against its n keys, 16 keys (scores) or 16 dimensions (values) at a
// time: each key or value load feeds QN rows' FMAs (one row at a time was bound by the loads,
// one load an FMA), and QN x 2 accumulators are independent chains. Rows stay independent: a
// row's sums run in the same order whichever rows share its group.
template <int QN>
inline void attend_rows(const float* const* q, float* const* o, const float* kt, int n16, const float* v, int n,
                        int D, float scale, float* s /* QN x n16 */) {
  for (int j = 0; j < n16; j += 16) {
    __m256 acc[QN][2];
    for (int r = 0; r < QN; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int d = 0; d < D; d++) {
      const float* kr = kt + (size_t)d * n16 + j;
      __m256 k0 = _mm256_loadu_ps(kr), k1 = _mm256_loadu_ps(kr + 8);
      for (int r = 0; r < QN; r++) {
        __m256 qd = _mm256_set1_ps(q[r][d]);
        acc[r][0] = _mm256_fmadd_ps(qd, k0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(qd, k1, acc[r][1]);
      }
    }
    for (int r = 0; r < QN; r++) {
      _mm256_storeu_ps(s + (size_t)r * n16 + j, acc[r][0]);
      _mm256_storeu_ps(s + (size_t)r * n16 + j + 8, acc[r][1]);
    }
  }
  float inv[QN];
  for (int r = 0; r < QN; r++) {
    float* sr = s + (size_t)r * n16;
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) mx = std::max(mx, sr[j] *= scale);
    inv[r] = 1.f / exp_sub_sum(sr, mx, sr, n);
  }
  int d = 0;
  for (; d + 16 <= D; d += 16) {
    __m256 acc[QN][2];
    for (int r = 0; r < QN; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
      const float* vj = v + (size_t)j * D + d;
      __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8);
      for (int r = 0; r < QN; r++) {
        __m256 p = _mm256_set1_ps(s[(size_t)r * n16 + j]);
        acc[r][0] = _mm256_fmadd_ps(p, v0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(p, v1, acc[r][1]);
      }
    }
    for (int r = 0; r < QN; r++) {
      __m256 iv = _mm256_set1_ps(inv[r]);
      _mm256_storeu_ps(o[r] + d, _mm256_mul_ps(acc[r][0], iv));
      _mm256_storeu_ps(o[r] + d + 8, _mm256_mul_ps(acc[r][1], iv));
    }
  }
  for (; d < D; d++)
    for (int r = 0; r < QN; r++) {
      float a = 0;
      for (int j = 0; j < n; j++) a += s[(size_t)r * n16 + j] * v[(size_t)j * D + d];
      o[r][d] = a * inv[r];
    }
}
#endif

// The tasks of a batch's attention (below, and bf16gemm.h's), one per (sequence, head) over the
// pool; then fn(buffers, n, the sequence's qkv, the head's first output, head) where it has n > 0
// tokens. One `Buffers` per range of tasks. Padded (B, L): sequence b's rows start at b * L and
// its outputs past lengths[b] are zeroed. Packed (`packed`: the sequences' rows one after another,
// lengths summing to the rows): no padding is computed at all (a batch of 20 search results was
// a fifth padding, and every product, norm and GELU paid for it).
template <class Buffers, class F>
inline void for_each_row_head(const float* qkv, const int32_t* lengths, int B, int L, bool packed, int NH, int D,
                              float* out, const F& fn) {
  const int H = NH * D;
  std::vector<size_t> start(B);
  for (size_t b = 0, s = 0; b < (size_t)B; b++) {
    start[b] = packed ? s : b * L;
    s += std::max(0, (int)lengths[b]);
  }
  parallel_range(B * NH, 1, 1, [&](int t0, int t1) {
    Buffers buf;
    for (int task = t0; task < t1; task++) {
      const int bi = task / NH, h = task % NH;
      const int n = packed ? std::max(0, (int)lengths[bi]) : std::max(0, std::min(L, (int)lengths[bi]));
      float* ob = out + start[bi] * H + h * D;
      if (!packed)
        for (int i = n; i < L; i++) std::memset(ob + (size_t)i * H, 0, D * sizeof(float));
      if (n > 0) fn(buf, n, qkv + start[bi] * 3 * H, ob, h);
    }
  });
}

// Bidirectional attention for one batch of padded sequences.
//   qkv (B, L, 3 * NH * D): each token's [q heads | k heads | v heads], as one linear makes them
//   lengths (B): real tokens of each row; positions >= length are padding, attended by nobody
//   out (B, L, NH * D): softmax(scale * q k^T) v per head; padding rows are zero
//   packed: qkv (T, 3 * NH * D) and out (T, NH * D), the B sequences' rows one after another
inline void bidir_attention(const float* qkv, const int32_t* lengths, int B, int L, bool packed, int NH, int D,
                            float scale, float* out) {
  constexpr int QN = 4;  // query rows a pass over the keys serves
  const int H = NH * D, W = 3 * H;
  struct Buffers {
    std::vector<float> kt, v, s;
  };
  for_each_row_head<Buffers>(qkv, lengths, B, L, packed, NH, D, out, [&](Buffers& buf, int n, const float* base, float* ob, int h) {
      auto& [kt, v, s] = buf;
      const int n16 = (n + 15) / 16 * 16;
      kt.assign((size_t)D * n16, 0.f);  // keys transposed: kt[d * n16 + j] = k_j[d]
      v.resize((size_t)n * D);
      s.resize((size_t)QN * n16);
      for (int j = 0; j < n; j++) {
        const float* kj = base + (size_t)j * W + H + h * D;
        for (int d = 0; d < D; d++) kt[(size_t)d * n16 + j] = kj[d];
        std::memcpy(v.data() + (size_t)j * D, kj + H, D * sizeof(float));
      }
      for (int i = 0; i < n; i += QN) {
        const int qn = std::min(QN, n - i);
        const float* qs[QN];
        float* os[QN];
        for (int r = 0; r < qn; r++) {
          qs[r] = base + (size_t)(i + r) * W + h * D;
          os[r] = ob + (size_t)(i + r) * H;
        }
#if TARG_AVX2 || TARG_AVX512
        switch (qn) {
          case 4: attend_rows<4>(qs, os, kt.data(), n16, v.data(), n, D, scale, s.data()); break;
          case 3: attend_rows<3>(qs, os, kt.data(), n16, v.data(), n, D, scale, s.data()); break;
          case 2: attend_rows<2>(qs, os, kt.data(), n16, v.data(), n, D, scale, s.data()); break;
          default: attend_rows<1>(qs, os, kt.data(), n16, v.data(), n, D, scale, s.data()); break;
        }
#else
        for (int r = 0; r < qn; r++) {
          float* sr = s.data();
          float mx = -INFINITY;
          for (int j = 0; j < n; j++) {
            float a = 0;
            for (int d = 0; d < D; d++) a += qs[r][d] * kt[(size_t)d * n16 + j];
            mx = std::max(mx, sr[j] = a * scale);
          }
          float inv = 1.f / exp_sub_sum(sr, mx, sr, n);
          for (int d = 0; d < D; d++) {
            float a = 0;
            for (int j = 0; j < n; j++) a += sr[j] * v[(size_t)j * D + d];
            os[r][d] = a * inv;
          }
        }
#endif
      }
  });
}

}  // namespace targ
