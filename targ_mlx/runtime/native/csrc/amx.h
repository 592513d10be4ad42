// Prefill on Intel AMX int8 tiles: the matrix products of 32 rows or more (48 for Q6_K; prompts,
// the eval's prefill, the batched draft) for Q4_K tiles in the k4 layout (k4tiles.h), Q6_K tiles
// (k6tiles.h) and 4- or 8-bit affine tiles (qgemm.h). Fewer rows stay on the VNNI kernels.
//
// The weights stay as they are stored; each 16-column tile is unpacked once per block of rows
// into B tiles (built from the VNNI kernels' own vpdpbusd operands, amx_tiles.h), which the row
// blocks then reuse from L1/L2. The activations are quantized exactly as for the VNNI kernels
// (Q8_K per 256 for the K-quants, per 32 for affine tiles) and packed as A tiles (pack_a).
//
//  - affine tiles: one TDPBSUD per group of 32 gives 16 rows x 16 columns of the group's integer
//    dot products; the float scales are applied per group by the VNNI kernel's operations.
//  - Q4_K and Q6_K: the integer scales go into the B tiles (split into small digits so the
//    products stay bytes), so a super-block of 256 sums in a few C tiles and one store; the
//    digits recombine into exactly the integer the VNNI kernel makes per super-block, and its
//    float fold per 256 follows.
//
// So every output is bit for bit the VNNI kernel's (tests/test_amx.py). Rows are taken 16 at a
// time; the last M % 16 rows go to the VNNI kernel (a row's result does not depend on the rows
// beside it, so the split changes no bit).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "amx_kquant.h"
#include "amx_tiles.h"
#include "k4tiles.h"
#include "k6tiles.h"
#include "qgemm.h"

