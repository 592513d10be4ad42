// The non-matmul parts of a decoder layer, fused: RMSNorm (with the residual add), RoPE applied
// while splitting the fused q|k|v projection into heads, SwiGLU, embedding lookup from packed
// rows, and attention over a (left-padded) KV cache. Each is one MLX primitive where MLX's CPU
// backend would run 5-40 small ops.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pool.h"
#include "qgemm.h"
#include "simd.h"

namespace targ {

inline float dot(const float* a, const float* b, int n) {
  int i = 0;
  float s = 0.f;
#if TARG_AVX512
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  s = _mm512_reduce_add_ps(acc);
#elif TARG_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  s = hsum256(acc);
#endif
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

inline void axpy(float a, const float* x, float* y, int n) {  // y += a * x
  int i = 0;
#if TARG_AVX512
  __m512 va = _mm512_set1_ps(a);
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
#elif TARG_AVX2
  __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; i++) y[i] += a * x[i];
}

// h = x (+ r); y = h * rsqrt(mean(h^2) + eps) * w, per row of length H.
inline void rms_norm(const float* x, const float* r, const float* w, float eps, int rows, int H, float* h_out,
                     float* y) {
  auto body = [&](int b, int e) {
    for (int i = b; i < e; i++) {
      const float* xi = x + (size_t)i * H;
      float* hi = h_out ? h_out + (size_t)i * H : nullptr;
      const float* src = xi;
      if (r) {
        const float* ri = r + (size_t)i * H;
        for (int j = 0; j < H; j++) hi[j] = xi[j] + ri[j];
        src = hi;
      }
      float ss = dot(src, src, H);
      float inv = 1.0f / std::sqrt(ss / (float)H + eps);
      float* yi = y + (size_t)i * H;
      for (int j = 0; j < H; j++) yi[j] = src[j] * inv * w[j];
    }
  };
  if ((long)rows * H >= (1 << 16)) parallel_range(rows, 1, 8, body);
  else body(0, rows);
}

// cos/sin of (pos[b] + l) * scale * inv_freq[i] for b < B, l < L, i < R2 (tables B x L x R2).
inline void rope_table(const int32_t* pos, int n_pos, int B, int L, const float* inv_freq, int R2, float scale,
                       float* cos_t, float* sin_t) {
  for (int b = 0; b < B; b++)
    for (int l = 0; l < L; l++) {
      float p = (float)(pos[n_pos == 1 ? 0 : b] + l) * scale;
      for (int i = 0; i < R2; i++) {
        float th = p * inv_freq[i];
        size_t o = ((size_t)b * L + l) * R2 + i;
        cos_t[o] = std::cos(th);
        sin_t[o] = std::sin(th);
      }
    }
}

// qkv (B, L, (Hq + 2 Hkv) * D) -> q (B, Hq, L, D), k, v (B, Hkv, L, D); RoPE on the first 2*R2
// dims of q and k. traditional: rotate pairs (2i, 2i+1); else (i, i + R2).
inline void rope_split(const float* qkv, int B, int L, int Hq, int Hkv, int D, const float* cos_t, const float* sin_t,
                       int R2, bool traditional, float* q, float* k, float* v) {
  const int W = (Hq + 2 * Hkv) * D;
  auto rot = [&](const float* src, float* dst, const float* c, const float* s) {
    std::memcpy(dst, src, D * sizeof(float));
    for (int i = 0; i < R2; i++) {
      int a = traditional ? 2 * i : i, b = traditional ? 2 * i + 1 : i + R2;
      float x0 = src[a], x1 = src[b];
      dst[a] = x0 * c[i] - x1 * s[i];
      dst[b] = x0 * s[i] + x1 * c[i];
    }
  };
  auto body = [&](int b0, int b1) {
    for (int bl = b0; bl < b1; bl++) {
      int b = bl / L, l = bl % L;
      const float* row = qkv + (size_t)bl * W;
      const float* c = cos_t + (size_t)bl * R2;
      const float* s = sin_t + (size_t)bl * R2;
      for (int h = 0; h < Hq; h++) rot(row + h * D, q + (((size_t)b * Hq + h) * L + l) * D, c, s);
      for (int h = 0; h < Hkv; h++) {
        rot(row + (Hq + h) * D, k + (((size_t)b * Hkv + h) * L + l) * D, c, s);
        std::memcpy(v + (((size_t)b * Hkv + h) * L + l) * D, row + (Hq + Hkv + h) * D, D * sizeof(float));
      }
    }
  };
  if ((long)B * L * W >= (1 << 16)) parallel_range(B * L, 1, 8, body);
  else body(0, B * L);
}

// gu (rows, 2I) = [gate | up] -> out (rows, I) = silu(gate) * up
inline void swiglu(const float* gu, int rows, int I, float* out) {
  auto body = [&](int b, int e) {
    for (int r = b; r < e; r++) {
      const float* g = gu + (size_t)r * 2 * I;
      const float* u = g + I;
      float* o = out + (size_t)r * I;
      int j = 0;
#if TARG_AVX512
      for (; j + 16 <= I; j += 16) swiglu16(g + j, u + j, o + j);
#elif TARG_AVX2
      for (; j + 8 <= I; j += 8) {
        __m256 gv = _mm256_loadu_ps(g + j);
        __m256 sg = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.f), exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
        _mm256_storeu_ps(o + j, _mm256_mul_ps(sg, _mm256_loadu_ps(u + j)));
      }
#endif
      for (; j < I; j++) o[j] = g[j] / (1.f + std::exp(-g[j])) * u[j];
    }
  };
  if ((long)rows * I >= (1 << 15)) parallel_range(rows, 1, 4, body);
  else body(0, rows);
}

