// The K-quants on AMX tiles (amx.h): Q4_K and Q6_K with their integer scales inside the B
// tiles, so a super-block of 256 sums in a few C tiles, and the integers those give are exactly
// the ones the VNNI kernels (k4tiles.h, k6tiles.h) make per super-block.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "amx_tiles.h"
#include "k4tiles.h"
#include "k6tiles.h"
#include "qgemm.h"

namespace targ {

#if TARG_VNNI
// A row's 16 outputs of tile columns [n0, n0 + 16): finish's operations, in one vector.
inline void finish16(const float* acc, int m, int n0, float* y, int ldy, const float* residual, const float* bias) {
  __m512 v = _mm512_load_ps(acc);
  if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + n0));
  if (residual) v = _mm512_add_ps(v, _mm512_loadu_ps(residual + (size_t)m * ldy + n0));
  _mm512_storeu_ps(y + (size_t)m * ldy + n0, v);
}

// The row-block driver every AMX product shares (amx.h's affine rows, Q4_K and Q6_K below):
// tiles [t0, t1) for rows [0, M16) (a multiple of 16), the rows in blocks whose int8 activations
// stay in L2 (`l2_bytes` of a core's 2 MB, less the run's other tiles) while each weight tile is
// unpacked once per block: unpack(t, wb) lays tile t out in `Lines` 64-byte lines per group of
// QG; block(t, wb, m, rows, acc) multiplies rows [m, m + rows) (MR, or 16 at a block's end) into
// acc; each row is then finished (scale, residual, bias).
//
// Tiles go in runs of up to 8 (as many as 512 KB of unpacked tiles allow) so that each row's
// outputs are written as one run of up to 512 bytes: written a tile's 64 bytes at a time, rows
// apart (and off the lines, which the output's allocation does not align), the writes of a
// 1,024-row product took a third of its time.
//
// `pair` > 0 (a gate|up matrix, its up half `pair` tiles after its gate half): tile t is
// multiplied with tile t + pair and the row finished as SwiGLU of the two (swiglu16), written to
// column t * 16 of y: the 2I-wide product is never written (at 1,024 rows the 1.5B's gate|up
// output is 73 MB, written and read back once more by the SwiGLU op).
template <class T, int KB, int Lines, int MR = 16, class Unpack, class Block>
void amx_row_blocks(const QMat& W, int M16, int t0, int t1, float* y, int ldy, const float* residual,
                    const float* bias, int l2_bytes, Unpack unpack, Block block, int pair = 0) {
  struct alignas(64) Line {
    uint8_t b[64];
  };
  constexpr int kRun = 8;
  const int per = pair ? 2 : 1;  // tiles unpacked and multiplied per output tile
  const size_t groups = (size_t)W.K / QG, tile_bytes = groups * Lines * 64;
  const int run = (int)std::clamp<size_t>((512u << 10) / tile_bytes / per, 1, kRun);
  thread_local std::vector<Line> wbuf;
  if (wbuf.size() < per * run * groups * Lines) wbuf.resize(per * run * groups * Lines);
  uint8_t* wb = wbuf.data()->b;
  alignas(64) float acc[2 * kRun][MR * NT];
  T::begin(tile_config(KB));
  const long a_bytes = std::max<long>(l2_bytes - (long)((per * run - 1) * tile_bytes), l2_bytes / 2);
  const int MB = std::max<int>(MR, a_bytes / W.K / MR * MR);
  for (int mb = 0; mb < M16; mb += MB) {
    const int me = std::min(M16, mb + MB);
    for (int t = t0; t < t1; t += run) {
      const int n = std::min(run, t1 - t);
      for (int j = 0; j < n; j++) {
        unpack(t + j, wb + j * tile_bytes);
        if (pair) unpack(t + j + pair, wb + (run + j) * tile_bytes);
      }
      for (int m = mb; m < me; m += MR) {
        const int rows = std::min(MR, me - m);
        for (int j = 0; j < n; j++) {
          block(t + j, wb + j * tile_bytes, m, rows, acc[j]);
          if (pair) block(t + j + pair, wb + (run + j) * tile_bytes, m, rows, acc[run + j]);
        }
        for (int r = 0; r < rows; r++)
          for (int j = 0; j < n; j++) {
            if (pair) swiglu16(acc[j] + r * NT, acc[run + j] + r * NT, y + (size_t)(m + r) * ldy + (t + j) * NT);
            else finish16(acc[j] + r * NT, m + r, (t + j) * NT, y, ldy, residual, bias);
          }
      }
    }
  }
  T::end();
}

