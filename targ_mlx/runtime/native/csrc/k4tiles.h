// Q4_K tiles in the k4 layout, multiplied with llama.cpp's Q8_K activations: the default on
// every build (AVX512-VNNI builds also hold the plain tile layout's kernel, qgemm.h, which
// TARG_MLX_Q4K_LAYOUT=tiles runs; on a Zen 4 EPYC k4 runs 1.15-1.2x its rate at prefill and
// 1.6-1.8x at 1 to 8 rows, BENCHMARKS.md, row "k4 VNNI kernel").
//
// The k4 layout: a tile's 16 columns and a group's 32 k are 256 bytes, four runs of 64; in run
// j, byte 4c + i holds k = 8j + i of column c in its low nibble and k = 8j + 4 + i in its high
// nibble. So one 32-byte load and a mask (or a shift and a mask) give 8 columns x 4 consecutive
// k, the operand of vpmaddubsw against 4 activation bytes broadcast as one int32: no byte
// interleaving and no pre-broadcast activation copies (the plain layout needs both on AVX2).
// Each 16-bit pair sum then belongs to one column, so vpmaddwd applies the group's 6-bit scale
// in integers and a super-block of 256 sums exactly in int32: the float fold runs once per 256
// (with one activation scale per 256, Q8_K), not once per 32 (docs/archive/benchmarks-journal.md,
// "Q4_K tiles in the k4 layout").
//
//   y[c] = sum over super-blocks s: dx_s * (d[c] * sum_g sc[c][g] * dot_g - dmin[c] * sum_g m[c][g] * xsum_g)
//
// with dot_g = sum of q * qx over group g and xsum_g the group's activation sum. Every (row,
// column) result is the same sequence of operations whatever rows or columns are beside it,
// so a row's result does not depend on the batch it is in.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kquant.h"
#include "qgemm.h"

