// AMX tiles (amx.h) against the VNNI kernels on the same random Q4_K / Q6_K tiles, in one
// process, best of alternating calls, each set beside one core's tile peak measured just before
// it (with more threads the share is of one core's peak); checks that both give the same bits.
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

// One core's tile peak right now: TDPBSSD on tiles held in registers, random bytes (the VM's
// rates halve for minutes at a time, so each rep's kernel time is set beside the peak measured
// next to it, and the share of the peak is what compares across runs).
static double tile_peak() {
  if (!amx_grant().ok) return 1e-9;  // (asks the kernel for the tile data first)
  alignas(64) static int8_t buf[2][1024];
  for (int i = 0; i < 1024; i++) buf[0][i] = (int8_t)(i * 37 % 251), buf[1][i] = (int8_t)(i * 101 % 241);
  HwTiles::begin(tile_config(64));
  HwTiles::load<4>(buf[0], 64);
  HwTiles::load<5>(buf[1], 64);
  const int n = 20000;
  const double a = now();
  for (int i = 0; i < n; i++) {
    HwTiles::dp<0, 4, 5, true>();
    HwTiles::dp<1, 4, 5, true>();
    HwTiles::dp<2, 4, 5, true>();
    HwTiles::dp<3, 4, 5, true>();
  }
  const double dt = now() - a;
  HwTiles::end();
  return 4.0 * n * 16384 / dt / 1e9;  // G int8 multiply-adds a second
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
  std::vector<double> best(vs.size(), 1e9), share(vs.size(), 0);
  double peak = 0;
  for (int it = 0; it < reps; it++)
    for (size_t v = 0; v < vs.size(); v++) {
      const double p = tile_peak();
      double a = now();
      vs[v].second();
      const double dt = now() - a;
      best[v] = std::min(best[v], dt);
      peak = std::max(peak, p);
      share[v] = std::max(share[v], (double)M * N * K / dt / 1e9 / p);  // of the peak beside it
    }
  const double gmac = (double)M * N * K / 1e9;
  std::printf("%s N=%d K=%d M=%d threads=%d (%s): ", argv[1], N, K, M, pool().size(), cpu_clock() ? "thread CPU time" : "wall");
  std::printf("tile peak %.0f G; ", peak);
  for (size_t v = 0; v < vs.size(); v++)
    std::printf("%s %.3f ms %.0f GMAC/s (%.0f%% of the peak beside it)  ", vs[v].first, best[v] * 1e3, gmac / best[v], 100 * share[v]);
  if (vs.size() < 2) return std::printf("\n"), 0;
  std::printf("amx/vnni speed %.2fx, %s\n", best[0] / best[1],
              std::memcmp(y0.data(), y1.data(), y0.size() * 4) ? "results DIFFER" : "same bits");
}