// Q4_K with its scales inside the B tiles: each group's 6-bit scale sc = 8 sh + sl (sh, sl < 8)
// multiplies the group's values into two B tiles, sl * q and sh * q (at most 105: unsigned
// bytes), so the tile products can sum all 8 groups of a super-block in one C tile each (K = 64 a
// product, no store per group): C_lo = sum_g sl_g * dot_g, C_hi = sum_g sh_g * dot_g, and
// 8 C_hi + C_lo is sum_g sc_g * dot_g, exactly the VNNI kernel's integer (k4_vnni), and the
// mins and the float fold per 256 are its operations. Storing and scaling a C tile per group of 32
// (as Q6_K and the affine tiles do) held this kernel to 1.3x the VNNI kernel's rate.
//
// The products s * q are looked up, not multiplied: one vpermi2b over the 128-byte table
// s * q at 16 s + q takes what eight 16-bit multiplies and masks took (the unpack was a fifth of
// the kernel's time at 256 rows, and it is paid again for every block of rows).
struct K4Table {
  __m512i lo, hi;  // entries 0..63 (s < 4), 64..127
  K4Table() {
    alignas(64) uint8_t b[128];
    for (int i = 0; i < 128; i++) b[i] = (uint8_t)((i >> 4) * (i & 15));
    lo = _mm512_load_si512(b), hi = _mm512_load_si512(b + 64);
  }
};

inline void unpack_k4_scaled(const QMat& W, int t, uint8_t* wlo, uint8_t* whi) {
  const int G = W.K / QG;
  const uint8_t* smt = (const uint8_t*)W.scales + (size_t)t * G * 2 * NT;
  static const K4Table tab;
  alignas(64) int8_t idx[64];
  for (int b = 0; b < 64; b++) idx[b] = (int8_t)(b / 4);  // byte 4c + i <- column c's scale
  const __m512i cidx = _mm512_load_si512(idx), seven = _mm512_set1_epi8(7), tlo = tab.lo, thi = tab.hi;
  for (int g = 0; g < G; g++) {
    __m512i w[8];
    k4_operands(W.q + (size_t)t * W.tile_bytes() + (size_t)g * W.group_bytes(), w);
    const __m512i sc = _mm512_permutexvar_epi8(cidx, _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)(smt + (size_t)g * 2 * NT))));
    // 16 sl and 16 sh: the table's row for each byte (below 128, so no byte carries into the next)
    const __m512i rl = _mm512_slli_epi16(_mm512_and_si512(sc, seven), 4);
    const __m512i rh = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(sc, 3), seven), 4);
    for (int o = 0; o < 8; o++) {
      _mm512_store_si512(wlo + (size_t)g * kAmxGroupBytes + 64 * o, _mm512_permutex2var_epi8(tlo, _mm512_or_si512(w[o], rl), thi));
      _mm512_store_si512(whi + (size_t)g * kAmxGroupBytes + 64 * o, _mm512_permutex2var_epi8(tlo, _mm512_or_si512(w[o], rh), thi));
    }
  }
}