// Rows of a packed matrix, dequantized: out[t] = scale * q + bias for each id.
inline void embed(const QMat& W, const int32_t* ids, int n, float* out) {
  const int K = W.K, G = K / QG;
  float s[NT], b[NT];
  for (int t = 0; t < n; t++) {
    int id = ids[t], tile = id / NT, lane = id % NT;
    float* o = out + (size_t)t * K;
    for (int g = 0; g < G; g++) {
      const uint8_t* grp = W.q + (size_t)tile * W.tile_bytes() + (size_t)g * W.group_bytes();
      const Affine16 a = group_affine(W, tile, g, s, b);
      for (int k = 0; k < QG; k++) o[g * QG + k] = std::fma((float)qval(W, grp, k, lane), a.s[lane], a.b[lane]);
    }
  }
}

struct KV {  // a (B, H, S, D) view: element (b, h, s, d) at base[b*sb + h*sh + s*ss + d]
  const float* base;
  long sb, sh, ss;
};

constexpr int kAttnQueries = 16;  // queries of one head per attention task (they share key blocks)
#ifndef TARG_ATTN_GROUPS
#define TARG_ATTN_GROUPS 1  // decode: a kv head's query heads as one task; 0: one task per query head
#endif                      // (scripts/kernels/bench_attention.cpp builds both)

#if TARG_AVX512
// Lane j of the result is the sum of the lanes of a[j], added in the same tree as
// _mm512_reduce_add_ps (lanes i and i+8, then i and i+4, then i and i+2, then the last two), so
// 16 dot products reduce together for ~1/4 of the shuffles and to bit-for-bit what `dot` gives.
inline __m512 reduce16(const __m512* a) {
  __m512 b[8], c[4], d[2];
  for (int j = 0; j < 8; j++)  // 256-bit halves: [a_j | a_{j+8}], lanes i + i+8
    b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[j], a[j + 8], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a[j], a[j + 8], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int j = 0; j < 4; j++)  // quarters: [a_j, a_{j+8}, a_{j+4}, a_{j+12}], lanes i + i+4
    c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[j], b[j + 4], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(b[j], b[j + 4], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int j = 0; j < 2; j++)  // lanes i + i+2, two keys per quarter
    d[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(c[j]), _mm512_castps_pd(c[j + 2]))),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(c[j]), _mm512_castps_pd(c[j + 2]))));
  __m512 r = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // r holds keys 0 2 1 3 | 8 10 9 11 | 4 6 5 7 | 12 14 13 15
  const __m512i order = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
  return _mm512_permutexvar_ps(order, r);
}

// scale * q.k for n keys, 16 at a time; q (DC x 16 floats) held in registers.
template <int DC>
inline void scores16(const float* q, const float* const* kp, int n, float scale, float* sc) {
  __m512 qv[DC];
  for (int c = 0; c < DC; c++) qv[c] = _mm512_loadu_ps(q + 16 * c);
  const __m512 vs = _mm512_set1_ps(scale);
  for (int j0 = 0; j0 < n; j0 += 16) {
    const int cnt = std::min(16, n - j0);
    __m512 a[16];
    for (int j = 0; j < 16; j++) {
      __m512 acc = _mm512_setzero_ps();
      if (j < cnt)
        for (int c = 0; c < DC; c++) acc = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kp[j0 + j] + 16 * c), acc);
      a[j] = acc;
    }
    _mm512_mask_storeu_ps(sc + j0, (__mmask16)((1u << cnt) - 1), _mm512_mul_ps(reduce16(a), vs));
  }
}

