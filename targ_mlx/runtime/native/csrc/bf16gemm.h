// bfloat16 matrix products for the sentence encoder: out = x @ W + bias, x float32 (M, K),
// W packed once as bfloat16, sums in float32 (`vdpbf16ps`, AVX512-BF16: Zen 4, Intel Cooper
// Lake and later). What torch's bfloat16 autocast computes for a Linear, without torch.
//
// Why: the encoder's float32 products run at OpenBLAS's float32 peak and take ~60% of an
// encode; `vdpbf16ps` does two multiply-adds a lane where an FMA does one. Each output element
// depends only on its own row of x and column of W, summed in one fixed order, so a passage
// gets the same vector whatever it is batched with.
//
// Packed W: for each block of 16 output columns, for each pair of inputs (2p, 2p + 1), the 16
// columns' (w[2p][n], w[2p + 1][n]) as bfloat16 pairs: [N / 16][K / 2][16][2] uint16, one
// 64-byte vector a pair, the operand `vdpbf16ps` takes beside a broadcast pair of x.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "bert.h"
#include "pool.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define TARG_BF16 1
#include <immintrin.h>
#endif

namespace targ {

// float32 -> bfloat16, round to nearest even (what the hardware's convert does; NaN kept NaN).
inline uint16_t bf16_round(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// W (K, N) float32 row-major -> the packed layout above. K even, N a multiple of 16.
inline void bf16_pack(const float* w, int K, int N, uint16_t* out) {
  for (int nb = 0; nb < N / 16; nb++)
    for (int p = 0; p < K / 2; p++) {
      uint16_t* o = out + ((size_t)nb * (K / 2) + p) * 32;
      for (int l = 0; l < 16; l++) {
        o[2 * l] = bf16_round(w[(size_t)(2 * p) * N + nb * 16 + l]);
        o[2 * l + 1] = bf16_round(w[(size_t)(2 * p + 1) * N + nb * 16 + l]);
      }
    }
}

#if TARG_BF16
constexpr bool kBf16 = true;

// MR rows of a (bfloat16, row stride lda) times NB column blocks of the packed W, over K = 2 * K2,
// added to bias (NB * 16 floats) into c (row stride ldc). MR x NB accumulators stay in registers
// (8 x 3 = 24 of the 32), each W vector loaded once for MR rows.
template <int MR, int NB>
inline void bf16_tile(const uint16_t* a, size_t lda, const uint16_t* w, size_t wblock, int K2, const float* bias,
                      float* c, size_t ldc) {
  __m512 acc[MR][NB];
  for (int j = 0; j < NB; j++) {
    __m512 b = bias ? _mm512_loadu_ps(bias + 16 * j) : _mm512_setzero_ps();
    for (int r = 0; r < MR; r++) acc[r][j] = b;
  }
  for (int p = 0; p < K2; p++) {
    __m512bh wv[NB];
    for (int j = 0; j < NB; j++) wv[j] = (__m512bh)_mm512_loadu_si512(w + j * wblock + (size_t)p * 32);
    for (int r = 0; r < MR; r++) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * (size_t)p, 4);
      __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
      for (int j = 0; j < NB; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av, wv[j]);
    }
  }
  for (int r = 0; r < MR; r++)
    for (int j = 0; j < NB; j++) _mm512_storeu_ps(c + r * ldc + 16 * j, acc[r][j]);
}

template <int NB>
inline void bf16_rows(int mr, const uint16_t* a, size_t lda, const uint16_t* w, size_t wblock, int K2,
                      const float* bias, float* c, size_t ldc) {
  switch (mr) {
    case 8: bf16_tile<8, NB>(a, lda, w, wblock, K2, bias, c, ldc); break;
    case 7: bf16_tile<7, NB>(a, lda, w, wblock, K2, bias, c, ldc); break;
    case 6: bf16_tile<6, NB>(a, lda, w, wblock, K2, bias, c, ldc); break;
    case 5: bf16_tile<5, NB>(a, lda, w, wblock, K2, bias, c, ldc); break;
    case 4: bf16_tile<4, NB>(a, lda, w, wblock, K2, bias, c, ldc); break;
    case 3: bf16_tile<3, NB>(a, lda, w, wblock, K2, bias, c, ldc); break;
    case 2: bf16_tile<2, NB>(a, lda, w, wblock, K2, bias, c, ldc); break;
    default: bf16_tile<1, NB>(a, lda, w, wblock, K2, bias, c, ldc); break;
  }
}

// x (M, K) float32 -> bfloat16 rows, round to nearest even, 32 at a time.
inline void bf16_rows_of(const float* x, int M, int K, uint16_t* out) {
  parallel_range(M, 1, 64, [&](int r0, int r1) {
    for (int r = r0; r < r1; r++) {
      const float* xr = x + (size_t)r * K;
      uint16_t* o = out + (size_t)r * K;
      int k = 0;
      for (; k + 32 <= K; k += 32)
        _mm512_storeu_si512(o + k, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(xr + k + 16), _mm512_loadu_ps(xr + k)));
      for (; k < K; k++) o[k] = bf16_round(xr[k]);
    }
  });
}

// out (M, N) = x (M, K) @ W + bias (N, or null), then GELU where `gelu` (the encoder's up
// projection: applied to each tile while it is in L1, not as a pass over the whole output).
// Tasks are 96 rows x 192 columns: a task's W (192 columns x K bfloat16: 147 KB at K = 384,
// 590 KB at 1,536) stays in L2 while its 8-row tiles pass over it.
inline void bf16_linear(const float* x, int M, int K, const uint16_t* w, int N, const float* bias, float* out,
                        bool gelu = false) {
  constexpr int kRows = 96, kCols = 192;
  std::vector<uint16_t> a((size_t)M * K);
  bf16_rows_of(x, M, K, a.data());
  const int K2 = K / 2, row_tasks = (M + kRows - 1) / kRows, col_tasks = (N + kCols - 1) / kCols;
  const size_t wblock = (size_t)K2 * 32;
  pool().run(row_tasks * col_tasks, [&](int t) {
    const int r0 = (t / col_tasks) * kRows, r1 = std::min(M, r0 + kRows);
    const int c0 = (t % col_tasks) * kCols, c1 = std::min(N, c0 + kCols);
    for (int r = r0; r < r1; r += 8) {
      const int mr = std::min(8, r1 - r);
      const uint16_t* ar = a.data() + (size_t)r * K;
      for (int c = c0; c < c1;) {
        const int width = c + 48 <= c1 ? 48 : 16;
        float* cr = out + (size_t)r * N + c;
        if (width == 48) bf16_rows<3>(mr, ar, K, w + (size_t)(c / 16) * wblock, wblock, K2, bias ? bias + c : nullptr, cr, N);
        else bf16_rows<1>(mr, ar, K, w + (size_t)(c / 16) * wblock, wblock, K2, bias ? bias + c : nullptr, cr, N);
        if (gelu)
          for (int i = 0; i < mr; i++) gelu_erf(cr + (size_t)i * N, width, cr + (size_t)i * N);
        c += width;
      }
    }
  });
}
#else
constexpr bool kBf16 = false;
inline void bf16_linear(const float*, int, int, const uint16_t*, int, const float*, float*, bool = false) {}
#endif

}  // namespace targ
