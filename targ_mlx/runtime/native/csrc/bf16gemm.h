// bfloat16 matrix products and attention for the sentence encoder (the `mlx-bf16` backend):
// out = x @ W + bias, x float32 (M, K), W packed once as bfloat16, sums in float32 (`vdpbf16ps`,
// AVX512-BF16: Zen 4, Intel Cooper Lake and later), and bf16_attention below. What torch's
// bfloat16 autocast computes for a BERT's Linear and attention, without torch.
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

#include "amx_tiles.h"
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

// 32 floats as bfloat16 (round to nearest even), in order.
inline __m512i bf16x32(const float* x) { return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x)); }

// x (M, K) float32 -> bfloat16 rows, round to nearest even, 32 at a time.
inline void bf16_rows_of(const float* x, int M, int K, uint16_t* out) {
  parallel_range(M, 1, 64, [&](int r0, int r1) {
    for (int r = r0; r < r1; r++) {
      const float* xr = x + (size_t)r * K;
      uint16_t* o = out + (size_t)r * K;
      int k = 0;
      for (; k + 32 <= K; k += 32)
        _mm512_storeu_si512(o + k, bf16x32(xr + k));
      for (; k < K; k++) o[k] = bf16_round(xr[k]);
    }
  });
}

#if TARG_AMX && defined(__AMX_BF16__)
#define TARG_AMX_BF16 1
// The same product on AMX-BF16 tiles (TDPBF16PS): RB x 16 rows by CB x 16 columns, 32 k a tile
// product. bf16_pack's W is already the B tile's layout (a column block's 16 pairs of k, 64
// bytes each, one after another: 1 KB a tile); A tiles are 16 rows x 32 k of the bfloat16 rows.
// Sums in float32 as vdpbf16ps makes them, in tile order, so the bits differ from bf16_tile's (the
// same bfloat16 family: BENCHMARKS.md, row "encoder: bfloat16 on AMX tiles"). The bias and GELU
// follow, on the rows while they are in L1; only the first `rows` are written (a block of fewer
// than 16 rows goes through the tiles zero-padded, so that every row of every batch is summed by
// the same instructions: a passage's vector does not depend on what it is batched with).
template <int RB, int CB>
inline void amx_bf16_block(const uint16_t* a, size_t lda, const uint16_t* w, size_t wblock, int K, const float* bias,
                           float* c, size_t ldc, bool gelu, int rows = 16 * RB) {
  alignas(64) float cb[4][256];
  HwTiles::zero<0>();
  if constexpr (CB == 2) HwTiles::zero<1>();
  if constexpr (RB == 2) HwTiles::zero<2>();
  if constexpr (RB == 2 && CB == 2) HwTiles::zero<3>();
  for (int kb = 0; kb < K / 32; kb++) {
    HwTiles::load<4>(a + (size_t)kb * 32, lda * 2);
    if constexpr (RB == 2) HwTiles::load<6>(a + 16 * lda + (size_t)kb * 32, lda * 2);
    HwTiles::load<5>(w + (size_t)kb * 512, 64);
    HwTiles::dpbf16<0, 4, 5>();
    if constexpr (RB == 2) HwTiles::dpbf16<2, 6, 5>();
    if constexpr (CB == 2) {
      HwTiles::load<7>(w + wblock + (size_t)kb * 512, 64);
      HwTiles::dpbf16<1, 4, 7>();
      if constexpr (RB == 2) HwTiles::dpbf16<3, 6, 7>();
    }
  }
  HwTiles::store<0>(cb[0], 64);
  if constexpr (CB == 2) HwTiles::store<1>(cb[1], 64);
  if constexpr (RB == 2) HwTiles::store<2>(cb[2], 64);
  if constexpr (RB == 2 && CB == 2) HwTiles::store<3>(cb[3], 64);
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < CB; j++) {
      __m512 v = _mm512_load_ps(cb[2 * (r / 16) + j] + (r % 16) * 16);
      if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + 16 * j));
      _mm512_storeu_ps(c + (size_t)r * ldc + 16 * j, gelu ? gelu512(v) : v);
    }
}