// The largest of x[0..n): a maximum is exact in any order, so 16 lanes at a time give the scalar
// loop's value (the scores are finite).
inline float max_of(const float* x, int n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  int j = 0;
  for (; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + j));
  float mx = _mm512_reduce_max_ps(m);
  for (; j < n; j++) mx = std::max(mx, x[j]);
  return mx;
}

// acc (in memory) += sum_j p_j v_j, in registers in key order (as `axpy` does in memory). A run of
// calls over consecutive key ranges gives one call's bits over their union (the same fused
// multiply-adds in the same order; a float survives the store and the load unchanged).
template <int DC>
inline void weighted16(const float* p, const float* const* vp, int n, float* acc_mem) {
  __m512 acc[DC];
  for (int c = 0; c < DC; c++) acc[c] = _mm512_loadu_ps(acc_mem + 16 * c);
  for (int j = 0; j < n; j++) {
    const __m512 w = _mm512_set1_ps(p[j]);
    for (int c = 0; c < DC; c++) acc[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(vp[j] + 16 * c), acc[c]);
  }
  for (int c = 0; c < DC; c++) _mm512_storeu_ps(acc_mem + 16 * c, acc[c]);
}

// weighted16 for QN queries over the same n keys at once: each query's sums are weighted16's, the
// same fused multiply-adds in the same key order (so its bits), but QN x DC chains run side by
// side and each value vector loaded serves QN queries. One query's DC chains (4 at D = 64) left
// the FMA units waiting on their latency: weighted16 was ~45% of a prefill's attention.
template <int DC, int QN>
inline void weighted16_rows(const float* const* p, const float* const* vp, int n, float* const* acc_mem) {
  __m512 acc[QN][DC];
  for (int r = 0; r < QN; r++)
    for (int c = 0; c < DC; c++) acc[r][c] = _mm512_loadu_ps(acc_mem[r] + 16 * c);
  for (int j = 0; j < n; j++) {
    __m512 v[DC];
    for (int c = 0; c < DC; c++) v[c] = _mm512_loadu_ps(vp[j] + 16 * c);
    for (int r = 0; r < QN; r++) {
      const __m512 w = _mm512_set1_ps(p[r][j]);
      for (int c = 0; c < DC; c++) acc[r][c] = _mm512_fmadd_ps(w, v[c], acc[r][c]);
    }
  }
  for (int r = 0; r < QN; r++)
    for (int c = 0; c < DC; c++) _mm512_storeu_ps(acc_mem[r] + 16 * c, acc[r][c]);
}