namespace targ {


// Which operand layout a matrix's B tiles take.
enum class AmxKind { k4, k6, affine4, affine8 };
inline AmxKind amx_kind(const QMat& W) {
  if (W.bits == 6) return AmxKind::k6;
  if (W.k4) return AmxKind::k4;
  return W.bits == 4 ? AmxKind::affine4 : AmxKind::affine8;
}

// ---- B tiles, portable: byte 4c + i of row o is the weight of column c that meets activation
// byte 4o + i of the group as the activations are stored for that format ------------------------
inline int act_k(AmxKind kind, int p) {  // which k of the group activation byte p holds
  if (kind != AmxKind::affine4) return p;
  // quantize_rows (VNNI) stores each 16 bytes as the 8 even k, then the 8 odd k, in runs of 4
  static constexpr int order[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
  return p - p % 16 + order[p % 16];
}

inline int weight_value(const QMat& W, AmxKind kind, const uint8_t* grp, int k, int c) {
  if (kind == AmxKind::k6) {  // low 4 bits in the k4 layout, high 2 in the planes (k6tiles.h)
    const uint8_t b = grp[64 * (k / 8) + 4 * c + k % 4];
    const int lo = (k % 8) < 4 ? (b & 0x0f) : (b >> 4);
    const int hi = (grp[256 + 64 * (k / 16) + 4 * c + k % 4] >> (2 * (k % 16 / 4))) & 3;
    return lo | hi << 4;
  }
  return qval(W, grp, k, c);
}

inline void operands_ref(const QMat& W, int t, int g, uint8_t* out) {
  const AmxKind kind = amx_kind(W);
  const uint8_t* grp = W.q + (size_t)t * W.tile_bytes() + (size_t)g * W.group_bytes();
  for (int p = 0; p < QG; p++)
    for (int c = 0; c < NT; c++) out[64 * (p / 4) + 4 * c + p % 4] = (uint8_t)weight_value(W, kind, grp, act_k(kind, p), c);
}

#if TARG_VNNI
// The same bytes from the VNNI kernels' own unpacking.
inline void operands_simd(const QMat& W, int t, int g, uint8_t* out) {
  const uint8_t* grp = W.q + (size_t)t * W.tile_bytes() + (size_t)g * W.group_bytes();
  __m512i w[8];
  switch (amx_kind(W)) {
    case AmxKind::k4: k4_operands(grp, w); break;
    case AmxKind::k6: k6_operands(grp, w); break;
    case AmxKind::affine4: q8_operands<4>(grp, vnni_order(), w); break;
    case AmxKind::affine8: q8_operands<8>(grp, vnni_order(), w); break;
  }
  for (int o = 0; o < 8; o++) _mm512_store_si512(out + 64 * o, w[o]);
}
#endif

// All groups of tile t: K/32 x 512 bytes (64-byte aligned).
inline void unpack_tile(const QMat& W, int t, uint8_t* wb, bool simd) {
  for (int g = 0; g < W.K / QG; g++) {
#if TARG_VNNI
    if (simd) {
      operands_simd(W, t, g, wb + (size_t)g * kAmxGroupBytes);
      continue;
    }
#endif
    (void)simd;
    operands_ref(W, t, g, wb + (size_t)g * kAmxGroupBytes);
  }
}

// A tiles: rows [m0, m1) (a multiple of 16) of int8 activations xq (row stride K) as blocks of
// 16 rows, each K / KB runs of 16 rows x KB bytes, so one A tile is 16 * KB contiguous bytes
// (as loaded from the rows themselves, each tile touched 16 cache lines for half of each, and
// the rows' stream from L2 held the tile products back).
inline void pack_a(const int8_t* xq, int K, int KB, int m0, int m1, int8_t* pa) {
  for (int m = m0; m < m1; m += 16) {
    int8_t* blk = pa + (size_t)m * K;
    for (int r = 0; r < 16; r++)
      for (int i = 0; i < K / KB; i++) std::memcpy(blk + ((size_t)i * 16 + r) * KB, xq + (size_t)(m + r) * K + i * KB, KB);
  }
}

// Integer dot products of a block of 16 activation rows (xa: its A tiles, pack_a) with the groups
// [g0, g0 + n) of a tile's B tiles: cb[j] = 16 rows x 16 columns, int32. KB = 32: one product
// per group (configuration tile_config(32)); KB = 16: two per group, its sub-blocks of 16 k, into
// cb[2j] and cb[2j + 1] (tile_config(16)).
//
// Issued a product at a time (step), so the kernels spread the next products' tile instructions
// through the vector code that applies the scales to the last ones: issued all at once, the
// stores waited on the tile products at the head of the reorder buffer and the vector code
// behind them stalled (the tile stores and zeroes held 40% of the samples). Product j goes to C
// tile j % 4 with A and B tiles 4, 5 or 6, 7 by turns; its store is issued two steps later.
template <class T, int KB, bool SIGNED_B = false>
struct DotPipe {
  static constexpr int parts = QG / KB;  // products per group
  const int8_t* xa = nullptr;
  const uint8_t* wb = nullptr;
  int32_t* cb = nullptr;
  int g0 = 0, total = 0, next = 0, stored = 0;

  void start(const int8_t* xa_, const uint8_t* wb_, int g0_, int n, int32_t* cb_) {
    xa = xa_, wb = wb_, g0 = g0_, total = n * parts, cb = cb_, next = stored = 0;
  }
  template <int C>
  void issue(int i) {
    constexpr int A = C % 2 ? 6 : 4, B = A + 1;
    T::template zero<C>();
    T::template load<A>(xa + (size_t)(g0 * parts + i) * 16 * KB, KB);
    T::template load<B>(wb + (size_t)(g0 + i / parts) * kAmxGroupBytes + (i % parts) * 256, 64);
    T::template dp<C, A, B, SIGNED_B>();
  }
  void store(int i) {
    int32_t* c = cb + (size_t)i * 256;
    switch (i & 3) {
      case 0: T::template store<0>(c, 64); break;
      case 1: T::template store<1>(c, 64); break;
      case 2: T::template store<2>(c, 64); break;
      default: T::template store<3>(c, 64); break;
    }
  }
  void step() {
    if (next >= total) return;
    switch (next & 3) {
      case 0: issue<0>(next); break;
      case 1: issue<1>(next); break;
      case 2: issue<2>(next); break;
      default: issue<3>(next); break;
    }
    next++;
    if (next - stored > 2) store(stored++);
  }
  void drain() {  // every product issued and stored
    while (next < total) step();
    while (stored < total) store(stored++);
  }
};

template <class T, int KB, bool SIGNED_B = false>
inline void group_dots(const int8_t* xa, const uint8_t* wb, int g0, int n, int32_t* cb) {
  DotPipe<T, KB, SIGNED_B> p;
  p.start(xa, wb, g0, n, cb);
  p.drain();
}

#if TARG_VNNI
// ---- the scales, as the VNNI kernels apply them -----------------------------------------------
// Affine tiles (q8_tiles): per group y += d * (scale * dot) + ds * bias, group after group.
template <class T>
inline void affine_amx(const QMat& W, int t, const uint8_t* wb, const Q8& X, const int8_t* xa, int m0, float* out) {
  const int K = W.K, G = K / QG;
  alignas(64) int32_t cbuf[2][8 * 256];
  for (int r = 0; r < 16; r++) _mm512_store_ps(out + r * NT, _mm512_setzero_ps());
  DotPipe<T, 32> pipe;
  group_dots<T, 32>(xa, wb, 0, std::min(8, G), cbuf[0]);
  for (int g0 = 0; g0 < G; g0 += 8) {
    const int n = std::min(8, G - g0);
    pipe.start(xa, wb, g0 + 8, std::max(0, std::min(8, G - g0 - 8)), cbuf[(g0 / 8 + 1) & 1]);
    const int32_t* cb = cbuf[(g0 / 8) & 1];
    __m512 s[8], b[8];
    for (int j = 0; j < n; j++) {
      float sf[NT], bf[NT];
      const Affine16 a = group_affine(W, t, g0 + j, sf, bf);
      s[j] = _mm512_loadu_ps(a.s), b[j] = _mm512_loadu_ps(a.b);
    }
    for (int r = 0; r < 16; r++) {
      if (r % 2 == 0) pipe.step();
      __m512 acc = _mm512_load_ps(out + r * NT);
      for (int j = 0; j < n; j++) {
        const size_t dg = (size_t)(m0 + r) * G + g0 + j;
        const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb + j * 256 + r * NT)), s[j]);
        acc = _mm512_fmadd_ps(f, _mm512_set1_ps(X.d[dg]), acc);
        acc = _mm512_fmadd_ps(b[j], _mm512_set1_ps(X.ds[dg]), acc);
      }
      _mm512_store_ps(out + r * NT, acc);
    }
    pipe.drain();
  }
}