// Whether bf16_linear multiplies on AMX-BF16 tiles: the tiles granted and not set off
// (TARG_MLX_AMX=0, or set_amx("vnni") to time the vdpbf16ps path in one process), K whole tiles.
inline bool amx_bf16_takes(int K) { return K % 32 == 0 && amx_mode().load(std::memory_order_relaxed) == kAmxHw; }
#else
inline bool amx_bf16_takes(int) { return false; }
#endif

// out (M, N) = x (M, K) @ W + bias (N, or null), then GELU where `gelu` (the encoder's up
// projection: applied to each tile while it is in L1, not as a pass over the whole output).
// Tasks are 96 rows x 192 columns: a task's W (192 columns x K bfloat16: 147 KB at K = 384,
// 590 KB at 1,536) stays in L2 while its 8-row tiles (32-row blocks on AMX tiles) pass over it.
inline void bf16_linear(const float* x, int M, int K, const uint16_t* w, int N, const float* bias, float* out,
                        bool gelu = false) {
  constexpr int kRows = 96, kCols = 192;
  std::vector<uint16_t> a((size_t)M * K);
  bf16_rows_of(x, M, K, a.data());
  const int K2 = K / 2, row_tasks = (M + kRows - 1) / kRows, col_tasks = (N + kCols - 1) / kCols;
  const size_t wblock = (size_t)K2 * 32;
  const bool tiles = amx_bf16_takes(K);
  pool().run(row_tasks * col_tasks, [&](int t) {
    const int r0 = (t / col_tasks) * kRows, r1 = std::min(M, r0 + kRows);
    const int c0 = (t % col_tasks) * kCols, c1 = std::min(N, c0 + kCols);
    int r = r0;
#if TARG_AMX_BF16
    if (tiles) {
      HwTiles::begin(tile_config(64));
      std::vector<uint16_t> pad;  // the last rows of a task, fewer than 16, zero-padded to 16
      for (; r < r1; r += 32) {
        const int rows = std::min(32, r1 - r);
        const uint16_t* ar = a.data() + (size_t)r * K;
        if (rows < 16) {
          pad.assign((size_t)16 * K, 0);
          std::memcpy(pad.data(), ar, (size_t)rows * K * 2);
          ar = pad.data();
        }
        for (int c = c0; c < c1; c += 32) {
          const uint16_t* wc = w + (size_t)(c / 16) * wblock;
          const float* bc = bias ? bias + c : nullptr;
          float* cr = out + (size_t)r * N + c;
          const bool wide = c + 32 <= c1;
          if (rows >= 32) {
            if (wide) amx_bf16_block<2, 2>(ar, K, wc, wblock, K, bc, cr, N, gelu);
            else amx_bf16_block<2, 1>(ar, K, wc, wblock, K, bc, cr, N, gelu);
          } else {  // 16 rows and the rest one by one: 16..31 rows as a block of 16 and one padded
            const int first = std::min(16, rows);
            if (wide) amx_bf16_block<1, 2>(ar, K, wc, wblock, K, bc, cr, N, gelu, first);
            else amx_bf16_block<1, 1>(ar, K, wc, wblock, K, bc, cr, N, gelu, first);
          }
        }
        if (rows > 16 && rows < 32) r -= 32 - 16;  // the next pass takes rows r + 16 ..
      }
      HwTiles::end();
    }
#else
    (void)tiles;
#endif
    for (; r < r1; r += 8) {
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

// The attention operands' layouts (the encoder's and a prompt's, attn_tiles.h): key j's D values
// as pairs (d, d + 1) into column j of k32 ([D / 2][n32] pairs along the head dimension) ...
inline void bf16_key_column(const float* k, int D, int n32, int j, uint32_t* k32) {
  for (int d = 0; d < D; d += 32) {
    alignas(64) uint32_t pairs[16];
    _mm512_store_si512(pairs, bf16x32(k + d));
    for (int p = 0; p < 16; p++) k32[(size_t)(d / 2 + p) * n32 + j] = pairs[p];
  }
}

// ... and the values of keys j and j + 1 (v1 null: past the last key, zeros) interleaved into
// row j / 2 of v32 ([n32 / 2][D] pairs along the keys).
inline void bf16_value_pair(const float* v0, const float* v1, int D, uint32_t* row) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5,
                                      36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int d = 0; d < D; d += 32) {
    const __m512i a = bf16x32(v0 + d), b = v1 ? bf16x32(v1 + d) : _mm512_setzero_si512();
    _mm512_storeu_si512(row + d, _mm512_permutex2var_epi16(a, lo, b));
    _mm512_storeu_si512(row + d + 16, _mm512_permutex2var_epi16(a, hi, b));
  }
}

// One row of scores (n of them, in a row of n32) -> its probabilities' numerators exp(scale s -
// max) as bfloat16 into pr (zero from n to n32: the keys past n weigh nothing), returning
// 1 / their float32 sum.
inline float bf16_softmax_row(float* sr, int n, int n32, float scale, uint16_t* pr) {
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 top = _mm512_set1_ps(-INFINITY);
  for (int j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sr + j), sc);
    _mm512_mask_storeu_ps(sr + j, m, v);
    top = _mm512_mask_max_ps(top, m, top, v);
  }
  const float inv = 1.f / exp_sub_sum(sr, _mm512_reduce_max_ps(top), sr, n);
  for (int j = 0; j < n; j += 16)
    _mm256_storeu_si256((__m256i*)(pr + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(sr + j)));
  for (int j = n; j < n32; j++) pr[j] = 0;
  return inv;
}

