// Where the AMX tiles' peak goes on this CPU, one core, every operand in L1 (K = 384, MiniLM's):
// TDPBF16PS / TDPBSSD with no loads, with 2 tile loads per 4 products, and 2x2-blocked loops as
// the kernels run them (4 C tiles, 2 A and 2 B loaded per k step: 1 load a product, the fewest 8
// tile registers allow), in bfloat16 and int8, from distinct or one fixed address, and with the
// operands double-buffered (2x1, 1x2: 1.5 loads a product); then bf16gemm.h's block itself (the
// 2x2 loop, its C tiles stored to the stack, the bias added, 32 rows written).
// Why: the encoder's products ran at ~150 G multiply-adds/s a core and the 1.5B's Q4_K tiles at
// 7-13% of the int8 peak (BENCHMARKS.md, row "where the tiles' peak goes").
//
//   g++ -std=gnu++20 -O3 -march=native -Itarg_mlx/runtime/native/csrc scripts/kernels/bench_bf16_tiles.cpp -o /tmp/bench_bf16_tiles -lpthread
//   /tmp/bench_bf16_tiles
#include "amx.h"
#include "bf16gemm.h"
#include <cstdio>
#include <ctime>
using namespace targ;
static double now() { timespec ts; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); return ts.tv_sec + 1e-9 * ts.tv_nsec; }
// 2x2 as bf16gemm.h (I8: the same loop in int8 products, TDPBSSD)
template <bool I8 = false>
__attribute__((noinline)) void v22(const uint16_t* a, const uint16_t* w, size_t wblock, int K) {
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int kb = 0; kb < K / 32; kb++) {
    _tile_loadd(4, a + kb * 512, 64); _tile_loadd(6, a + 16 * K + kb * 512, 64);
    _tile_loadd(5, w + (size_t)kb * 512, 64);
    if constexpr (I8) { _tile_dpbssd(0, 4, 5); _tile_dpbssd(2, 6, 5); }
    else { _tile_dpbf16ps(0, 4, 5); _tile_dpbf16ps(2, 6, 5); }
    _tile_loadd(7, w + wblock + (size_t)kb * 512, 64);
    if constexpr (I8) { _tile_dpbssd(1, 4, 7); _tile_dpbssd(3, 6, 7); }
    else { _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(3, 6, 7); }
  }
}
// 2 rows x 1 col C (tiles 0, 1), operands double-buffered: even k in 2,3,4 (A0, A1, B), odd k in 5,6,7
__attribute__((noinline)) void v21(const uint16_t* a, const uint16_t* w, size_t, int K) {
  _tile_zero(0); _tile_zero(1);
  for (int kb = 0; kb < K / 32; kb += 2) {
    _tile_loadd(2, a + kb * 512, 64); _tile_loadd(3, a + 16 * K + kb * 512, 64); _tile_loadd(4, w + (size_t)kb * 512, 64);
    _tile_dpbf16ps(0, 2, 4); _tile_dpbf16ps(1, 3, 4);
    _tile_loadd(5, a + (kb + 1) * 512, 64); _tile_loadd(6, a + 16 * K + (kb + 1) * 512, 64); _tile_loadd(7, w + (size_t)(kb + 1) * 512, 64);
    _tile_dpbf16ps(0, 5, 7); _tile_dpbf16ps(1, 6, 7);
  }
}
// 1 row x 2 cols C (tiles 0,1), double-buffered (A, B0, B1) in 2,3,4 / 5,6,7
__attribute__((noinline)) void v12(const uint16_t* a, const uint16_t* w, size_t wblock, int K) {
  _tile_zero(0); _tile_zero(1);
  for (int kb = 0; kb < K / 32; kb += 2) {
    _tile_loadd(2, a + kb * 512, 64); _tile_loadd(3, w + (size_t)kb * 512, 64); _tile_loadd(4, w + wblock + (size_t)kb * 512, 64);
    _tile_dpbf16ps(0, 2, 3); _tile_dpbf16ps(1, 2, 4);
    _tile_loadd(5, a + (kb + 1) * 512, 64); _tile_loadd(6, w + (size_t)(kb + 1) * 512, 64); _tile_loadd(7, w + wblock + (size_t)(kb + 1) * 512, 64);
    _tile_dpbf16ps(0, 5, 6); _tile_dpbf16ps(1, 5, 7);
  }
}
// 2x2 C but B double buffered for the second column only? no: 2x2 with 1 A buffered: C 0-3, A 4, A' 5, B 6, B' 7: per k: A0->4, B0->6, B1->7, dp C0(4,6) C1(4,7), A1->5, dp C2(5,6) C3(5,7)
__attribute__((noinline)) void v22b(const uint16_t* a, const uint16_t* w, size_t wblock, int K) {
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int kb = 0; kb < K / 32; kb++) {
    _tile_loadd(4, a + kb * 512, 64); _tile_loadd(6, w + (size_t)kb * 512, 64); _tile_loadd(7, w + wblock + (size_t)kb * 512, 64);
    _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a + 16 * K + kb * 512, 64);
    _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
  }
}

