// Q6_K rows (csrc/kquant.h) on random blocks: kqgemm's time and GMAC/s, and its error against the
// dequantized rows in double precision. The kernel is the one the process runs: on an
// AVX512-VNNI build the 512-bit one, or the AVX2 one with TARG_MLX_Q6K_KERNEL=avx2, so run it
// twice to compare (docs/archive/benchmarks-journal.md, "Where the 1.5B's prefill goes").
//
//   g++ -std=gnu++20 -O3 -march=native -Itarg_mlx/runtime/native/csrc scripts/kernels/bench_q6k.cpp -o /tmp/bench_q6k -lpthread
//   /tmp/bench_q6k N K M [reps]                                  # e.g. 1536 8960 256 5 (ffn_down)
//   TARG_MLX_Q6K_KERNEL=avx2 /tmp/bench_q6k 1536 8960 256 5
#include "kquant.h"
#include <chrono>
#include <random>
#include <cstdio>
using namespace targ;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  int N = atoi(argv[1]), K = atoi(argv[2]), M = atoi(argv[3]), reps = argc > 4 ? atoi(argv[4]) : 10;
  std::mt19937 rng(1);
  const int S = K / 256;
  std::vector<uint8_t> b((size_t)N * S * 210);
  for (size_t i = 0; i < b.size(); i++) b[i] = rng() & 255;
  for (size_t r = 0; r < (size_t)N * S; r++) { uint16_t h = _cvtss_sh(0.001f + (rng() % 1000) * 1e-5f, 0); memcpy(&b[r * 210 + 208], &h, 2); }
  KMat W{b.data(), N, K, kQ6K};
  std::vector<float> x((size_t)M * K); std::normal_distribution<float> Nd(0, 1); for (auto& v : x) v = Nd(rng);
  std::vector<float> yv((size_t)M * N), yr((size_t)M * N);
  // reference: dequantized rows (float) times x
  std::vector<float> wr(K);
  for (int n = 0; n < N; n++) { kdequant_row(W, n, wr.data()); for (int m = 0; m < M; m++) { double s = 0; for (int k = 0; k < K; k++) s += (double)wr[k] * x[(size_t)m * K + k]; yr[(size_t)m * N + n] = s; } }
  auto gemm = [&](std::vector<float>& y) { kqgemm(W, x.data(), M, y.data(), N, nullptr, nullptr); };
  double best = 1e9;
  for (int r = 0; r < reps; r++) { double t = now(); gemm(yv); best = std::min(best, now() - t); }
  double maxr = 0, nr = 0;
  for (size_t i = 0; i < yv.size(); i++) { maxr = std::max(maxr, (double)std::fabs(yv[i] - yr[i])); nr = std::max(nr, (double)std::fabs(yr[i])); }
  printf("%s rows=%d N=%d K=%d M=%d  %.3f ms (%.0f GMAC/s) |y-ref| %.2e (ref max %.2e) y[0]=%.6f\n", q6k_vnni() ? "vnni" : "avx2", kKRows, N, K, M, best * 1e3, (double)M * N * K / best / 1e9, maxr, nr, yv[0]);
}