// Attention of nq queries of one head over their visible keys, query i seeing the first n[i] of
// kp/vp (n[i] = 0: nothing to attend to, a zero output). Keys go in blocks of kAttnKeys that stay
// in L1 while every query of the block takes them (the queries of a task share one key list, so
// each key and value was read from L2/L3 once per query before: at 1,024 tokens the 1.5B's
// attention ran at ~1/3 of the FMA rate). Per query the operations and their order do not depend
// on the other queries (scores16 per 16 keys, exp_sub_sum, weighted16 in key order), so a query
// alone (a decode step) gets the bits it gets in any block.
constexpr int kAttnKeys = 32;
template <int DC>
inline void attend_queries(const float* q, size_t q_stride, int nq, const int* n, const float* const* kp,
                           const float* const* vp, float scale, float* o, size_t o_stride, float* sc, int ld_sc,
                           float* acc) {
  constexpr int D = 16 * DC;
  int nmax = 0;
  for (int i = 0; i < nq; i++) nmax = std::max(nmax, n[i]);
  for (int j0 = 0; j0 < nmax; j0 += kAttnKeys)
    for (int i = 0; i < nq; i++)
      for (int j = j0, e = std::min(n[i], j0 + kAttnKeys); j < e; j += 16)
        scores16<DC>(q + i * q_stride, kp + j, std::min(16, e - j), scale, sc + (size_t)i * ld_sc + j);
  float z[kAttnQueries];
  for (int i = 0; i < nq; i++) {
    float* si = sc + (size_t)i * ld_sc;
    z[i] = n[i] ? exp_sub_sum(si, max_of(si, n[i]), si, n[i]) : 1.f;
    std::fill(acc + (size_t)i * D, acc + (size_t)(i + 1) * D, 0.f);
  }
  // QN queries at a time over the keys of the block they all see, then each one's own rest alone:
  // a run of calls over consecutive key ranges gives each query weighted16's bits
  constexpr int QN = DC <= 4 ? 4 : 2;
  for (int j0 = 0; j0 < nmax; j0 += kAttnKeys) {
    int i = 0;
    for (; i + QN <= nq; i += QN) {
      int e[QN], common = kAttnKeys;
      const float* p[QN];
      float* a[QN];
      for (int r = 0; r < QN; r++) {
        e[r] = std::max(0, std::min(n[i + r], j0 + kAttnKeys) - j0);
        common = std::min(common, e[r]);
        p[r] = sc + (size_t)(i + r) * ld_sc + j0;
        a[r] = acc + (size_t)(i + r) * D;
      }
      if (common > 0) weighted16_rows<DC, QN>(p, vp + j0, common, a);
      for (int r = 0; r < QN; r++)
        if (e[r] > common) weighted16<DC>(p[r] + common, vp + j0 + common, e[r] - common, a[r]);
    }
    for (; i < nq; i++)
      if (j0 < n[i])
        weighted16<DC>(sc + (size_t)i * ld_sc + j0, vp + j0, std::min(n[i], j0 + kAttnKeys) - j0, acc + (size_t)i * D);
  }
  for (int i = 0; i < nq; i++) {
    float* oi = o + i * o_stride;
    const float iz = 1.f / z[i];
    for (int d = 0; d < D; d++) oi[d] = n[i] ? acc[(size_t)i * D + d] * iz : 0.f;
  }
}
#endif

#if TARG_AVX2
// AVX2 twin of reduce16: lane j is the sum of the lanes of a[j], in the tree hsum256 uses
// (lanes i and i+4, then i and i+2, then the last two).
inline __m256 reduce8(const __m256* a) {
  __m256 b[4], c[2];
  for (int j = 0; j < 4; j++)  // [a_j | a_{j+4}], lanes i + i+4
    b[j] = _mm256_add_ps(_mm256_permute2f128_ps(a[j], a[j + 4], 0x20), _mm256_permute2f128_ps(a[j], a[j + 4], 0x31));
  for (int j = 0; j < 2; j++)  // lanes i + i+2, two keys per 128 bits
    c[j] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(b[2 * j]), _mm256_castps_pd(b[2 * j + 1]))),
                         _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(b[2 * j]), _mm256_castps_pd(b[2 * j + 1]))));
  return _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// scale * q.k for n keys, 8 at a time; q (DC x 8 floats) held in registers.
template <int DC>
inline void scores8(const float* q, const float* const* kp, int n, float scale, float* sc) {
  __m256 qv[DC];
  for (int c = 0; c < DC; c++) qv[c] = _mm256_loadu_ps(q + 8 * c);
  const __m256 vs = _mm256_set1_ps(scale);
  for (int j0 = 0; j0 < n; j0 += 8) {
    const int cnt = std::min(8, n - j0);
    __m256 a[8];
    for (int j = 0; j < 8; j++) {
      __m256 acc = _mm256_setzero_ps();
      if (j < cnt)
        for (int c = 0; c < DC; c++) acc = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(kp[j0 + j] + 8 * c), acc);
      a[j] = acc;
    }
    __m256 r = _mm256_mul_ps(reduce8(a), vs);
    if (cnt == 8) {
      _mm256_storeu_ps(sc + j0, r);
    } else {
      alignas(32) float t[8];
      _mm256_store_ps(t, r);
      std::memcpy(sc + j0, t, cnt * sizeof(float));
    }
  }
}

// out = sum_j p_j v_j, accumulated in registers in key order (as `axpy` does in memory).
// Head dims over 64 go in slices of 64 so the sums fit in the 16 registers.
template <int DC>
inline void weighted8(const float* p, const float* const* vp, int n, float* out) {
  constexpr int C = DC < 8 ? DC : 8;
  for (int c0 = 0; c0 < DC; c0 += C) {
    __m256 acc[C];
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
      const __m256 w = _mm256_set1_ps(p[j]);
      for (int c = 0; c < C; c++) acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vp[j] + 8 * (c0 + c)), acc[c]);
    }
    for (int c = 0; c < C; c++) _mm256_storeu_ps(out + 8 * (c0 + c), acc[c]);
  }
}
#endif