// 2x2, every load from one fixed 1 KB (the count of loads, not their addresses)
__attribute__((noinline)) void v22same(const uint16_t* a, const uint16_t* w, size_t, int K) {
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int kb = 0; kb < K / 32; kb++) {
    _tile_loadd(4, a, 64); _tile_loadd(6, a, 64); _tile_loadd(5, w, 64);
    _tile_dpbf16ps(0, 4, 5); _tile_dpbf16ps(2, 6, 5);
    _tile_loadd(7, w, 64);
    _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(3, 6, 7);
  }
}
static void peaks() {
  alignas(64) static uint16_t buf[2][512];
  alignas(64) static int8_t ib[2][1024];
  for (int i = 0; i < 512; i++) buf[0][i] = 0x3f80, buf[1][i] = 0x3c00 + (i & 7);
  for (int i = 0; i < 1024; i++) ib[0][i] = i * 37 % 251, ib[1][i] = i * 101 % 241;
  HwTiles::begin(tile_config(64));
  const int n = 20000;
  for (int round = 0; round < 2; round++) {
    HwTiles::load<4>(buf[0], 64); HwTiles::load<5>(buf[1], 64);
    double a = now();
    for (int i = 0; i < n; i++) { HwTiles::dpbf16<0, 4, 5>(); HwTiles::dpbf16<1, 4, 5>(); HwTiles::dpbf16<2, 4, 5>(); HwTiles::dpbf16<3, 4, 5>(); }
    double b = now() - a;
    HwTiles::load<4>(ib[0], 64); HwTiles::load<5>(ib[1], 64);
    a = now();
    for (int i = 0; i < n; i++) { HwTiles::dp<0, 4, 5, true>(); HwTiles::dp<1, 4, 5, true>(); HwTiles::dp<2, 4, 5, true>(); HwTiles::dp<3, 4, 5, true>(); }
    double c = now() - a;
    // bf16 with an A and a B load before each group of 4
    a = now();
    for (int i = 0; i < n; i++) { HwTiles::load<4>(buf[0], 64); HwTiles::load<5>(buf[1], 64); HwTiles::dpbf16<0, 4, 5>(); HwTiles::dpbf16<1, 4, 5>(); HwTiles::dpbf16<2, 4, 5>(); HwTiles::dpbf16<3, 4, 5>(); }
    double d = now() - a;
    printf("bf16 no loads %.0f G/s | int8 no loads %.0f G/s | bf16 2 loads per 4 %.0f G/s\n", 4.0 * n * 8192 / b / 1e9, 4.0 * n * 16384 / c / 1e9, 4.0 * n * 8192 / d / 1e9);
  }
  HwTiles::end();
}

int main() {
  amx_grant();
  peaks();
  const int K = 384;
  std::vector<uint16_t> a(32 * K, 0x3f80), w(32 * K, 0x3c00);
  TileConfig cfg; for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16; HwTiles::begin(cfg);
  const size_t wblock = (size_t)K / 2 * 32;
  const int reps = 20000;
  for (int round = 0; round < 3; round++) {
    double t = now(); for (int r = 0; r < reps; r++) v22(a.data(), w.data(), wblock, K); double d22 = now() - t;
    t = now(); for (int r = 0; r < reps; r++) v21(a.data(), w.data(), wblock, K); double d21 = now() - t;
    t = now(); for (int r = 0; r < reps; r++) v12(a.data(), w.data(), wblock, K); double d12 = now() - t;
    t = now(); for (int r = 0; r < reps; r++) v22b(a.data(), w.data(), wblock, K); double d22b = now() - t;
    const double m4 = (double)reps * 32 * 32 * K / 1e9, m2 = m4 / 2;
    t = now(); for (int r = 0; r < reps; r++) v22same(a.data(), w.data(), wblock, K); double ds = now() - t;
    t = now(); for (int r = 0; r < reps; r++) v22<true>(a.data(), w.data(), wblock, K); double di = now() - t;
    printf("same-address 2x2 %.0f | int8 2x2 %.0f | ", m4 / ds, 2 * m4 / di);
    printf("2x2 %.0f | 2x1 dbuf %.0f | 1x2 dbuf %.0f | 2x2 order b %.0f G/s", m4 / d22, m2 / d21, m2 / d12, m4 / d22b);
    {  // bf16gemm.h's block: the 2x2 loop, then its C tiles stored, the bias added, 32 rows written
      std::vector<float> bias(32, 0.5f), c(32 * 32);
      HwTiles::begin(tile_config(64));
      double t = now();
      for (int r = 0; r < reps; r++) amx_bf16_block<2, 2>(a.data(), K, w.data(), wblock, K, bias.data(), c.data(), 32, false);
      printf(" | amx_bf16_block<2, 2> %.0f G/s\n", (double)reps * 32 * 32 * K / (now() - t) / 1e9);
      HwTiles::begin(cfg);
    }
  }
  HwTiles::end();
}
