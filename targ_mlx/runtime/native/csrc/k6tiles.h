// Q6_K in 16-column tiles, on AVX512-VNNI (gguf_blocks.q6k_tiles; other builds read Q6_K rows
// as stored, kquant.h).
//
// Why tiles: a Q6_K row's dot product (kquant.h) folds its int32 sums to float once per 256 for
// that one column, and needs two instructions per 64 products (vpmaddubsw, vpdpwssd). A tile's
// vpdpbusd makes 16 columns' sums at once, one instruction per 64 products, and folds 16 columns
// per instruction. The tile keeps the file's 6.56 bits a weight:
//
//   per tile and group of 32 k (384 bytes): the low 4 bits in the k4 layout (k4tiles.h: 4 runs
//   of 64 bytes; in run j, byte 4c + i holds k = 8j + i of column c in its low nibble and
//   k = 8j + 4 + i in its high nibble), then the high 2 bits as two planes of 64 bytes, plane h
//   for k 16h .. 16h + 15 (one sub-block): byte 4c + i holds, at bits 2o .. 2o + 1, the high bits
//   of k = 16h + 4o + i (o = 0..3, the four vpdpbusd operands of the sub-block);
//   scales: per tile and group, 16 int8 scales of the first sub-block, then 16 of the second;
//   d: per tile and super-block of 256, 16 float16.
//
// A sub-block's 4 vpdpbusd give each column sum_k q * qx over 16 k (|.| <= 16 * 63 * 127), one
// vpmulld applies its scale, a super-block sums exactly in int32, and the -32 offset of the
// values comes off through the activations' sums per 16 (Q8K.bsum), as in kquant.h. One float
// fold per 256. Every (row, column) result is the same sequence of operations whatever rows or
// columns are beside it, so a row's result does not depend on the batch it is in.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "k4tiles.h"
#include "kquant.h"
#include "qgemm.h"

namespace targ {

constexpr int kK6GroupBytes = 384;  // QG x NT x 6 bits

#if TARG_VNNI
// A group's 384 bytes -> 8 vpdpbusd operands, w[o] = the 6-bit values of k 4o .. 4o + 3 of the
// tile's 16 columns (also the AMX kernel's B tile, amx.h).
inline void k6_operands(const uint8_t* grp, __m512i* w) {
  const __m512i m30 = _mm512_set1_epi8(0x30);
  k4_operands(grp, w);
  for (int h = 0; h < 2; h++) {
    const __m512i hb = _mm512_loadu_si512(grp + 256 + 64 * h);
    w[4 * h] = _mm512_or_si512(w[4 * h], _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30));
    w[4 * h + 1] = _mm512_or_si512(w[4 * h + 1], _mm512_and_si512(_mm512_slli_epi16(hb, 2), m30));
    w[4 * h + 2] = _mm512_or_si512(w[4 * h + 2], _mm512_and_si512(hb, m30));
    w[4 * h + 3] = _mm512_or_si512(w[4 * h + 3], _mm512_and_si512(_mm512_srli_epi16(hb, 2), m30));
  }
}