// Bidirectional attention with bfloat16 products (what torch's autocast runs for a BERT's
// attention): scores q k^T and the weighted sum p v each in `vdpbf16ps`, softmax in float32.
// Same contract as bert.h's bidir_attention; head_dim 32 or 64 (MiniLM: 32).
//   keys as [D / 2][n32][2] (pairs along the head dimension, 32 keys a block),
//   values as [n / 2][D][2] (pairs along the keys), probabilities rounded to bfloat16 pairs.
template <int QN, int DB>
inline void bf16_attend_rows(const uint16_t* const* q, float* const* o, const uint16_t* kp, int n32,
                             const uint16_t* vp, int n, float scale, float* s, uint16_t* pb) {
  constexpr int D = DB * 16;
  for (int j = 0; j < n32; j += 32) {
    __m512 acc[QN][2];
    for (int r = 0; r < QN; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int d2 = 0; d2 < D / 2; d2++) {
      const uint16_t* kr = kp + ((size_t)d2 * n32 + j) * 2;
      __m512bh k0 = (__m512bh)_mm512_loadu_si512(kr), k1 = (__m512bh)_mm512_loadu_si512(kr + 32);
      for (int r = 0; r < QN; r++) {
        int32_t pair;
        std::memcpy(&pair, q[r] + 2 * d2, 4);
        __m512bh qd = (__m512bh)_mm512_set1_epi32(pair);
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qd, k0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qd, k1);
      }
    }
    for (int r = 0; r < QN; r++) {
      _mm512_storeu_ps(s + (size_t)r * n32 + j, acc[r][0]);
      _mm512_storeu_ps(s + (size_t)r * n32 + j + 16, acc[r][1]);
    }
  }
  const int n2 = (n + 1) / 2;
  float inv[QN];
  for (int r = 0; r < QN; r++) inv[r] = bf16_softmax_row(s + (size_t)r * n32, n, n32, scale, pb + (size_t)r * n32);
  __m512 acc[QN][DB];
  for (int r = 0; r < QN; r++)
    for (int b = 0; b < DB; b++) acc[r][b] = _mm512_setzero_ps();
  for (int j2 = 0; j2 < n2; j2++) {
    __m512bh vv[DB];
    for (int b = 0; b < DB; b++) vv[b] = (__m512bh)_mm512_loadu_si512(vp + ((size_t)j2 * D + 16 * b) * 2);
    for (int r = 0; r < QN; r++) {
      int32_t pair;
      std::memcpy(&pair, pb + (size_t)r * n32 + 2 * j2, 4);
      __m512bh pj = (__m512bh)_mm512_set1_epi32(pair);
      for (int b = 0; b < DB; b++) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], pj, vv[b]);
    }
  }
  for (int r = 0; r < QN; r++) {
    __m512 iv = _mm512_set1_ps(inv[r]);
    for (int b = 0; b < DB; b++) _mm512_storeu_ps(o[r] + 16 * b, _mm512_mul_ps(acc[r][b], iv));
  }
}

