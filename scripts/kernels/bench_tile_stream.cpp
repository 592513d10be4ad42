// How fast AMX int8 tile products run when their A and B tiles stream from buffers of a given size
// (L1, L2, beyond), in the 2 x 2 pattern the K-quant kernels use (4 C tiles, 2 A and 2 B loaded
// per 4 products), with and without a store and zero of the C tiles every 16 products (a Q4_K
// super-block). Prints G int8 multiply-adds/s for one core; compare with bench_int8_peak.py's
// tdpbssd line run just before (the VM's tile rate moves between ~0.9 and ~2.3 T within minutes).
//
//   g++ -std=gnu++20 -O3 -march=native -mamx-tile -mamx-int8 scripts/kernels/bench_tile_stream.cpp -o /tmp/tile_stream
//   /tmp/tile_stream
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
struct alignas(64) Cfg {
  uint8_t palette, start, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
#define L(t, p) _tile_loadd(t, p, 64)
#define D(c, a, b) _tile_dpbssd(c, a, b)

int main() {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0)
    return std::printf("AMX tile state not granted here\n"), 1;
  Cfg cfg{};
  cfg.palette = 1;
  for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
  _tile_loadconfig(&cfg);
  alignas(64) static uint8_t cbuf[4096];
  for (size_t kb : {16, 256, 1024, 4096}) {  // bytes of A, and of B, streamed
    const size_t bytes = kb * 1024, steps = bytes / 2048;
    std::vector<uint8_t> A(bytes + 64), B(bytes + 64);
    for (size_t i = 0; i < A.size(); i++) A[i] = (uint8_t)(i * 7), B[i] = (uint8_t)(i * 13);
    uint8_t* a = (uint8_t*)(((uintptr_t)A.data() + 63) & ~(uintptr_t)63);
    uint8_t* b = (uint8_t*)(((uintptr_t)B.data() + 63) & ~(uintptr_t)63);
    const int reps = (int)std::max<size_t>(1, (64ul << 20) / bytes);
    for (int stores = 0; stores < 2; stores++) {
      double best = 1e9;
      for (int it = 0; it < 3; it++) {
        const double t = now();
        for (int r = 0; r < reps; r++)
          for (size_t s = 0; s < steps; s++) {
            L(4, a + s * 2048); L(6, a + s * 2048 + 1024); L(5, b + s * 2048);
            D(0, 4, 5); D(2, 6, 5);
            L(7, b + s * 2048 + 1024);
            D(1, 4, 7); D(3, 6, 7);
            if (stores && s % 4 == 3) {
              _tile_stored(0, cbuf, 64); _tile_stored(1, cbuf + 1024, 64);
              _tile_stored(2, cbuf + 2048, 64); _tile_stored(3, cbuf + 3072, 64);
              _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            }
          }
        best = std::min(best, now() - t);
      }
      std::printf("A and B %5zu KB each%s: %.0f G int8 MAC/s\n", kb, stores ? ", C stored every 16" : "              ",
                  (double)reps * steps * 4 * 16384 / best / 1e9);
    }
  }
  _tile_release();
}
