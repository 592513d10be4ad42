// The bfloat16 tile products' ceiling on this CPU, one core: TDPBF16PS with no loads and with 2
// tile loads per 4 products (the same addresses: L1), against bf16gemm.h's 2x2 block loop (4 tile
// loads per 4 products, the next products reading the tiles just loaded) with its operands in L1,
// the A rows as stored (16 lines K * 2 bytes apart) or packed (1 KB contiguous), in two orders,
// and the block itself (its C tiles stored to the stack, the bias added, 32 rows written).
// Why: the encoder's products run at ~150 G multiply-adds/s a core on AMX-BF16 tiles whether
// their operands are in L1, L2 or L3 (BENCHMARKS.md, row "the encoder's tile loop").
//
//   g++ -std=gnu++20 -O3 -march=native -Itarg_mlx/runtime/native/csrc scripts/kernels/bench_bf16_tiles.cpp -o /tmp/bench_bf16_tiles -lpthread
//   /tmp/bench_bf16_tiles
#include "amx.h"
#include "bf16gemm.h"
#include <cstdio>
#include <ctime>
using namespace targ;
static double now() { timespec ts; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); return ts.tv_sec + 1e-9 * ts.tv_nsec; }
template <int V>
__attribute__((noinline)) void run(const uint16_t* a, size_t astr, size_t anext, size_t akstep, const uint16_t* w, size_t wblock, int K) {
  HwTiles::zero<0>(); HwTiles::zero<1>(); HwTiles::zero<2>(); HwTiles::zero<3>();
  for (int kb = 0; kb < K / 32; kb++) {
    if constexpr (V == 0) {
      HwTiles::load<4>(a + kb * akstep, astr);
      HwTiles::load<6>(a + anext + kb * akstep, astr);
      HwTiles::load<5>(w + (size_t)kb * 512, 64);
      HwTiles::dpbf16<0, 4, 5>();
      HwTiles::dpbf16<2, 6, 5>();
      HwTiles::load<7>(w + wblock + (size_t)kb * 512, 64);
      HwTiles::dpbf16<1, 4, 7>();
      HwTiles::dpbf16<3, 6, 7>();
    } else {
      HwTiles::load<4>(a + kb * akstep, astr);
      HwTiles::load<5>(w + (size_t)kb * 512, 64);
      HwTiles::load<7>(w + wblock + (size_t)kb * 512, 64);
      HwTiles::load<6>(a + anext + kb * akstep, astr);
      HwTiles::dpbf16<0, 4, 5>();
      HwTiles::dpbf16<1, 4, 7>();
      HwTiles::dpbf16<2, 6, 5>();
      HwTiles::dpbf16<3, 6, 7>();
    }
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
  HwTiles::begin(tile_config(64));
  const size_t wblock = (size_t)K / 2 * 32;
  const int reps = 20000;
  for (int round = 0; round < 2; round++) {
    for (int packed = 0; packed < 2; packed++) {
      size_t astr = packed ? 64 : K * 2, anext = packed ? 16 * K : 16 * K, akstep = packed ? 512 : 32;
      double t = now();
      for (int r = 0; r < reps; r++) run<0>(a.data(), astr, anext, akstep, w.data(), wblock, K);
      double d0 = now() - t; t = now();
      for (int r = 0; r < reps; r++) run<1>(a.data(), astr, anext, akstep, w.data(), wblock, K);
      double d1 = now() - t;
      printf("A %s: order0 %.0f G/s, order1 %.0f G/s\n", packed ? "packed" : "rows  ", (double)reps * 32 * 32 * K / d0 / 1e9, (double)reps * 32 * 32 * K / d1 / 1e9);
    }
    {  // bf16gemm.h's block itself on the same operands: the loop, then its C tiles stored, the bias added, the rows written
      std::vector<float> bias(32, 0.5f), c(32 * 32);
      double t = now();
      for (int r = 0; r < reps; r++) amx_bf16_block<2, 2>(a.data(), K, w.data(), wblock, K, bias.data(), c.data(), 32, false);
      printf("amx_bf16_block<2, 2> (loop + epilogue): %.0f G/s\n", (double)reps * 32 * 32 * K / (now() - t) / 1e9);
    }
  }
  HwTiles::end();
}
