// A prefill's causal attention (layers.h `attention`, L queries over their L keys), SmolLM2's shape
// by default (9 query heads over 3 kv heads, D = 64; `12 2 128` is the 1.5B's), best of R rounds,
// G multiply-adds/s; the output's bits go to OUT so two builds can be compared with cmp.
//
//   g++ -std=gnu++20 -O3 -g -march=native -Itarg_mlx/runtime/native/csrc \
//       scripts/kernels/bench_prefill_attention.cpp -o /tmp/bench_prefill_attention -lpthread
//   /tmp/bench_prefill_attention [L=1024] [R=10] [Hq=9] [Hkv=3] [D=64] [OUT]
#include "layers.h"
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
using namespace targ;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  const int L = argc > 1 ? atoi(argv[1]) : 1024, rounds = argc > 2 ? atoi(argv[2]) : 10;
  const int Hq = argc > 3 ? atoi(argv[3]) : 9, Hkv = argc > 4 ? atoi(argv[4]) : 3, D = argc > 5 ? atoi(argv[5]) : 64;
  std::mt19937 rng(1);
  std::normal_distribution<float> Nd(0, 1);
  std::vector<float> q((size_t)Hq * L * D), k((size_t)Hkv * L * D), v(k.size()), out((size_t)L * Hq * D);
  for (auto& x : q) x = Nd(rng);
  for (auto& x : k) x = Nd(rng);
  for (auto& x : v) x = Nd(rng);
  KV K{k.data(), (long)Hkv * L * D, (long)L * D, D}, V{v.data(), (long)Hkv * L * D, (long)L * D, D};
  double best = 1e9;
  for (int r = 0; r < rounds; r++) {
    const double t = now();
    attention(q.data(), K, V, nullptr, 0, 1, Hq, Hkv, L, L, D, 0.125f, out.data());
    best = std::min(best, now() - t);
  }
  double macs = (double)Hq * L * (L + 1) / 2 * D * 2;
  printf("L=%d Hq=%d D=%d threads=%d: %.2f ms, %.1f G MAC/s\n", L, Hq, D, pool().size(), best * 1e3, macs / best / 1e9);
  if (argc > 6) { FILE* f = fopen(argv[6], "wb"); fwrite(out.data(), 4, out.size(), f); fclose(f); }
}