// A super-block's tile products for RB blocks of 16 rows, issued a k-step at a time: part 0
// zeroes the C tiles, parts 1..4 each multiply 64 k. Block b's rows go through A tile 4 + 2b
// into C tiles 2b (by B tile 5, sl * q) and 2b + 1 (by B tile 7, sh * q): with two blocks each
// tile loaded serves two products (with one, A and B loads were 3 to 2 products, and the tile
// loads, not the products, set the pace).
template <class T, int RB>
inline void k4s_part(int i, const int8_t* xa, const uint8_t* wlo, const uint8_t* whi, int K, int s) {
  if (i == 0) {
    T::template zero<0>();
    T::template zero<1>();
    if constexpr (RB == 2) {
      T::template zero<2>();
      T::template zero<3>();
    }
    return;
  }
  const size_t c = (size_t)(4 * s + i - 1) * 1024;
  T::template load<4>(xa + c, 64);
  if constexpr (RB == 2) T::template load<6>(xa + (size_t)16 * K + c, 64);
  T::template load<5>(wlo + c, 64);
  T::template dp<0, 4, 5, false>();
  if constexpr (RB == 2) T::template dp<2, 6, 5, false>();
  T::template load<7>(whi + c, 64);
  T::template dp<1, 4, 7, false>();
  if constexpr (RB == 2) T::template dp<3, 6, 7, false>();
}

// 16 RB rows x 16 columns of Q4_K. The tile products of super-block s + 1 are issued between the
// rows of super-block s's vector work (its mins and float fold, the VNNI kernel's operations in
// its order), once its C tiles are stored: issued after it, the tiles waited on the vector code
// and the vector code on the tiles.
template <class T, int RB>
inline void k4s_amx(const QMat& W, int t, const uint8_t* wlo, const uint8_t* whi, const Q8K& X, const int8_t* xa, int m0,
                    float* out) {
  constexpr int R = 16 * RB;
  const int K = W.K, G = K / QG, S = K / QK;
  const uint8_t* smt = (const uint8_t*)W.scales + (size_t)t * G * 2 * NT;
  alignas(64) int32_t cb[RB][2][256];  // [row block][lo, hi]: 16 rows x 16 columns
  __m512 facc[R];
  for (int r = 0; r < R; r++) facc[r] = _mm512_setzero_ps();
  for (int i = 0; i < 5; i++) k4s_part<T, RB>(i, xa, wlo, whi, K, 0);
  for (int s = 0; s < S; s++) {
    T::template store<0>(cb[0][0], 64);
    T::template store<1>(cb[0][1], 64);
    if constexpr (RB == 2) {
      T::template store<2>(cb[1][0], 64);
      T::template store<3>(cb[1][1], 64);
    }
    const bool next = s + 1 < S;
    const K4Mins km = k4_mins(W, t, s, smt);
#pragma GCC unroll 32
    for (int r = 0; r < R; r++) {
      constexpr int every = 3 * RB;  // parts 0..4 of super-block s + 1 spread over the rows
      if (next && r % every == 0 && r / every < 5) k4s_part<T, RB>(r / every, xa, wlo, whi, K, s + 1);
      const int32_t* cl = cb[r / 16][0] + (r % 16) * NT;
      const int32_t* ch = cb[r / 16][1] + (r % 16) * NT;
      const __m512i a32 = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(ch), 3), _mm512_load_si512(cl));
      const int16_t* xs = X.bsum32 + (size_t)(m0 + r) * G + 8 * s;
      __m512i mn = _mm512_setzero_si512();
      for (int p = 0; p < 4; p++) {
        int32_t pair;
        std::memcpy(&pair, xs + 2 * p, 4);
        mn = _mm512_dpwssd_epi32(mn, km.m16[p], _mm512_set1_epi32(pair));
      }
      const __m512 v = _mm512_fmsub_ps(km.d, _mm512_cvtepi32_ps(a32), _mm512_mul_ps(km.dmin, _mm512_cvtepi32_ps(mn)));
      facc[r] = _mm512_fmadd_ps(v, _mm512_set1_ps(X.d[(size_t)(m0 + r) * S + s]), facc[r]);
    }
  }
  for (int r = 0; r < R; r++) _mm512_store_ps(out + r * NT, facc[r]);
}