namespace targ {

// Whether Q4_K tiles are in the k4 layout in this process (gguf_blocks.q4k_tiles asks, via
// q4k_layout()): by default yes; TARG_MLX_Q4K_LAYOUT=k4 or =tiles chooses (both kernels are in
// every build), to time one against the other on a machine.
constexpr bool kQ4KTilesK4 = true;
inline bool q4k_k4() {
  static const bool k4 = env_is("TARG_MLX_Q4K_LAYOUT", "k4") || (kQ4KTilesK4 && !env_is("TARG_MLX_Q4K_LAYOUT", "tiles"));
  return k4;
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// R activation rows x H column halves (8 columns each, from half h0) of tile t: out[r * NT + 8h + c].
// Registers: per (row, half) a 16-bit group sum and a 32-bit super-block sum; R x H <= 4.
template <int R, int H, bool PREFETCH>
inline void k4_block(const QMat& W, int t, int h0, const Q8K& X, int m0, float* out) {
  const int K = W.K, G = K / QG, S = K / QK;
  const __m256i low = _mm256_set1_epi8(0x0f);
  // 16-bit lanes 2c and 2c + 1 <- byte c (a column's scale under both of its pair sums)
  const __m256i dup = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
                                       4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
  const uint8_t* tile = W.q + (size_t)t * W.tile_bytes();
  const uint8_t* smt = (const uint8_t*)W.scales + (size_t)t * G * 2 * NT;  // per group: 16 scales, 16 mins
  const int8_t* xr[R];
  for (int r = 0; r < R; r++) xr[r] = X.q + (size_t)(m0 + r) * K;
  alignas(32) float facc[R][H][8];
  for (int r = 0; r < R; r++)
    for (int h = 0; h < H; h++) _mm256_store_ps(facc[r][h], _mm256_setzero_ps());
  for (int s = 0; s < S; s++) {
    __m256i a32[R][H];
    for (int r = 0; r < R; r++)
      for (int h = 0; h < H; h++) a32[r][h] = _mm256_setzero_si256();
    for (int g = 8 * s; g < 8 * s + 8; g++) {
      const uint8_t* grp = tile + (size_t)g * 256;
      if constexpr (PREFETCH) {  // decode streams every weight from memory: ask 4 groups ahead
        const char* ahead = (const char*)grp + 4 * 256;
        for (int c = 0; c < 256; c += 64) _mm_prefetch(ahead + c, _MM_HINT_T0);
      }
      __m256i sc16[H];
      for (int h = 0; h < H; h++) {
        int64_t sc8;
        std::memcpy(&sc8, smt + (size_t)g * 2 * NT + 8 * (h0 + h), 8);
        sc16[h] = _mm256_shuffle_epi8(_mm256_set1_epi64x(sc8), dup);
      }
      __m256i a16[R][H];
#pragma GCC unroll 4
      for (int j = 0; j < 4; j++) {
        __m256i lo[H], hi[H];
        for (int h = 0; h < H; h++) {
          const __m256i v = _mm256_loadu_si256((const __m256i*)(grp + 64 * j + 32 * (h0 + h)));
          lo[h] = _mm256_and_si256(v, low);
          hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        }
        for (int r = 0; r < R; r++) {
          int32_t q0, q1;
          std::memcpy(&q0, xr[r] + g * QG + 8 * j, 4);
          std::memcpy(&q1, xr[r] + g * QG + 8 * j + 4, 4);
          const __m256i x0 = _mm256_set1_epi32(q0), x1 = _mm256_set1_epi32(q1);
          for (int h = 0; h < H; h++) {
            // a pair is at most 2 * 15 * 127 = 3810: a group's 16 pairs per lane fit in 16 bits
            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], x0), _mm256_maddubs_epi16(hi[h], x1));
            a16[r][h] = j ? _mm256_add_epi16(a16[r][h], p) : p;
            // keep each sum where it is made: GCC otherwise hoists all 8 products of a group
            // and spills them (measured 1.3x slower)
            asm("" : "+x"(a16[r][h]));
          }
        }
      }
      for (int r = 0; r < R; r++)
        for (int h = 0; h < H; h++) a32[r][h] = _mm256_add_epi32(a32[r][h], _mm256_madd_epi16(a16[r][h], sc16[h]));
    }
    // the mins: sum_g m[c][g] * xsum_g, as 4 vpmaddwd over pairs of groups
    const uint16_t* dd = (const uint16_t*)biases_at(W, t, 8 * s);
    for (int h = 0; h < H; h++) {
      __m256i m16[4];
      for (int p = 0; p < 4; p++) {
        const uint8_t* m0b = smt + (size_t)(8 * s + 2 * p) * 2 * NT + NT + 8 * (h0 + h);
        const uint8_t* m1b = m0b + 2 * NT;  // the next group's mins
        m16[p] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i*)m0b),
                                                        _mm_loadl_epi64((const __m128i*)m1b)));
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(dd + 8 * (h0 + h))));
      const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(dd + NT + 8 * (h0 + h))));
      for (int r = 0; r < R; r++) {
        const int16_t* xs = X.bsum32 + (size_t)(m0 + r) * G + 8 * s;
        __m256i mn = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
          int32_t pair;
          std::memcpy(&pair, xs + 2 * p, 4);
          mn = _mm256_add_epi32(mn, _mm256_madd_epi16(m16[p], _mm256_set1_epi32(pair)));
        }
        const __m256 v = _mm256_fmsub_ps(d, _mm256_cvtepi32_ps(a32[r][h]), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn)));
        const __m256 dx = _mm256_set1_ps(X.d[(size_t)(m0 + r) * S + s]);
        _mm256_store_ps(facc[r][h], _mm256_fmadd_ps(v, dx, _mm256_load_ps(facc[r][h])));
      }
    }
  }
  for (int r = 0; r < R; r++)
    for (int h = 0; h < H; h++) std::memcpy(out + r * NT + 8 * (h0 + h), facc[r][h], 8 * sizeof(float));
}
#else
// Portable: the same integer sums per super-block and the same float fold per 256.
template <int R, int H, bool PREFETCH>
inline void k4_block(const QMat& W, int t, int h0, const Q8K& X, int m0, float* out) {
  const int K = W.K, G = K / QG, S = K / QK;
  const uint8_t* tile = W.q + (size_t)t * W.tile_bytes();
  for (int r = 0; r < R; r++) {
    const int8_t* xq = X.q + (size_t)(m0 + r) * K;
    for (int c = 8 * h0; c < 8 * (h0 + H); c++) {
      float acc = 0.f;
      for (int s = 0; s < S; s++) {
        int32_t a = 0, mn = 0;
        for (int g = 8 * s; g < 8 * s + 8; g++) {
          const uint8_t* grp = tile + (size_t)g * 256;
          const uint8_t* sm = (const uint8_t*)scales_at(W, t, g);
          int32_t dot = 0;
          for (int k = 0; k < QG; k++) dot += qval(W, grp, k, c) * xq[g * QG + k];
          a += sm[c] * dot;
          mn += sm[NT + c] * X.bsum32[(size_t)(m0 + r) * G + g];
        }
        const uint16_t* dd = (const uint16_t*)biases_at(W, t, 8 * s);
        const float d = half_to_float(dd[c]), dmin = half_to_float(dd[NT + c]);
        const float v = d * (float)a - dmin * (float)mn;
        acc = v * X.d[(size_t)(m0 + r) * S + s] + acc;
      }
      out[r * NT + c] = acc;
    }
  }
}
#endif