// Tiles [t0, t1) for rows [0, M16) by block(W, t, wb, X, xa, m, acc) over tiles unpacked by
// unpack_tile (8 lines a group), 1 MB of a core's L2 for the activations (amx_row_blocks).
template <class T, int KB, class Xs, class Block>
void amx_rows(const QMat& W, const Xs& X, const int8_t* pa, int M16, int t0, int t1, float* y, int ldy,
              const float* residual, const float* bias, Block block, int pair = 0) {
  amx_row_blocks<T, KB, 8>(
      W, M16, t0, t1, y, ldy, residual, bias, 1 << 20, [&](int t, uint8_t* wb) { unpack_tile(W, t, wb, true); },
      [&](int t, uint8_t* wb, int m, int, float* acc) { block(W, t, wb, X, pa + (size_t)m * W.K, m, acc); }, pair);
}

// Rows from m on (a view of the activations and outputs, for the VNNI kernels' rest).
inline Q8K rows_from(Q8K X, int m) {
  X.q += (size_t)m * X.K, X.d += (size_t)m * X.S, X.bsum += (size_t)m * (X.K / 16), X.bsum32 += (size_t)m * (X.K / 32);
  return X;
}
inline Q8 rows_from(Q8 X, int m) {
  X.q += (size_t)m * X.K, X.d += (size_t)m * X.G, X.ds += (size_t)m * X.G;
  return X;
}
#endif  // TARG_VNNI