// Tiles [t0, t1) x rows [0, M16) of Q4_K by k4s_amx, 32 rows a call (A tiles packed 64 k a tile).
template <class T>
void k4s_rows(const QMat& W, const Q8K& X, const int8_t* pa, int M16, int t0, int t1, float* y, int ldy,
              const float* residual, const float* bias, int pair = 0) {
  const size_t lo_bytes = (size_t)W.K / QG * kAmxGroupBytes;  // wlo, then whi: two B copies a tile
  // rows whose activations share L2 (2 MB a core on AMX CPUs) with the tile's two B copies
  amx_row_blocks<T, 64, 16, 32>(
      W, M16, t0, t1, y, ldy, residual, bias, 3 << 19, [&](int t, uint8_t* wb) { unpack_k4_scaled(W, t, wb, wb + lo_bytes); },
      [&](int t, uint8_t* wb, int m, int rows, float* acc) {
        const int8_t* xa = pa + (size_t)m * W.K;
        if (rows == 32) k4s_amx<T, 2>(W, t, wb, wb + lo_bytes, X, xa, m, acc);
        else k4s_amx<T, 1>(W, t, wb, wb + lo_bytes, X, xa, m, acc);
      },
      pair);
}

// Q6_K with its scales inside the B tiles, as for Q4_K: each sub-block's int8 scale in balanced
// base 7, sc = e0 + 7 e1 + 49 e2 (e in -3..3), times the values less 32 (-32..31) makes three
// B tiles of signed bytes (|.| <= 96, TDPBSSD), so a super-block's 16 sub-blocks sum in three C
// tiles (K = 64 a product) and C0 + 7 C1 + 49 C2 = sum_j sc_j * sum_k x (q - 32), the VNNI
// kernel's integer (k6_vnni: a32 - 32 * off) exactly; its float fold per 256 follows.
inline void unpack_k6_scaled(const QMat& W, int t, uint8_t* wb /* 3 x K/32 x 512 */) {
  const int G = W.K / QG;
  const size_t plane = (size_t)G * kAmxGroupBytes;
  const int8_t* sct = (const int8_t*)W.scales + (size_t)t * G * 2 * NT;
  alignas(64) int8_t idx[64];
  for (int b = 0; b < 64; b++) idx[b] = (int8_t)(b / 4);
  const __m512i cidx = _mm512_load_si512(idx), low = _mm512_set1_epi16(0x00ff), k32 = _mm512_set1_epi8(32);
  auto mul = [&](__m512i q, __m512i e) {  // signed bytes q * e (|.| <= 96)
    const __m512i lo = _mm512_mullo_epi16(q, _mm512_srai_epi16(_mm512_slli_epi16(e, 8), 8));
    const __m512i hi = _mm512_mullo_epi16(_mm512_srai_epi16(q, 8), _mm512_srai_epi16(e, 8));
    return _mm512_or_si512(_mm512_and_si512(lo, low), _mm512_slli_epi16(hi, 8));
  };
  for (int g = 0; g < G; g++) {
    alignas(16) int8_t dig[3][2 * NT];  // digit i of sub-block h's scale, column c: [i][16 h + c]
    for (int j = 0; j < 2 * NT; j++) {
      int r = sct[(size_t)g * 2 * NT + j];
      for (int i = 0; i < 3; i++) {
        const int e = ((r % 7) + 7 + 3) % 7 - 3;
        dig[i][j] = (int8_t)e;
        r = (r - e) / 7;
      }
    }
    __m512i w[8];
    k6_operands(W.q + (size_t)t * W.tile_bytes() + (size_t)g * W.group_bytes(), w);
    for (int o = 0; o < 8; o++) w[o] = _mm512_sub_epi8(w[o], k32);
    for (int i = 0; i < 3; i++)
      for (int h = 0; h < 2; h++) {
        const __m512i e = _mm512_permutexvar_epi8(cidx, _mm512_castsi128_si512(_mm_load_si128((const __m128i*)(dig[i] + 16 * h))));
        for (int o = 4 * h; o < 4 * h + 4; o++) _mm512_store_si512(wb + i * plane + (size_t)g * kAmxGroupBytes + 64 * o, mul(w[o], e));
      }
  }
}

