// AMX tiles (amx.h) against the VNNI kernels on the same random Q4_K / Q6_K tiles, in one
// process, best of alternating calls; checks that both give the same bits.
//
//   g++ -std=gnu++20 -O3 -march=native -Itarg_mlx/runtime/native/csrc scripts/kernels/bench_amx.cpp -o /tmp/bench_amx -lpthread
//   /tmp/bench_amx q4k|q6k|q4 N K M [reps [amx|vnni]]      # e.g. q4k 17920 1536 256 20; TARG_MLX_THREADS=1 for one core
#include "amx.h"

#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
using namespace targ;
#include <ctime>
// With one thread (TARG_MLX_THREADS=1) the kernels run on the calling thread, and its CPU time
// leaves out the time other processes held the core: a shared machine's noise mostly drops out.
static bool cpu_clock() { const char* e = std::getenv("TARG_MLX_THREADS"); return e && std::atoi(e) == 1; }
static double now() {
  if (cpu_clock()) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  if (argc < 5) return std::fprintf(stderr, "usage: bench_amx q4k|q6k|q4|q4 N K M [reps]\n"), 2;
  const bool k6 = std::string(argv[1]) == "q6k", aff = std::string(argv[1]) == "q4";
  const int N = atoi(argv[2]), K = atoi(argv[3]), M = atoi(argv[4]), reps = argc > 5 ? atoi(argv[5]) : 20;
  const int G = K / 32, S = K / 256;
  std::mt19937 rng(1);
  // random bytes are valid tiles of either layout; scales in range, d / dmin small
  std::vector<uint8_t> q((size_t)N * K * (k6 ? 6 : 4) / 8);
  for (auto& v : q) v = rng() & 255;
  std::vector<uint8_t> sc((size_t)N * G * 2);
  for (auto& v : sc) v = k6 ? (uint8_t)(int8_t)((int)(rng() % 255) - 127) : rng() & 63;
  std::vector<uint16_t> dd((size_t)N * S * 2);
  std::uniform_real_distribution<float> U(0.001f, 0.01f);
  for (auto& v : dd) v = _cvtss_sh(U(rng), 0);
  std::vector<float> x((size_t)M * K);
  std::normal_distribution<float> Nd(0, 1);
  for (auto& v : x) v = Nd(rng);
  QMat W{q.data(), sc.data(), dd.data(), true, !k6, !k6, N, K, k6 ? 6 : 4};
  std::vector<uint16_t> hs((size_t)N * G), hb((size_t)N * G);  // affine: float16 scale and bias per group
  for (auto& v : hs) v = _cvtss_sh(U(rng), 0);
  for (auto& v : hb) v = _cvtss_sh(-8 * U(rng), 0);
  if (aff) W = QMat{q.data(), hs.data(), hb.data(), true, false, false, N, K, 4};
  std::vector<float> y0((size_t)M * N), y1((size_t)M * N);
  auto vnni = [&] {
    if (aff) qgemm(W, x.data(), M, y0.data(), N, nullptr, nullptr);
    else if (k6) k6gemm(W, x.data(), M, y0.data(), N, nullptr, nullptr);
    else k4gemm(W, x.data(), M, y0.data(), N, nullptr, nullptr);
  };
  auto amx = [&] { amx_mode() = kAmxHw; amx_gemm(W, x.data(), M, y1.data(), N, nullptr, nullptr); };
  std::vector<std::pair<const char*, std::function<void()>>> vs = {{"vnni", vnni}, {"amx", amx}};
  if (argc > 6) vs.erase(vs.begin() + (std::string(argv[6]) == "amx" ? 0 : 1));  // one engine (for perf)
  std::vector<double> best(vs.size(), 1e9);
  for (int it = 0; it < reps; it++)
    for (size_t v = 0; v < vs.size(); v++) {
      double a = now();
      vs[v].second();
      best[v] = std::min(best[v], now() - a);
    }
  const double gmac = (double)M * N * K / 1e9;
  std::printf("%s N=%d K=%d M=%d threads=%d (%s): ", argv[1], N, K, M, pool().size(), cpu_clock() ? "thread CPU time" : "wall");
  for (size_t v = 0; v < vs.size(); v++) std::printf("%s %.3f ms %.0f GMAC/s  ", vs[v].first, best[v] * 1e3, gmac / best[v]);
  if (vs.size() < 2) return std::printf("\n"), 0;
  std::printf("amx/vnni speed %.2fx, %s\n", best[0] / best[1],
              std::memcmp(y0.data(), y1.data(), y0.size() * 4) ? "results DIFFER" : "same bits");
}
