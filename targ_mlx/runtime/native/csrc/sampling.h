// One pass over a row of logits for everything a decode step needs: the next token (argmax, or a
// sample at temperature T by inverse CDF from a given uniform), and the gate statistics of the
// temperature-1 distribution: entropy, top-1 minus top-2 logit, log-probability of the token.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "pool.h"
#include "simd.h"

namespace targ {

struct RowStats {
  int32_t token;
  float entropy, gap, logprob;
};

// Top-2 values and the first index of the maximum.
inline void top2(const float* x, int n, float& m1, float& m2, int& arg) {
  m1 = -INFINITY, m2 = -INFINITY;
  int i = 0;
#if TARG_AVX512
  if (n >= 16) {
    __m512 a = _mm512_set1_ps(-INFINITY), b = a;
    for (; i + 16 <= n; i += 16) {
      __m512 v = _mm512_loadu_ps(x + i);
      b = _mm512_max_ps(b, _mm512_min_ps(a, v));
      a = _mm512_max_ps(a, v);
    }
    float la[16], lb[16];
    _mm512_storeu_ps(la, a);
    _mm512_storeu_ps(lb, b);
    for (int j = 0; j < 16; j++) {  // merge lane top-2s: a lane's max and second are both candidates
      for (float v : {la[j], lb[j]}) {
        if (v > m1) m2 = m1, m1 = v;
        else if (v > m2) m2 = v;
      }
    }
  }
#elif TARG_AVX2
  if (n >= 8) {
    __m256 a = _mm256_set1_ps(-INFINITY), b = a;
    for (; i + 8 <= n; i += 8) {
      __m256 v = _mm256_loadu_ps(x + i);
      b = _mm256_max_ps(b, _mm256_min_ps(a, v));
      a = _mm256_max_ps(a, v);
    }
    float la[8], lb[8];
    _mm256_storeu_ps(la, a);
    _mm256_storeu_ps(lb, b);
    for (int j = 0; j < 8; j++) {
      for (float v : {la[j], lb[j]}) {
        if (v > m1) m2 = m1, m1 = v;
        else if (v > m2) m2 = v;
      }
    }
  }
#endif
  for (; i < n; i++) {
    float v = x[i];
    if (v > m1) m2 = m1, m1 = v;
    else if (v > m2) m2 = v;
  }
  arg = 0;
  for (int j = 0; j < n; j++)
    if (x[j] == m1) {
      arg = j;
      break;
    }
}

// sum exp(x - m) and sum exp(x - m) * (x - m)
inline void exp_moments(const float* x, int n, float m, double& z, double& w) {
  int i = 0;
  float zf = 0.f, wf = 0.f;
#if TARG_AVX512
  __m512 az = _mm512_setzero_ps(), aw = _mm512_setzero_ps(), vm = _mm512_set1_ps(m);
  for (; i + 16 <= n; i += 16) {
    __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), vm);
    __m512 e = exp512(d);
    az = _mm512_add_ps(az, e);
    aw = _mm512_fmadd_ps(e, d, aw);
  }
  zf = _mm512_reduce_add_ps(az), wf = _mm512_reduce_add_ps(aw);
#elif TARG_AVX2
  __m256 az = _mm256_setzero_ps(), aw = _mm256_setzero_ps(), vm = _mm256_set1_ps(m);
  for (; i + 8 <= n; i += 8) {
    __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
    __m256 e = exp256(d);
    az = _mm256_add_ps(az, e);
    aw = _mm256_fmadd_ps(e, d, aw);
  }
  zf = hsum256(az), wf = hsum256(aw);
#endif
  z = zf, w = wf;
  for (; i < n; i++) {
    float d = x[i] - m, e = std::exp(d);
    z += e, w += (double)e * d;
  }
}

// Index j with cumsum(p)[j-1] <= u * sum(p) < cumsum(p)[j], p = exp((x - m) * inv_t).
inline int sample_row(const float* x, int n, float m, float inv_t, float u, std::vector<float>& buf) {
  buf.resize(n);
  std::vector<float> scaled(n);
  for (int i = 0; i < n; i++) scaled[i] = (x[i] - m) * inv_t;
  float z = exp_sub_sum(scaled.data(), 0.f, buf.data(), n);
  double target = (double)u * z, c = 0.0;
  const int B = 64;
  int i = 0;
  for (; i + B <= n; i += B) {  // skip whole blocks first
    float bs = 0.f;
    for (int j = 0; j < B; j++) bs += buf[i + j];
    if (c + bs > target) break;
    c += bs;
  }
  int last = -1;
  for (; i < n; i++) {
    if (buf[i] > 0.f) last = i;
    c += buf[i];
    if (c > target) return i;
  }
  return last >= 0 ? last : 0;  // rounding left the target just past the end
}

inline RowStats row_stats(const float* x, int n, float inv_t, float u, std::vector<float>& buf) {
  float m1, m2;
  int arg;
  top2(x, n, m1, m2, arg);
  double z, w;
  exp_moments(x, n, m1, z, w);
  double logz = std::log(z);
  RowStats r;
  r.token = inv_t > 0.f ? sample_row(x, n, m1, inv_t, u, buf) : arg;
  r.entropy = (float)(logz - w / z);
  r.gap = m1 - m2;
  r.logprob = (float)((double)(x[r.token] - m1) - logz);
  return r;
}

inline void select_rows(const float* logits, int B, int V, const float* inv_t, const float* u, int32_t* tok,
                        float* ent, float* gap, float* lp) {
  parallel_range(B, 1, 1, [&](int b0, int b1) {
    std::vector<float> buf;
    for (int b = b0; b < b1; b++) {
      RowStats r = row_stats(logits + (size_t)b * V, V, inv_t[b], u[b], buf);
      tok[b] = r.token, ent[b] = r.entropy, gap[b] = r.gap, lp[b] = r.logprob;
    }
  });
}

}  // namespace targ
