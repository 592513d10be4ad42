// The K-quants on AMX tiles (amx.h): Q4_K and Q6_K with their integer scales inside the B
// tiles, so a super-block of 256 sums in a few C tiles, and the integers those give are exactly
// the ones the VNNI kernels (k4tiles.h, k6tiles.h) make per super-block.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_tiles.h"
#include "k4tiles.h"
#include "k6tiles.h"
#include "qgemm.h"

namespace targ {

#if TARG_VNNI
// The row-block driver every AMX product shares (amx.h's affine rows, Q4_K and Q6_K below):
// tiles [t0, t1) for rows [0, M16) (a multiple of 16), the rows in blocks whose int8 activations
// stay in L2 (`l2_bytes` of a core's 2 MB) while each weight tile is unpacked once per block:
// unpack(t, wb) lays tile t out in `Lines` 64-byte lines per group of QG; block(t, wb, m, acc)
// multiplies rows [m, m + 16) into acc; each row is then finished (scale, residual, bias).
template <class T, int KB, int Lines, class Unpack, class Block>
void amx_row_blocks(const QMat& W, int M16, int t0, int t1, float* y, int ldy, const float* residual,
                    const float* bias, int l2_bytes, Unpack unpack, Block block) {
  struct alignas(64) Line {
    uint8_t b[64];
  };
  thread_local std::vector<Line> wbuf;
  const size_t groups = (size_t)W.K / QG;
  if (wbuf.size() < groups * Lines) wbuf.resize(groups * Lines);
  uint8_t* wb = wbuf.data()->b;
  alignas(64) float acc[16 * NT];
  T::begin(tile_config(KB));
  const int MB = std::max(16, l2_bytes / W.K / 16 * 16);
  for (int mb = 0; mb < M16; mb += MB) {
    const int me = std::min(M16, mb + MB);
    for (int t = t0; t < t1; t++) {
      unpack(t, wb);
      for (int m = mb; m < me; m += 16) {
        block(t, wb, m, acc);
        for (int r = 0; r < 16; r++) finish(acc + r * NT, m + r, t * NT, NT, y, ldy, residual, bias);
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
inline void unpack_k4_scaled(const QMat& W, int t, uint8_t* wlo, uint8_t* whi) {
  const int G = W.K / QG;
  const uint8_t* smt = (const uint8_t*)W.scales + (size_t)t * G * 2 * NT;
  alignas(64) int8_t idx[64];
  for (int b = 0; b < 64; b++) idx[b] = (int8_t)(b / 4);  // byte 4c + i <- column c's scale
  const __m512i cidx = _mm512_load_si512(idx), even = _mm512_set1_epi16(0x00ff), seven = _mm512_set1_epi8(7);
  auto mul = [&](__m512i q, __m512i s) {  // bytes q * s, each below 256
    const __m512i lo = _mm512_and_si512(_mm512_mullo_epi16(q, _mm512_and_si512(s, even)), even);
    const __m512i hi = _mm512_slli_epi16(_mm512_mullo_epi16(_mm512_srli_epi16(q, 8), _mm512_srli_epi16(s, 8)), 8);
    return _mm512_or_si512(lo, hi);
  };
  for (int g = 0; g < G; g++) {
    __m512i w[8];
    k4_operands(W.q + (size_t)t * W.tile_bytes() + (size_t)g * W.group_bytes(), w);
    const __m512i sc = _mm512_permutexvar_epi8(cidx, _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)(smt + (size_t)g * 2 * NT))));
    const __m512i sl = _mm512_and_si512(sc, seven), sh = _mm512_and_si512(_mm512_srli_epi16(sc, 3), seven);
    for (int o = 0; o < 8; o++) {
      _mm512_store_si512(wlo + (size_t)g * kAmxGroupBytes + 64 * o, mul(w[o], sl));
      _mm512_store_si512(whi + (size_t)g * kAmxGroupBytes + 64 * o, mul(w[o], sh));
    }
  }
}

template <class T>
inline void k4s_amx(const QMat& W, int t, const uint8_t* wlo, const uint8_t* whi, const Q8K& X, const int8_t* xa, int m0,
                    float* out) {
  const int K = W.K, G = K / QG, S = K / QK;
  const uint8_t* smt = (const uint8_t*)W.scales + (size_t)t * G * 2 * NT;
  alignas(64) int32_t cl[256], ch[256];
  for (int r = 0; r < 16; r++) _mm512_store_ps(out + r * NT, _mm512_setzero_ps());
  for (int s = 0; s < S; s++) {
    T::template zero<0>();
    T::template zero<1>();
    for (int p = 0; p < 4; p += 2) {  // 64 k a product: A tiles 4 and 6 by turns
      const size_t c0 = (size_t)(4 * s + p) * 1024, c1 = c0 + 1024;
      T::template load<4>(xa + c0, 64);
      T::template load<5>(wlo + c0, 64);
      T::template load<7>(whi + c0, 64);
      T::template dp<0, 4, 5, false>();
      T::template dp<1, 4, 7, false>();
      T::template load<6>(xa + c1, 64);
      T::template load<5>(wlo + c1, 64);
      T::template load<7>(whi + c1, 64);
      T::template dp<0, 6, 5, false>();
      T::template dp<1, 6, 7, false>();
    }
    T::template store<0>(cl, 64);
    T::template store<1>(ch, 64);
    const K4Mins km = k4_mins(W, t, s, smt);
    const __m512i* m16 = km.m16;
    const __m512 d = km.d, dmin = km.dmin;
    for (int r = 0; r < 16; r++) {
      const __m512i a32 = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(ch + r * NT), 3), _mm512_load_si512(cl + r * NT));
      const int16_t* xs = X.bsum32 + (size_t)(m0 + r) * G + 8 * s;
      __m512i mn = _mm512_setzero_si512();
      for (int p = 0; p < 4; p++) {
        int32_t pair;
        std::memcpy(&pair, xs + 2 * p, 4);
        mn = _mm512_dpwssd_epi32(mn, m16[p], _mm512_set1_epi32(pair));
      }
      const __m512 v = _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(a32), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn)));
      _mm512_store_ps(out + r * NT, _mm512_fmadd_ps(v, _mm512_set1_ps(X.d[(size_t)(m0 + r) * S + s]), _mm512_load_ps(out + r * NT)));
    }
  }
}