template <int R, bool PREFETCH>
inline void k6_vnni(const QMat& W, int t, const Q8K& X, int m0, float* out) {
  const int K = W.K, G = K / QG, S = K / QK;
  const uint8_t* tile = W.q + (size_t)t * W.tile_bytes();
  const int8_t* sct = (const int8_t*)W.scales + (size_t)t * G * 2 * NT;
  const uint16_t* dt = (const uint16_t*)W.biases + (size_t)t * S * NT;
  const int8_t* xr[R];
  for (int r = 0; r < R; r++) xr[r] = X.q + (size_t)(m0 + r) * K;
  __m512 facc[R];
  for (int r = 0; r < R; r++) facc[r] = _mm512_setzero_ps();
  for (int s = 0; s < S; s++) {
    __m512i a32[R];
    for (int r = 0; r < R; r++) a32[r] = _mm512_setzero_si512();
    for (int g = 8 * s; g < 8 * s + 8; g++) {
      const uint8_t* grp = tile + (size_t)g * kK6GroupBytes;
      if constexpr (PREFETCH) {
        const char* ahead = (const char*)grp + 3 * kK6GroupBytes;
        for (int c = 0; c < kK6GroupBytes; c += 64) _mm_prefetch(ahead + c, _MM_HINT_T0);
      }
      __m512i w[8];  // operand o: k = 4o .. 4o + 3 of the group, 16 columns
      k6_operands(grp, w);
      const __m512i sa = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(sct + (size_t)g * 2 * NT)));
      const __m512i sb = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(sct + (size_t)g * 2 * NT + NT)));
      for (int r = 0; r < R; r++) {
        const int8_t* xq = xr[r] + g * QG;
        __m512i da = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], bcast4(xq));
        __m512i db = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[4], bcast4(xq + 16));
        for (int o = 1; o < 4; o++) {
          da = _mm512_dpbusd_epi32(da, w[o], bcast4(xq + 4 * o));
          db = _mm512_dpbusd_epi32(db, w[4 + o], bcast4(xq + 16 + 4 * o));
        }
        a32[r] = _mm512_add_epi32(a32[r], _mm512_add_epi32(_mm512_mullo_epi32(da, sa), _mm512_mullo_epi32(db, sb)));
      }
    }
    // the offset: 32 * sum_j sc[c][j] * xsum_j over the 16 sub-blocks, as vpmaddwd over each
    // group's pair of sub-blocks (16-bit pairs per column lane)
    __m512i m16[8];
    for (int p = 0; p < 8; p++) {
      const int8_t* sg = sct + (size_t)(8 * s + p) * 2 * NT;
      const __m128i a = _mm_loadu_si128((const __m128i*)sg), b = _mm_loadu_si128((const __m128i*)(sg + NT));
      m16[p] = _mm512_cvtepi8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b)));
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(dt + (size_t)s * NT)));
    for (int r = 0; r < R; r++) {
      const int16_t* xs = X.bsum + (size_t)(m0 + r) * (K / 16) + (size_t)s * 16;
      __m512i off = _mm512_setzero_si512();
      for (int p = 0; p < 8; p++) {
        int32_t pair;
        std::memcpy(&pair, xs + 2 * p, 4);
        off = _mm512_add_epi32(off, _mm512_madd_epi16(m16[p], _mm512_set1_epi32(pair)));
      }
      const __m512i isum = _mm512_sub_epi32(a32[r], _mm512_slli_epi32(off, 5));
      facc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum)), _mm512_set1_ps(X.d[(size_t)(m0 + r) * S + s]),
                                facc[r]);
    }
  }
  for (int r = 0; r < R; r++) _mm512_storeu_ps(out + r * NT, facc[r]);
}

#ifndef TARG_K6_ROWS
#define TARG_K6_ROWS 8
#endif
// activation rows sharing each unpacked group: 8 ran 1.75x / 2.3x the row kernel at M = 256 / 8
// where 4 ran 1.6x / 1.8x (bench_k6tiles -DTARG_K6_ROWS=4, Zen 4, the same half hour)
constexpr int kK6Rows = TARG_K6_ROWS;

// Tiles [t0, t1) of Q6_K tiles for all M rows.
inline void k6_tiles(const QMat& W, const Q8K& X, int M, int t0, int t1, float* y, int ldy, const float* residual,
                     const float* bias) {
  tile_blocks<kK6Rows>(W, X, M, t0, t1, y, ldy, residual, bias, [](auto prefetch, const QMat& W, int t, const Q8K& X,
                                                                  int m, int rows, float* acc) {
    with_rows<kK6Rows>(rows, [&](auto r) { k6_vnni<decltype(r)::value, decltype(prefetch)::value>(W, t, X, m, acc); });
  });
}

// y (M x N, row stride ldy) = x (M x K) W^T [+ bias] [+ residual] for Q6_K tiles.
inline void k6gemm(const QMat& W, const float* x, int M, float* y, int ldy, const float* residual, const float* bias) {
  q8k_tile_gemm(W, x, M, [&](const Q8K& X, int a, int b) { k6_tiles(W, X, M, a, b, y, ldy, residual, bias); });
}
constexpr bool kQ6KTiles = true;
#else
constexpr bool kQ6KTiles = false;
inline void k6gemm(const QMat&, const float*, int, float*, int, const float*, const float*) {
  throw std::invalid_argument("Q6_K tiles run on AVX512-VNNI builds only (elsewhere Q6_K stays in rows)");
}
#endif

// Whether Q6_K matrices become tiles in this process (gguf_blocks.kernel_weights asks, via
// q6k_layout()): by default where the tile kernel is built (AVX512-VNNI); TARG_MLX_Q6K_LAYOUT=rows
// keeps them as stored, to time one against the other.
inline bool q6k_tiles_on() {
  static const bool on = kQ6KTiles && !env_is("TARG_MLX_Q6K_LAYOUT", "rows");
  return on;
}

}  // namespace targ