#if TARG_VNNI
// Super-block s of tile t's mins as 16-bit pairs of groups per column (vpmaddwd / vpdpwssd operands
// against pairs of the activations' group sums), and its d and dmin: what the VNNI and the AMX
// Q4_K kernels both fold after their integer sums.
struct K4Mins {
  __m512i m16[4];
  __m512 d, dmin;
};

inline K4Mins k4_mins(const QMat& W, int t, int s, const uint8_t* smt) {
  K4Mins k;
  const uint16_t* dd = (const uint16_t*)biases_at(W, t, 8 * s);
  for (int p = 0; p < 4; p++) {
    const uint8_t* m0b = smt + (size_t)(8 * s + 2 * p) * 2 * NT + NT;
    const __m128i a = _mm_loadu_si128((const __m128i*)m0b), b = _mm_loadu_si128((const __m128i*)(m0b + 2 * NT));
    k.m16[p] = _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b)));
  }
  k.d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)dd));
  k.dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(dd + NT)));
  return k;
}

// AVX512-VNNI: a run's 64 bytes are the tile's 16 columns x 4 consecutive k, which is
// vpdpbusd's operand as loaded, so one mask (or shift and mask) and one vpdpbusd per 4 k and
// row give each column's group dot product in int32 (no byte shuffle: the plain layout needs a
// vpermb per 64 bytes). The group's 6-bit scale is then one vpdpwssd; every integer sum is
// exact, and the float fold per 256 is lane for lane the AVX2 kernel's, so both give the same
// bits (bench_k4tiles checks it on a VNNI machine).
inline __m512i bcast4(const int8_t* p) {  // 4 bytes into every 32-bit lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// A group's 256 bytes in the k4 layout -> 8 vpdpbusd operands, w[o] = k 4o .. 4o + 3 of the
// tile's 16 columns (Q4_K's values; Q6_K's low 4 bits, k6tiles.h).
inline void k4_operands(const uint8_t* grp, __m512i* w) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int j = 0; j < 4; j++) {
    const __m512i v = _mm512_loadu_si512(grp + 64 * j);
    w[2 * j] = _mm512_and_si512(v, low);                          // k = 8j .. 8j + 3
    w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);  // k = 8j + 4 .. 8j + 7
  }
}