// Tiles [t0, t1) x rows [0, M16) of Q4_K by k4s_amx (A tiles packed 64 k a tile).
template <class T>
void k4s_rows(const QMat& W, const Q8K& X, const int8_t* pa, int M16, int t0, int t1, float* y, int ldy,
              const float* residual, const float* bias) {
  const size_t lo_bytes = (size_t)W.K / QG * kAmxGroupBytes;  // wlo, then whi: two B copies a tile
  // rows whose activations share L2 (2 MB a core on AMX CPUs) with the tile's two B copies
  amx_row_blocks<T, 64, 16>(
      W, M16, t0, t1, y, ldy, residual, bias, 3 << 19, [&](int t, uint8_t* wb) { unpack_k4_scaled(W, t, wb, wb + lo_bytes); },
      [&](int t, uint8_t* wb, int m, float* acc) { k4s_amx<T>(W, t, wb, wb + lo_bytes, X, pa + (size_t)m * W.K, m, acc); });
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

template <class T>
inline void k6s_amx(const QMat& W, int t, const uint8_t* wb, const Q8K& X, const int8_t* xa, int m0, float* out) {
  const int K = W.K, G = K / QG, S = K / QK;
  const size_t plane = (size_t)G * kAmxGroupBytes;
  const uint16_t* dt = (const uint16_t*)W.biases + (size_t)t * S * NT;
  alignas(64) int32_t c[3][256];
  for (int r = 0; r < 16; r++) _mm512_store_ps(out + r * NT, _mm512_setzero_ps());
  const __m512i k7 = _mm512_set1_epi32(7), k49 = _mm512_set1_epi32(49);
  for (int s = 0; s < S; s++) {
    T::template zero<0>();
    T::template zero<1>();
    T::template zero<2>();
    for (int p = 0; p < 4; p += 2) {  // 64 k a product: A tiles 4 and 6 by turns; B tiles 5, 7, 3
      const size_t c0 = (size_t)(4 * s + p) * 1024, c1 = c0 + 1024;
      T::template load<4>(xa + c0, 64);
      T::template load<5>(wb + c0, 64);
      T::template load<7>(wb + plane + c0, 64);
      T::template load<3>(wb + 2 * plane + c0, 64);
      T::template dp<0, 4, 5, true>();
      T::template dp<1, 4, 7, true>();
      T::template dp<2, 4, 3, true>();
      T::template load<6>(xa + c1, 64);
      T::template load<5>(wb + c1, 64);
      T::template load<7>(wb + plane + c1, 64);
      T::template load<3>(wb + 2 * plane + c1, 64);
      T::template dp<0, 6, 5, true>();
      T::template dp<1, 6, 7, true>();
      T::template dp<2, 6, 3, true>();
    }
    T::template store<0>(c[0], 64);
    T::template store<1>(c[1], 64);
    T::template store<2>(c[2], 64);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(dt + (size_t)s * NT)));
    for (int r = 0; r < 16; r++) {
      const __m512i isum = _mm512_add_epi32(
          _mm512_load_si512(c[0] + r * NT),
          _mm512_add_epi32(_mm512_mullo_epi32(_mm512_load_si512(c[1] + r * NT), k7), _mm512_mullo_epi32(_mm512_load_si512(c[2] + r * NT), k49)));
      _mm512_store_ps(out + r * NT, _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum)),
                                                    _mm512_set1_ps(X.d[(size_t)(m0 + r) * S + s]), _mm512_load_ps(out + r * NT)));
    }
  }
}

template <class T>
void k6s_rows(const QMat& W, const Q8K& X, const int8_t* pa, int M16, int t0, int t1, float* y, int ldy,
              const float* residual, const float* bias) {
  amx_row_blocks<T, 64, 24>(
      W, M16, t0, t1, y, ldy, residual, bias, 1 << 20, [&](int t, uint8_t* wb) { unpack_k6_scaled(W, t, wb); },
      [&](int t, uint8_t* wb, int m, float* acc) { k6s_amx<T>(W, t, wb, X, pa + (size_t)m * W.K, m, acc); });
}

#endif  // TARG_VNNI

}  // namespace targ