// Keys every row sees before its own cache: a prompt run once and shared by the rows decoded
// from it. Row b reads row rows[b] of the (R, Hkv, P, D) views, hiding its positions
// [hole, hole + pad[rows[b]]) (left padding of that prompt, after a header of `hole` positions).
struct Shared {
  KV K, V;
  const int32_t* rows;
  const int32_t* pad;  // may be null
  int hole, P, R;
};

// The keys a query sees, in cache order: what `attention` and the tile path (attn_tiles.h) both
// take, so a query sees the same keys in the same order whichever computes it.
struct KeyList {
  const KV& K;
  const KV& V;
  const int32_t* pad;
  int hole;
  const Shared* pre;
  // The keys row b's kv head kh shows a query at cache position hl into kp/vp: the shared
  // prompt's (less its padding), then its own up to hl (less its padding). Returns how many of
  // them are the shared prompt's.
  int gather(int b, int kh, int hl, const float** kp, const float** vp) const {
    const int p = pad ? pad[b] : 0;
    int n0 = 0;
    if (pre) {
      // rows are checked where they are made (native/model.py SharedPrefixCache); clamp
      // rather than read outside the array should a caller pass a bad one
      int r = std::min(std::max(pre->rows[b], 0), pre->R - 1), pp = pre->pad ? pre->pad[r] : 0;
      const float* kb = pre->K.base + r * pre->K.sb + kh * pre->K.sh;
      const float* vb = pre->V.base + r * pre->V.sb + kh * pre->V.sh;
      for (int j = 0; j < pre->P; j++) {
        if (j >= pre->hole && j < pre->hole + pp) continue;
        kp[n0] = kb + (long)j * pre->K.ss, vp[n0] = vb + (long)j * pre->V.ss, n0++;
      }
    }
    const float* kb = K.base + b * K.sb + kh * K.sh;
    const float* vb = V.base + b * V.sb + kh * V.sh;
    int nk = n0;
    for (int j = 0; j < std::min(hole, hl + 1); j++) kp[nk] = kb + (long)j * K.ss, vp[nk] = vb + (long)j * V.ss, nk++;
    for (int j = hole + p; j <= hl; j++) kp[nk] = kb + (long)j * K.ss, vp[nk] = vb + (long)j * V.ss, nk++;
    return n0;
  }
  // query at cache position hi of row b: how many keys it sees (0 at a padding position)
  int visible(int b, int n0, int hi) const {
    const int p = pad ? pad[b] : 0;
    if (hi >= hole && hi < hole + p) return 0;
    return n0 + std::min(hole, hi + 1) + std::max(0, hi - (hole + p) + 1);
  }
};