// A super-block's tile products (part 0 zeroes C tiles 0-2, parts 1..4 each multiply 64 k:
// A tile 4 or 6 by turns, B tiles 5, 7, 3 the scale's three digit planes).
template <class T>
inline void k6s_part(int i, const int8_t* xa, const uint8_t* wb, size_t plane, int s) {
  if (i == 0) {
    T::template zero<0>();
    T::template zero<1>();
    T::template zero<2>();
    return;
  }
  const size_t c = (size_t)(4 * s + i - 1) * 1024;
  auto products = [&](auto a) {
    constexpr int A = decltype(a)::value;
    T::template load<A>(xa + c, 64);
    T::template load<5>(wb + c, 64);
    T::template dp<0, A, 5, true>();
    T::template load<7>(wb + plane + c, 64);
    T::template dp<1, A, 7, true>();
    T::template load<3>(wb + 2 * plane + c, 64);
    T::template dp<2, A, 3, true>();
  };
  if (i % 2) products(std::integral_constant<int, 4>{});
  else products(std::integral_constant<int, 6>{});
}

// 16 rows x 16 columns of Q6_K; super-block s + 1's tile products go between the rows of super-block
// s's vector work, as in k4s_amx.
template <class T>
inline void k6s_amx(const QMat& W, int t, const uint8_t* wb, const Q8K& X, const int8_t* xa, int m0, float* out) {
  const int K = W.K, G = K / QG, S = K / QK;
  const size_t plane = (size_t)G * kAmxGroupBytes;
  const uint16_t* dt = (const uint16_t*)W.biases + (size_t)t * S * NT;
  alignas(64) int32_t c[3][256];
  __m512 facc[16];
  for (int r = 0; r < 16; r++) facc[r] = _mm512_setzero_ps();
  const __m512i k7 = _mm512_set1_epi32(7), k49 = _mm512_set1_epi32(49);
  for (int i = 0; i < 5; i++) k6s_part<T>(i, xa, wb, plane, 0);
  for (int s = 0; s < S; s++) {
    T::template store<0>(c[0], 64);
    T::template store<1>(c[1], 64);
    T::template store<2>(c[2], 64);
    const bool next = s + 1 < S;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(dt + (size_t)s * NT)));
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) {
      if (next && r % 3 == 0 && r < 15) k6s_part<T>(r / 3, xa, wb, plane, s + 1);
      const __m512i isum = _mm512_add_epi32(
          _mm512_load_si512(c[0] + r * NT),
          _mm512_add_epi32(_mm512_mullo_epi32(_mm512_load_si512(c[1] + r * NT), k7), _mm512_mullo_epi32(_mm512_load_si512(c[2] + r * NT), k49)));
      facc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum)), _mm512_set1_ps(X.d[(size_t)(m0 + r) * S + s]), facc[r]);
    }
  }
  for (int r = 0; r < 16; r++) _mm512_store_ps(out + r * NT, facc[r]);
}

template <class T>
void k6s_rows(const QMat& W, const Q8K& X, const int8_t* pa, int M16, int t0, int t1, float* y, int ldy,
              const float* residual, const float* bias, int pair = 0) {
  amx_row_blocks<T, 64, 24>(
      W, M16, t0, t1, y, ldy, residual, bias, 1 << 20, [&](int t, uint8_t* wb) { unpack_k6_scaled(W, t, wb); },
      [&](int t, uint8_t* wb, int m, int, float* acc) { k6s_amx<T>(W, t, wb, X, pa + (size_t)m * W.K, m, acc); },
      pair);
}

#endif  // TARG_VNNI

}  // namespace targ