#if TARG_AMX_BF16
// The same attention on AMX-BF16 tiles (TDPBF16PS), 16 RB queries at a time: their scores against
// 32 keys a step (D / 32 tile products each), the softmax above, then p v over 32 keys a step
// into D / 16 C tiles per 16 queries. The operands are the layouts the vdpbf16ps path builds
// (kp's rows of 16 key pairs are a B tile, vp's rows of 16 dimension pairs too; qb and pb are A
// tiles' rows), so only the order of the float32 sums differs (the tiles' order, as
// bf16_linear's). Each output row depends on its own query only: the rows past n in the last
// block are computed and dropped. RB = 2 (D = 32): two blocks of queries share each key and value
// tile loaded, and with D = 32 the query tiles stay loaded across all the keys.
// Why: in vdpbf16ps the two products took most of an encode's attention, itself a fifth of it.
template <int DB, int RB>
inline void amx_bf16_attend_block(const uint16_t* qb, int i, int qn, int n, int n32, const uint16_t* kp,
                                  const uint16_t* vp, float scale, float* ob, int H, float* s, uint16_t* pb) {
  constexpr int D = DB * 16;
  static_assert(RB == 1 || DB == 2, "two query blocks only where p v needs two C tiles each");
  alignas(64) float ot[16 * RB * D];
  float inv[16 * RB];
  const size_t ks_stride = (size_t)16 * n32 * 2;  // a k-step (32 dimensions) of kp
  auto load_q = [&](int ks) {
    HwTiles::load<4>(qb + (size_t)i * D + 32 * ks, D * 2);
    if constexpr (RB == 2) HwTiles::load<6>(qb + (size_t)(i + 16) * D + 32 * ks, D * 2);
  };
  if constexpr (D == 32) load_q(0);
  for (int j = 0; j < n32; j += 32) {
    HwTiles::zero<0>();
    HwTiles::zero<1>();
    if constexpr (RB == 2) {
      HwTiles::zero<2>();
      HwTiles::zero<3>();
    }
    for (int ks = 0; ks < D / 32; ks++) {
      if constexpr (D != 32) load_q(ks);
      HwTiles::load<5>(kp + ks * ks_stride + (size_t)j * 2, (size_t)n32 * 4);
      HwTiles::dpbf16<0, 4, 5>();
      if constexpr (RB == 2) HwTiles::dpbf16<2, 6, 5>();
      HwTiles::load<7>(kp + ks * ks_stride + (size_t)(j + 16) * 2, (size_t)n32 * 4);
      HwTiles::dpbf16<1, 4, 7>();
      if constexpr (RB == 2) HwTiles::dpbf16<3, 6, 7>();
    }
    HwTiles::store<0>(s + j, (size_t)n32 * 4);
    HwTiles::store<1>(s + j + 16, (size_t)n32 * 4);
    if constexpr (RB == 2) {
      HwTiles::store<2>(s + (size_t)16 * n32 + j, (size_t)n32 * 4);
      HwTiles::store<3>(s + (size_t)16 * n32 + j + 16, (size_t)n32 * 4);
    }
  }
  for (int r = 0; r < qn; r++) inv[r] = bf16_softmax_row(s + (size_t)r * n32, n, n32, scale, pb + (size_t)r * n32);
  HwTiles::zero<0>();
  HwTiles::zero<1>();
  if constexpr (DB == 4 || RB == 2) {
    HwTiles::zero<2>();
    HwTiles::zero<3>();
  }
  for (int j = 0; j < n32; j += 32) {
    const uint16_t* vj = vp + (size_t)(j / 2) * D * 2;
    HwTiles::load<4>(pb + j, (size_t)n32 * 2);
    if constexpr (RB == 2) HwTiles::load<6>(pb + (size_t)16 * n32 + j, (size_t)n32 * 2);
    HwTiles::load<5>(vj, D * 4);
    HwTiles::dpbf16<0, 4, 5>();
    if constexpr (RB == 2) HwTiles::dpbf16<2, 6, 5>();
    HwTiles::load<7>(vj + 32, D * 4);
    HwTiles::dpbf16<1, 4, 7>();
    if constexpr (RB == 2) HwTiles::dpbf16<3, 6, 7>();
    if constexpr (DB == 4) {
      HwTiles::load<5>(vj + 64, D * 4);
      HwTiles::dpbf16<2, 4, 5>();
      HwTiles::load<7>(vj + 96, D * 4);
      HwTiles::dpbf16<3, 4, 7>();
    }
  }
  HwTiles::store<0>(ot, D * 4);
  HwTiles::store<1>(ot + 16, D * 4);
  if constexpr (DB == 4) {
    HwTiles::store<2>(ot + 32, D * 4);
    HwTiles::store<3>(ot + 48, D * 4);
  }
  if constexpr (RB == 2) {
    HwTiles::store<2>(ot + 16 * D, D * 4);
    HwTiles::store<3>(ot + 16 * D + 16, D * 4);
  }
  for (int r = 0; r < qn; r++) {
    const __m512 iv = _mm512_set1_ps(inv[r]);
    for (int b = 0; b < DB; b++)
      _mm512_storeu_ps(ob + (size_t)(i + r) * H + 16 * b, _mm512_mul_ps(_mm512_load_ps(ot + r * D + 16 * b), iv));
  }
}