// Attention of q (B, Hq, L, D) over keys/values (B, Hkv, S, D), after the shared keys if any;
// the L queries sit at the last L of the S cache positions. Row b hides the keys
// [hole, hole + pad[b]) (left padding when hole is 0; padding after a shared prompt prefix of
// `hole` positions otherwise), and query i sees the other keys j <= S - L + i. out (B, L, Hq * D),
// ready for the output projection.
//
// Every query is computed on its own, by the same instruction sequence, over exactly its visible
// keys in cache order: a row's result does not depend on the batch, its padding, how a prompt was
// chunked, or whether its prompt's keys are shared with other rows or copied into its own cache.
inline void attention(const float* q, const KV& K, const KV& V, const int32_t* pad, int hole, int B, int Hq, int Hkv,
                      int L, int S, int D, float scale, float* out, const Shared* pre = nullptr) {
  const int group = Hq / Hkv;
  const long ld_out = (long)Hq * D;
  constexpr int QB = kAttnQueries;
  const int qblocks = (L + QB - 1) / QB;
  const int P = pre ? pre->P : 0;
  const KeyList keys{K, V, pad, hole, pre};
#if TARG_AVX512
  // A decode step (one query per row): the `group` query heads of a kv head see the same keys, so
  // they go through attend_queries together as one block of queries and each key and value is
  // read once per kv head instead of once per query head (6x less traffic for the 1.5B's GQA; at
  // 700 cached positions its per-head tasks ran at ~1/6 of the FMA rate: docs/archive/
  // benchmarks-journal.md, "Huge pages under the weights, and decode attention by kv head").
  // Each query's operations are the per-head path's, so the bits are the same.
  if (TARG_ATTN_GROUPS && L == 1 && (D == 64 || D == 128) && group > 1 && group <= QB) {
    parallel_range(B * Hkv, 1, 1, [&](int t0, int t1) {
      std::vector<const float*> kp(P + S), vp(P + S);
      std::vector<float> blk_sc((size_t)group * (P + S)), blk_acc((size_t)group * D);
      for (int t = t0; t < t1; t++) {
        const int b = t / Hkv, kh = t % Hkv;
        const int n0 = keys.gather(b, kh, S - 1, kp.data(), vp.data());
        int nq[QB];
        std::fill(nq, nq + group, keys.visible(b, n0, S - 1));
        const float* q0 = q + ((size_t)b * Hq + (size_t)kh * group) * D;  // L = 1: heads D apart
        float* o0 = out + (size_t)b * ld_out + (size_t)kh * group * D;
        if (D == 64) attend_queries<4>(q0, D, group, nq, kp.data(), vp.data(), scale, o0, D, blk_sc.data(), P + S, blk_acc.data());
        else attend_queries<8>(q0, D, group, nq, kp.data(), vp.data(), scale, o0, D, blk_sc.data(), P + S, blk_acc.data());
      }
    });
    return;
  }
#endif
  parallel_range(B * Hq * qblocks, 1, 1, [&](int t0, int t1) {
    std::vector<float> sc(P + S), acc(D), blk_sc, blk_acc;
    std::vector<const float*> kp(P + S), vp(P + S);
    for (int t = t0; t < t1; t++) {
      int qb = t % qblocks, bh = t / qblocks, b = bh / Hq, h = bh % Hq, kh = h / group;
      // the block's last query sees the most keys; each other query sees a prefix of them
      const int i0 = qb * QB, i1 = std::min(L, (qb + 1) * QB), hl = S - L + i1 - 1;
      const int n0 = keys.gather(b, kh, hl, kp.data(), vp.data());
      int nq[QB];
      for (int i = i0; i < i1; i++) nq[i - i0] = keys.visible(b, n0, S - L + i);
#if TARG_AVX512
      if (D == 64 || D == 128) {
        const float* q0 = q + (((size_t)b * Hq + h) * L + i0) * D;
        float* o0 = out + ((size_t)b * L + i0) * ld_out + (size_t)h * D;
        blk_sc.resize((size_t)QB * (P + S));
        blk_acc.resize((size_t)QB * D);
        if (D == 64) attend_queries<4>(q0, D, i1 - i0, nq, kp.data(), vp.data(), scale, o0, ld_out, blk_sc.data(), P + S, blk_acc.data());
        else attend_queries<8>(q0, D, i1 - i0, nq, kp.data(), vp.data(), scale, o0, ld_out, blk_sc.data(), P + S, blk_acc.data());
        continue;
      }
#endif
      for (int i = i0; i < i1; i++) {
        const float* qi = q + (((size_t)b * Hq + h) * L + i) * D;
        float* o = out + ((size_t)b * L + i) * ld_out + (size_t)h * D;
        const int n = nq[i - i0];
        if (n == 0) {
          std::fill(o, o + D, 0.f);
          continue;
        }
        bool fast = false;
#if TARG_AVX2
        if (D == 64) scores8<8>(qi, kp.data(), n, scale, sc.data()), fast = true;
        else if (D == 128) scores8<16>(qi, kp.data(), n, scale, sc.data()), fast = true;
#endif
        if (!fast)
          for (int j = 0; j < n; j++) sc[j] = dot(qi, kp[j], D) * scale;
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) mx = std::max(mx, sc[j]);
        float z = exp_sub_sum(sc.data(), mx, sc.data(), n);
#if TARG_AVX2
        if (D == 64) weighted8<8>(sc.data(), vp.data(), n, acc.data());
        else if (D == 128) weighted8<16>(sc.data(), vp.data(), n, acc.data());
        else
#endif
        {
          std::fill(acc.begin(), acc.end(), 0.f);
          for (int j = 0; j < n; j++) axpy(sc[j], vp[j], acc.data(), D);
        }
        float iz = 1.f / z;
        for (int d = 0; d < D; d++) o[d] = acc[d] * iz;
      }
    }
  });
}

}  // namespace targ
