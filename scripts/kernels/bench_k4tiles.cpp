// Q4_K tiles: the plain layout's kernel (qgemm.h, as before the k4 layout) against k4gemm
// (k4tiles.h) on the same random Q4_K data, in one process, best of alternating calls
// (docs/archive/benchmarks-journal.md, "Q4_K tiles in the k4 layout"). On an AVX512-VNNI build "old" is the VNNI
// tile kernel, and k4 runs twice: its AVX2 kernel and its VNNI kernel, which must agree to the
// bit (the last line says so). -DTARG_K4_VNNI_ROWS=8 builds the VNNI kernel with 8 rows a load.
//
//   g++ -std=gnu++20 -O3 -march=native -Itarg_mlx/runtime/native/csrc scripts/kernels/bench_k4tiles.cpp -o /tmp/bench_k4tiles -lpthread
//   /tmp/bench_k4tiles N K M [reps]        # e.g. 17920 1536 256 30; TARG_MLX_THREADS=1 for one core
#include "k4tiles.h"
#include <chrono>
#include <random>
#include <cstdio>
#include <functional>
using namespace targ;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static void pack_k4(const std::vector<uint8_t>& q, int N, int K, std::vector<uint8_t>& out) {
  const int G = K / 32; out.assign((size_t)N * K / 2, 0);
  for (int t = 0; t < N / 16; t++) for (int g = 0; g < G; g++) for (int kb = 0; kb < 4; kb++) for (int c = 0; c < 16; c++) for (int i = 0; i < 4; i++) {
    int n = t * 16 + c, k = g * 32 + 8 * kb + i;
    out[(size_t)t * K * 8 + g * 256 + 64 * kb + 4 * c + i] = q[(size_t)n * K + k] | (q[(size_t)n * K + k + 4] << 4); }
}
static void pack_old(const std::vector<uint8_t>& q, int N, int K, std::vector<uint8_t>& out) {
  const int G = K / 32; out.assign((size_t)N * K / 2, 0);
  for (int t = 0; t < N / 16; t++) for (int g = 0; g < G; g++) for (int kp = 0; kp < 16; kp++) for (int c = 0; c < 16; c++) {
    int n = t * 16 + c, k = g * 32 + 2 * kp;
    out[(size_t)t * K * 8 + g * 256 + kp * 16 + c] = q[(size_t)n * K + k] | (q[(size_t)n * K + k + 1] << 4); }
}
int main(int argc, char** argv) {
  int N = atoi(argv[1]), K = atoi(argv[2]), M = atoi(argv[3]), reps = argc > 4 ? atoi(argv[4]) : 20;
  const int G = K / 32;
  std::mt19937 rng(1);
  std::vector<uint8_t> q((size_t)N * K); for (auto& v : q) v = rng() & 15;
  std::vector<uint8_t> scm((size_t)N / 16 * G * 32); for (auto& v : scm) v = rng() & 63;
  std::vector<uint16_t> dd((size_t)N / 16 * (G / 8) * 32);
  std::uniform_real_distribution<float> U(0.001f, 0.01f); for (auto& v : dd) v = _cvtss_sh(U(rng), 0);
  std::vector<float> x((size_t)M * K); std::normal_distribution<float> Nd(0, 1); for (auto& v : x) v = Nd(rng);
  std::vector<uint8_t> qold, qnew; pack_old(q, N, K, qold); pack_k4(q, N, K, qnew);
  QMat Wo{qold.data(), scm.data(), dd.data(), true, true, false, N, K, 4};
  QMat Wn{qnew.data(), scm.data(), dd.data(), true, true, true, N, K, 4};
  std::vector<float> y0((size_t)M * N), y1((size_t)M * N);
  std::vector<std::pair<const char*, std::function<void()>>> vs = {
    {"old", [&] { qgemm(Wo, x.data(), M, y0.data(), N, nullptr, nullptr); }},
    {"k4", [&] { k4gemm<false>(Wn, x.data(), M, y1.data(), N, nullptr, nullptr); }},
  };
  std::vector<float> y2((size_t)M * N);
  if (kK4Vnni) vs.push_back({"k4-vnni", [&] { k4gemm<kK4Vnni>(Wn, x.data(), M, y2.data(), N, nullptr, nullptr); }});
  std::vector<double> best(vs.size(), 1e9);
  for (int it = 0; it < reps; it++) for (size_t v = 0; v < vs.size(); v++) { double a = now(); vs[v].second(); best[v] = std::min(best[v], now() - a); }
  double fl = 2.0 * M * N * K / 1e9;
  printf("N=%d K=%d M=%d threads=%d: ", N, K, M, pool().size());
  for (size_t v = 0; v < vs.size(); v++) printf("%s %.3f ms %.0f GF/s  ", vs[v].first, best[v] * 1e3, fl / best[v]);
  printf("k4/old speed %.2fx", best[0] / best[1]);
  if (kK4Vnni) printf("  k4-vnni/old %.2fx  k4-vnni/k4 %.2fx", best[0] / best[2], best[1] / best[2]);
  printf("\n");
  double md = 0, sc = 0; for (size_t i = 0; i < y0.size(); i++) { md = std::max(md, (double)std::fabs(y0[i] - y1[i])); sc = std::max(sc, (double)std::fabs(y0[i])); }
  printf("  max|old-k4| %.3g of %.3g\n", md, sc);
  if (kK4Vnni) printf("  k4-vnni and k4 %s\n", std::memcmp(y1.data(), y2.data(), y1.size() * 4) ? "DIFFER" : "agree to the bit");
}