// One (sequence, head): its queries 32 at a time where D = 32 (16 for the last 1..16), else 16.
template <int DB>
inline void amx_bf16_attend(const uint16_t* qb, int n, int n32, const uint16_t* kp, const uint16_t* vp, float scale,
                            float* ob, int H, float* s, uint16_t* pb) {
  int i = 0;
  if constexpr (DB == 2)
    for (; n - i > 16; i += 32)
      amx_bf16_attend_block<DB, 2>(qb, i, std::min(32, n - i), n, n32, kp, vp, scale, ob, H, s, pb);
  for (; i < n; i += 16) amx_bf16_attend_block<DB, 1>(qb, i, std::min(16, n - i), n, n32, kp, vp, scale, ob, H, s, pb);
}
#endif

template <int DB>
inline void bf16_attention_d(const float* qkv, const int32_t* lengths, int B, int L, bool packed, int NH, float scale,
                             float* out) {
  constexpr int D = DB * 16, QN = 4;
  const int H = NH * D, W = 3 * H;
  struct Buffers {
    std::vector<uint16_t> kp, vp, qb, pb;
    std::vector<float> s;
  };
  const bool tiles = amx_bf16_takes(D);
  for_each_row_head<Buffers>(qkv, lengths, B, L, packed, NH, D, out, [&](Buffers& buf, int n, const float* base, float* ob, int h) {
      auto& [kp, vp, qb, pb, s] = buf;
      const int n32 = (n + 31) / 32 * 32;
      // keys to n32 (kp, vp: zero past n) for whole blocks of 32 keys; the tiles also read queries
      // (qb, zero past n) and scores (s, pb) 32 rows a block, the vdpbf16ps rows QN at a time
      const int rows = tiles ? 32 : QN;
      kp.assign((size_t)D * n32, 0);
      vp.assign((size_t)n32 * D, 0);
      if (tiles) qb.assign((size_t)n32 * D, 0);
      else qb.resize((size_t)n * D);
      s.resize((size_t)rows * n32);
      pb.resize((size_t)rows * n32);
      // q rows as bfloat16; each key's pairs (d, d + 1) to kp[d / 2][j]; values of keys j and
      // j + 1 interleaved to vp[j / 2][d]. 32 values a conversion.
      uint32_t* kp32 = reinterpret_cast<uint32_t*>(kp.data());
      uint32_t* vp32 = reinterpret_cast<uint32_t*>(vp.data());
      for (int j = 0; j < n; j++) {
        const float* row = base + (size_t)j * W + h * D;
        if (j + 8 < n) {  // a token's head is D floats of a 3H-float row: too far apart for the
          // hardware's prefetchers, and this loop and the values' waited on each line
          const float* ahead = row + (size_t)8 * W;
          for (int part = 0; part < 3; part++)
            for (int d = 0; d < D; d += 16) _mm_prefetch((const char*)(ahead + (size_t)part * H + d), _MM_HINT_T0);
        }
        for (int d = 0; d < D; d += 32) _mm512_storeu_si512(qb.data() + (size_t)j * D + d, bf16x32(row + d));
        bf16_key_column(row + H, D, n32, j, kp32);
      }
      for (int j = 0; j < n; j += 2) {
        const float* v0 = base + (size_t)j * W + 2 * H + h * D;
        bf16_value_pair(v0, j + 1 < n ? v0 + W : nullptr, D, vp32 + (size_t)(j / 2) * D);
      }
#if TARG_AMX_BF16
      if (tiles) {
        HwTiles::begin(tile_config(64));
        amx_bf16_attend<DB>(qb.data(), n, n32, kp.data(), vp.data(), scale, ob, H, s.data(), pb.data());
        HwTiles::end();
        return;
      }
#else
      (void)tiles;
#endif
      for (int i = 0; i < n; i += QN) {
        const int qn = std::min(QN, n - i);
        const uint16_t* qs[QN];
        float* os[QN];
        for (int r = 0; r < qn; r++) {
          qs[r] = qb.data() + (size_t)(i + r) * D;
          os[r] = ob + (size_t)(i + r) * H;
        }
        switch (qn) {
          case 4: bf16_attend_rows<4, DB>(qs, os, kp.data(), n32, vp.data(), n, scale, s.data(), pb.data()); break;
          case 3: bf16_attend_rows<3, DB>(qs, os, kp.data(), n32, vp.data(), n, scale, s.data(), pb.data()); break;
          case 2: bf16_attend_rows<2, DB>(qs, os, kp.data(), n32, vp.data(), n, scale, s.data(), pb.data()); break;
          default: bf16_attend_rows<1, DB>(qs, os, kp.data(), n32, vp.data(), n, scale, s.data(), pb.data()); break;
        }
      }
  });
}

// false where the head dimension has no bfloat16 form here (the caller runs bert.h's).
inline bool bf16_attention(const float* qkv, const int32_t* lengths, int B, int L, bool packed, int NH, int D,
                           float scale, float* out) {
  if (D == 32) bf16_attention_d<2>(qkv, lengths, B, L, packed, NH, scale, out);
  else if (D == 64) bf16_attention_d<4>(qkv, lengths, B, L, packed, NH, scale, out);
  else return false;
  return true;
}
#else
constexpr bool kBf16 = false;
inline void bf16_linear(const float*, int, int, const uint16_t*, int, const float*, float*, bool = false) {}
inline bool bf16_attention(const float*, const int32_t*, int, int, bool, int, int, float, float*) { return false; }
#endif

}  // namespace targ