// Rows at and above which AMX takes a product: below, the VNNI kernel of the format was as fast
// or faster (scripts/kernels/bench_amx.cpp, one core, thread CPU time, the 1.5B's shapes). The plain C++
// engine (tests) takes every product of 16 rows or more.
inline int amx_min_rows(const QMat& W) { return amx_kind(W) == AmxKind::k6 ? 48 : 32; }

// Whether amx_gemm runs W x M rows in this process.
inline bool amx_takes(const QMat& W, int M) {
#if TARG_VNNI
  const int mode = amx_mode().load(std::memory_order_relaxed);
  return mode != kAmxOff && M >= (mode == kAmxRef ? 16 : amx_min_rows(W));
#else
  (void)W, (void)M;
  return false;
#endif
}

#if TARG_VNNI
// swiglu: W is gate|up (its up half the second N / 2 columns) and y (M x N / 2, row stride ldy)
// gets SwiGLU of the two halves (amx_row_blocks' `pair`); residual and bias are null then.
template <class T>
inline void amx_tiles(const QMat& W, const float* x, int M, float* y, int ldy, const float* residual, const float* bias,
                      bool swiglu = false) {
  const int M16 = M / 16 * 16, tiles = W.N / NT, pair = swiglu ? tiles / 2 : 0, out_tiles = swiglu ? pair : tiles;
  const size_t rest = (size_t)M16 * ldy;
  const float* res_rest = residual ? residual + rest : nullptr;
  auto run = [&](auto body) {
    if ((long)M * W.N * W.K < (1 << 18)) body(0, out_tiles);
    else parallel_range(out_tiles, 4, 4, body);
  };
  const AmxKind kind = amx_kind(W);
  // the A tiles of rows [0, M16), made once per product for every task
  thread_local std::vector<int8_t> abuf;
  if (abuf.size() < (size_t)M16 * W.K) abuf.resize((size_t)M16 * W.K);
  int8_t* pa = abuf.data();
  auto pack = [&](const int8_t* xq, int KB) {
    if ((long)M16 * W.K < (1 << 16)) pack_a(xq, W.K, KB, 0, M16, pa);
    else parallel_range(M16 / 16, 1, 1, [&](int a, int b) { pack_a(xq, W.K, KB, 16 * a, 16 * b, pa); });
  };
  // the last M % 16 rows on the VNNI kernel of the format: with swiglu, both halves into `gu`
  // (those rows x N), then SwiGLU of the task's columns
  std::vector<float> gu(swiglu ? (size_t)(M - M16) * W.N : 0);
  auto rest_rows = [&](int a, int b, auto vnni) {
    if (M16 == M) return;
    if (!swiglu) return vnni(a, b, y + rest, ldy, res_rest);
    vnni(a, b, gu.data(), W.N, nullptr);
    vnni(a + pair, b + pair, gu.data(), W.N, nullptr);
    for (int r = 0; r < M - M16; r++)
      for (int t = a; t < b; t++) {
        const float* g = gu.data() + (size_t)r * W.N + t * NT;
        swiglu16(g, g + W.N / 2, y + rest + (size_t)r * ldy + t * NT);
      }
  };
  if (kind == AmxKind::k4 || kind == AmxKind::k6) {
    const Q8K X = quantize_q8k_scratch(x, M, W.K);
    pack(X.q, 64);
    run([&](int a, int b) {
      const Q8K Xr = rows_from(X, M16);
      if (kind == AmxKind::k4) {
        k4s_rows<T>(W, X, pa, M16, a, b, y, ldy, residual, bias, pair);
        rest_rows(a, b, [&](int a_, int b_, float* yr, int ld, const float* rr) { k4_tiles(W, Xr, M - M16, a_, b_, yr, ld, rr, bias); });
      } else {
        k6s_rows<T>(W, X, pa, M16, a, b, y, ldy, residual, bias, pair);
        rest_rows(a, b, [&](int a_, int b_, float* yr, int ld, const float* rr) { k6_tiles(W, Xr, M - M16, a_, b_, yr, ld, rr, bias); });
      }
    });
    return;
  }
  const Q8 X = quantize_q8_scratch(x, M, W.K, W.bits);
  pack(X.q, 32);
  run([&](int a, int b) {
    amx_rows<T, 32>(W, X, pa, M16, a, b, y, ldy, residual, bias, affine_amx<T>, pair);
    const Q8 Xr = rows_from(X, M16);
    rest_rows(a, b, [&](int a_, int b_, float* yr, int ld, const float* rr) {
      if (W.bits == 4) q8_gemm_tiles<4>(W, Xr, M - M16, a_, b_, yr, ld, rr, bias);
      else q8_gemm_tiles<8>(W, Xr, M - M16, a_, b_, yr, ld, rr, bias);
    });
  });
}
#endif

