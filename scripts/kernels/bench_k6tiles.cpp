// Q6_K tiles (csrc/k6tiles.h) against Q6_K rows as stored (csrc/kquant.h: the 512-bit kernel on
// AVX512-VNNI builds), on the same random blocks, in one process, best of alternating calls;
// the last line gives their largest difference against the output's range (the journal,
// docs/archive/benchmarks-journal.md, "Where the 1.5B's prefill goes"). AVX512-VNNI builds only.
//
//   g++ -std=gnu++20 -O3 -march=native -Itarg_mlx/runtime/native/csrc scripts/kernels/bench_k6tiles.cpp -o /tmp/bench_k6tiles -lpthread
//   /tmp/bench_k6tiles N K M [reps]        # e.g. 1536 8960 256 10 (ffn_down), 256 1536 256 (attn_v)
#include "k6tiles.h"
#include <chrono>
#include <cstdio>
#include <random>
using namespace targ;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  const int N = atoi(argv[1]), K = atoi(argv[2]), M = atoi(argv[3]), reps = argc > 4 ? atoi(argv[4]) : 10;
  const int S = K / QK, G = K / QG;
  std::mt19937 rng(1);
  std::vector<uint8_t> b((size_t)N * S * 210);
  for (auto& v : b) v = rng() & 255;
  for (size_t r = 0; r < (size_t)N * S; r++) {
    uint16_t h = _cvtss_sh(0.001f + (rng() % 1000) * 1e-5f, 0);
    std::memcpy(&b[r * 210 + 208], &h, 2);
  }
  KMat R{b.data(), N, K, kQ6K};
  // the tile form: values, scales and d pulled out of the blocks as kdequant_row reads them
  std::vector<uint8_t> q((size_t)N * K), tq((size_t)N * K * 6 / 8, 0);
  std::vector<int8_t> sc((size_t)N * K / 16), tsc(sc.size());
  std::vector<uint16_t> d((size_t)N * S), td(d.size());
  for (int n = 0; n < N; n++)
    for (int s = 0; s < S; s++) {
      const uint8_t* blk = R.row(n) + (size_t)s * 210;
      for (int e = 0; e < QK; e++) {
        const int h = e / 128, t = (e % 128) / 32, i = e % 32;
        const uint8_t l = blk[64 * h + 32 * (t % 2) + i];
        q[(size_t)n * K + s * QK + e] = ((t < 2 ? l : l >> 4) & 0x0f) | (((blk[128 + 32 * h + i] >> (2 * t)) & 3) << 4);
      }
      for (int j = 0; j < 16; j++) sc[(size_t)n * (K / 16) + s * 16 + j] = (int8_t)blk[192 + j];
      std::memcpy(&d[(size_t)n * S + s], blk + 208, 2);
    }
  for (int t = 0; t < N / NT; t++)
    for (int g = 0; g < G; g++) {
      uint8_t* grp = tq.data() + (size_t)t * K * NT * 6 / 8 + (size_t)g * kK6GroupBytes;
      for (int c = 0; c < NT; c++) {
        const int n = t * NT + c;
        for (int kk = 0; kk < QG; kk++) {
          const int v = q[(size_t)n * K + g * QG + kk], j = kk / 8, half = (kk % 8) / 4, i = kk % 4;
          grp[64 * j + 4 * c + i] |= (v & 15) << (4 * half);
          const int h = kk / 16, o = (kk % 16) / 4;
          grp[256 + 64 * h + 4 * c + i] |= (v >> 4) << (2 * o);
        }
        for (int h = 0; h < 2; h++) tsc[((size_t)t * G + g) * 2 * NT + h * NT + c] = sc[(size_t)n * (K / 16) + g * 2 + h];
      }
      if (g % 8 == 0)
        for (int c = 0; c < NT; c++) td[((size_t)t * S + g / 8) * NT + c] = d[(size_t)(t * NT + c) * S + g / 8];
    }
  QMat T{tq.data(), tsc.data(), td.data(), true, false, false, N, K, 6};
  std::vector<float> x((size_t)M * K);
  std::normal_distribution<float> Nd(0, 1);
  for (auto& v : x) v = Nd(rng);
  std::vector<float> y0((size_t)M * N), y1((size_t)M * N);
  double b0 = 1e9, b1 = 1e9;
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    kqgemm(R, x.data(), M, y0.data(), N, nullptr, nullptr);
    double t1 = now();
    k6gemm(T, x.data(), M, y1.data(), N, nullptr, nullptr);
    double t2 = now();
    b0 = std::min(b0, t1 - t0), b1 = std::min(b1, t2 - t1);
  }
  double md = 0, mx = 0;
  for (size_t i = 0; i < y0.size(); i++) md = std::max(md, (double)std::fabs(y0[i] - y1[i])), mx = std::max(mx, (double)std::fabs(y0[i]));
  printf("N=%d K=%d M=%d rows(%s) %.3f ms %.0f GMAC/s  tiles %.3f ms %.0f GMAC/s  tiles/rows speed %.2fx\n", N, K, M,
         q6k_kernel_name(), b0 * 1e3, (double)M * N * K / b0 / 1e9, b1 * 1e3, (double)M * N * K / b1 / 1e9, b0 / b1);
  printf("  max|rows-tiles| %.3g of %.3g\n", md, mx);
}