template <int R, bool PREFETCH>
inline void k4_vnni(const QMat& W, int t, const Q8K& X, int m0, float* out) {
  const int K = W.K, G = K / QG, S = K / QK;
  const uint8_t* tile = W.q + (size_t)t * W.tile_bytes();
  const uint8_t* smt = (const uint8_t*)W.scales + (size_t)t * G * 2 * NT;  // per group: 16 scales, 16 mins
  const int8_t* xr[R];
  for (int r = 0; r < R; r++) xr[r] = X.q + (size_t)(m0 + r) * K;
  __m512 facc[R];
  for (int r = 0; r < R; r++) facc[r] = _mm512_setzero_ps();
  for (int s = 0; s < S; s++) {
    __m512i a32[R];
    for (int r = 0; r < R; r++) a32[r] = _mm512_setzero_si512();
    for (int g = 8 * s; g < 8 * s + 8; g++) {
      const uint8_t* grp = tile + (size_t)g * 256;
      if constexpr (PREFETCH) {
        const char* ahead = (const char*)grp + 4 * 256;
        for (int c = 0; c < 256; c += 64) _mm_prefetch(ahead + c, _MM_HINT_T0);
      }
      // each column's scale in both 16-bit halves of its lane (vpdpwssd's pair)
      const __m512i sc = _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(smt + (size_t)g * 2 * NT))),
                                            _mm512_set1_epi32(0x10001));
      __m512i w[8];
      k4_operands(grp, w);
      for (int r = 0; r < R; r++) {
        // 4 activation bytes broadcast straight from memory: copied to the stack first, GCC
        // moved them through general registers (vpbroadcastd from a register takes a vector
        // slot; from memory, only a load)
        const int8_t* xq = xr[r] + g * QG;
        __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();  // two chains in flight
        for (int j = 0; j < 4; j++) {
          d0 = _mm512_dpbusd_epi32(d0, w[2 * j], bcast4(xq + 8 * j));
          d1 = _mm512_dpbusd_epi32(d1, w[2 * j + 1], bcast4(xq + 8 * j + 4));
        }
        // Each chain sums 16 products, |d| <= 16 * 15 * 127 = 30480: a 16-bit value. Both go in one
        // lane as a 16-bit pair (d0 low, d1 high) and vpdpwssd adds sc * d0 + sc * d1 to the
        // super-block's int32 sum (|sum| <= 8 groups * 32 * 15 * 127 * 63: far inside int32).
        // Exact, like a vpmulld of d0 + d1 by sc, which it replaces: on AMD's Zen 4 vpmulld
        // (zmm) costs what three vpdpbusd do.
        const __m512i pair = _mm512_mask_blend_epi16(0x55555555, _mm512_slli_epi32(d1, 16), d0);
        a32[r] = _mm512_dpwssd_epi32(a32[r], pair, sc);
      }
    }
    // the mins: sum_g m[c][g] * xsum_g, as 4 vpmaddwd over pairs of groups (16-bit pairs per column)
    const K4Mins km = k4_mins(W, t, s, smt);
    const __m512i* m16 = km.m16;
    const __m512 d = km.d, dmin = km.dmin;
    for (int r = 0; r < R; r++) {
      const int16_t* xs = X.bsum32 + (size_t)(m0 + r) * G + 8 * s;
      __m512i mn = _mm512_setzero_si512();
      for (int p = 0; p < 4; p++) {
        int32_t pair;
        std::memcpy(&pair, xs + 2 * p, 4);
        mn = _mm512_add_epi32(mn, _mm512_madd_epi16(m16[p], _mm512_set1_epi32(pair)));
      }
      const __m512 v = _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(a32[r]), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn)));
      facc[r] = _mm512_fmadd_ps(v, _mm512_set1_ps(X.d[(size_t)(m0 + r) * S + s]), facc[r]);
    }
  }
  for (int r = 0; r < R; r++) _mm512_storeu_ps(out + r * NT, facc[r]);
}
constexpr bool kK4Vnni = true;
#else
constexpr bool kK4Vnni = false;
#endif

constexpr int kK4Rows = 4;  // activation rows sharing each weight load at prefill

// 1..kK4Rows rows at m over half h of tile t.
template <bool PREFETCH>
inline void k4_rows(const QMat& W, int t, int h, const Q8K& X, int m, int rows, float* acc) {
  with_rows<kK4Rows>(rows, [&](auto r) { k4_block<decltype(r)::value, 1, PREFETCH>(W, t, h, X, m, acc); });
}

#if TARG_VNNI
#ifndef TARG_K4_VNNI_ROWS
#define TARG_K4_VNNI_ROWS 8
#endif
// rows sharing each weight load: 8 ran as fast as 4 or up to 8% faster per matrix at M = 8 and
// 256 on the lent Xeon (bench_k4tiles -DTARG_K4_VNNI_ROWS=4 builds the other)
constexpr int kK4VnniRows = TARG_K4_VNNI_ROWS;

// 1..kK4VnniRows rows at m over all 16 columns of tile t.
template <bool PREFETCH>
inline void k4_vnni_rows(const QMat& W, int t, const Q8K& X, int m, int rows, float* acc) {
  with_rows<kK4VnniRows>(rows, [&](auto r) { k4_vnni<decltype(r)::value, PREFETCH>(W, t, X, m, acc); });
}
#endif