// y (M x N, row stride ldy) = x (M x K) W^T [+ bias] [+ residual] on tiles, for M >= 16 where
// amx_takes(M): the hardware's, or the plain C++ engine's where set_amx asks for it (tests).
inline void amx_gemm(const QMat& W, const float* x, int M, float* y, int ldy, const float* residual, const float* bias,
                     bool swiglu = false) {
#if TARG_VNNI
#if TARG_AMX
  if (amx_mode().load() == kAmxHw) return amx_tiles<HwTiles>(W, x, M, y, ldy, residual, bias, swiglu);
#endif
  amx_tiles<RefTiles>(W, x, M, y, ldy, residual, bias, swiglu);
#else
  (void)W, (void)x, (void)M, (void)y, (void)ldy, (void)residual, (void)bias, (void)swiglu;
  throw std::invalid_argument("the AMX kernels run on AVX512-VNNI builds only");
#endif
}

// Per-group integer dot products of int8 activations xq (M x K, M a multiple of 16, natural k
// order) with W's tiles, through the tile layout and the plain C++ engine: (M, G * parts, N)
// int32, parts = 2 for Q6_K (sub-blocks of 16), else 1. Portable: the check of the layout.
inline void tile_dots(const QMat& W, const int8_t* xq, int M, bool simd_unpack, int32_t* out) {
  const AmxKind kind = amx_kind(W);
  const int K = W.K, G = K / QG, parts = kind == AmxKind::k6 ? 2 : 1, tiles = W.N / NT;
  std::vector<int8_t> xa((size_t)M * K);  // activations in the order the kernels store them
  for (int m = 0; m < M; m++)
    for (int p = 0; p < K; p++) xa[(size_t)m * K + p] = xq[(size_t)m * K + p - p % QG + act_k(kind, p % QG)];
  std::vector<uint8_t> wb((size_t)G * kAmxGroupBytes + 64);
  uint8_t* w = (uint8_t*)(((uintptr_t)wb.data() + 63) / 64 * 64);
  std::vector<int32_t> cb((size_t)2 * 256);
  std::vector<int8_t> pa((size_t)M * K);
  pack_a(xa.data(), K, 32 / parts, 0, M, pa.data());
  RefTiles::begin(tile_config(32 / parts));
  for (int t = 0; t < tiles; t++) {
    unpack_tile(W, t, w, simd_unpack);
    for (int m0 = 0; m0 < M; m0 += 16)
      for (int g = 0; g < G; g++) {
        if (parts == 1) group_dots<RefTiles, 32>(pa.data() + (size_t)m0 * K, w, g, 1, cb.data());
        else group_dots<RefTiles, 16>(pa.data() + (size_t)m0 * K, w, g, 1, cb.data());
        for (int p = 0; p < parts; p++)
          for (int r = 0; r < 16; r++)
            for (int c = 0; c < NT; c++)
              out[((size_t)(m0 + r) * G * parts + g * parts + p) * W.N + t * NT + c] = cb[p * 256 + r * NT + c];
      }
  }
  RefTiles::end();
}

}  // namespace targ