// Tiles [t0, t1) for all M rows by a tile kernel that takes up to RB rows against a whole tile
// (rows_of(std::bool_constant<PREFETCH>, W, t, X, m, rows, acc)): rows in blocks whose int8
// activations stay in L2; up to 8 rows the weights still come from memory, so they are
// prefetched. Q4_K tiles (k4_vnni; k4_block by halves) and Q6_K tiles (k6tiles.h) run through it.
template <int RB, class RowsOf>
inline void tile_blocks(const QMat& W, const Q8K& X, int M, int t0, int t1, float* y, int ldy, const float* residual,
                       const float* bias, RowsOf rows_of) {
  alignas(64) float acc[RB * NT];
  const bool stream = M <= 8;
  const int MB = std::max(RB, (256 * 1024 / W.K) / RB * RB);
  for (int mb = 0; mb < M; mb += MB) {
    const int me = std::min(M, mb + MB);
    for (int t = t0; t < t1; t++) {
      for (int m = mb; m < me; m += RB) {
        const int rows = std::min(RB, me - m);
        if (stream) rows_of(std::true_type{}, W, t, X, m, rows, acc);
        else rows_of(std::false_type{}, W, t, X, m, rows, acc);
        for (int r = 0; r < rows; r++) finish(acc + r * NT, m + r, t * NT, NT, y, ldy, residual, bias);
      }
    }
  }
}

// y (M x N, row stride ldy) = x (M x K) W^T [+ bias] [+ residual] by a tile driver over Q8_K
// activations (tiles(X, t0, t1) does tiles [t0, t1)), both cores taking tiles.
template <class Tiles>
inline void q8k_tile_gemm(const QMat& W, const float* x, int M, Tiles tiles) {
  if (M <= 0) return;  // the row kernels always read at least one row
  const Q8K X = quantize_q8k_scratch(x, M, W.K);
  auto body = [&](int a, int b) { tiles(X, a, b); };
  if ((long)M * W.N * W.K < (1 << 18)) body(0, W.N / NT);
  else parallel_range(W.N / NT, 4, 4, body);
}

// Tiles [t0, t1) for all M rows. Up to 2 rows (a decode step): both halves of a tile at once,
// streaming each weight once with prefetch. More: rows in blocks whose int8 activations stay in
// L2, 4 rows at a time over each half-tile in L1; up to 8 rows (the variance gate's) the weights
// still come from memory, so the first half prefetches. VNNI (by default where built) takes a
// whole tile per load instead of a half.
template <bool VNNI = kK4Vnni>
inline void k4_tiles(const QMat& W, const Q8K& X, int M, int t0, int t1, float* y, int ldy, const float* residual,
                     const float* bias) {
#if TARG_VNNI
  if constexpr (VNNI) {
    tile_blocks<kK4VnniRows>(W, X, M, t0, t1, y, ldy, residual, bias, [](auto prefetch, const QMat& W, int t,
                                                                       const Q8K& X, int m, int rows, float* acc) {
      k4_vnni_rows<decltype(prefetch)::value>(W, t, X, m, rows, acc);
    });
    return;
  }
#endif
  if (M <= 2) {
    alignas(64) float acc[2 * NT];
    for (int t = t0; t < t1; t++) {
      if (M == 1) k4_block<1, 2, true>(W, t, 0, X, 0, acc);
      else k4_block<2, 2, true>(W, t, 0, X, 0, acc);
      for (int r = 0; r < M; r++) finish(acc + r * NT, r, t * NT, NT, y, ldy, residual, bias);
    }
    return;
  }
  tile_blocks<kK4Rows>(W, X, M, t0, t1, y, ldy, residual, bias, [](auto prefetch, const QMat& W, int t, const Q8K& X,
                                                                   int m, int rows, float* acc) {
    k4_rows<decltype(prefetch)::value>(W, t, 0, X, m, rows, acc);  // the first half streams the weights
    k4_rows<false>(W, t, 1, X, m, rows, acc);
  });
}

// y (M x N, row stride ldy) = x (M x K) W^T [+ bias] [+ residual] for Q4_K tiles in the k4 layout.
template <bool VNNI = kK4Vnni>
inline void k4gemm(const QMat& W, const float* x, int M, float* y, int ldy, const float* residual, const float* bias) {
  q8k_tile_gemm(W, x, M, [&](const Q8K& X, int a, int b) { k4_tiles<VNNI>(W, X, M, a, b, y, ldy, residual, bias); });
}

}  // namespace targ
