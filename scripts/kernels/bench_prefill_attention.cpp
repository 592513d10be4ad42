// A prefill's causal attention (layers.h `attention`, L queries over their L keys), SmolLM2's shape
// by default (9 query heads over 3 kv heads, D = 64; `12 2 128` is the 1.5B's), best of R rounds,
// G multiply-adds/s; the output's bits go to OUT so two builds can be compared with cmp. Where
// AMX-BF16 tiles are granted, a prompt's attention on them (attn_tiles.h) is timed alternating
// with it, with how far its output is from the float32 one.
//
//   g++ -std=gnu++20 -O3 -g -march=native -Itarg_mlx/runtime/native/csrc \
//       scripts/kernels/bench_prefill_attention.cpp -o /tmp/bench_prefill_attention -lpthread
//   /tmp/bench_prefill_attention [L=1024] [R=10] [Hq=9] [Hkv=3] [D=64] [OUT]
#include "attn_tiles.h"
#include <chrono>
#include <cmath>
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
  std::vector<float> q((size_t)Hq * L * D), k((size_t)Hkv * L * D), v(k.size()), out((size_t)L * Hq * D), tiled(out.size());
  for (auto& x : q) x = Nd(rng);
  for (auto& x : k) x = Nd(rng);
  for (auto& x : v) x = Nd(rng);
  KV K{k.data(), (long)Hkv * L * D, (long)L * D, D}, V{v.data(), (long)Hkv * L * D, (long)L * D, D};
  const float scale = 1.f / std::sqrt((float)D);
  const bool tiles = amx_grant().ok && attention_tiles_take(D);
  double best = 1e9, best_tiles = 1e9;
  for (int r = 0; r < rounds; r++) {
    double t = now();
    attention(q.data(), K, V, nullptr, 0, 1, Hq, Hkv, L, L, D, scale, out.data());
    best = std::min(best, now() - t);
    if (!tiles) continue;
    t = now();
    attention_tiles(q.data(), K, V, nullptr, 0, 1, Hq, Hkv, L, L, D, scale, tiled.data());
    best_tiles = std::min(best_tiles, now() - t);
  }
  const double macs = (double)Hq * L * (L + 1) / 2 * D * 2;
  printf("L=%d Hq=%d Hkv=%d D=%d threads=%d: float32 %.2f ms, %.1f G MAC/s", L, Hq, Hkv, D, pool().size(), best * 1e3,
         macs / best / 1e9);
  if (tiles) {
    double maxd = 0, sumd = 0;
    for (size_t i = 0; i < out.size(); i++) {
      const double d = std::fabs((double)out[i] - tiled[i]);
      maxd = std::max(maxd, d), sumd += d;
    }
    printf("; AMX-BF16 tiles %.2f ms, %.1f G MAC/s, %.2fx; |tiles - float32| max %.2e, mean %.2e", best_tiles * 1e3,
           macs / best_tiles / 1e9, best / best_tiles, maxd, sumd / out.size());
  }
  printf("\n");
  if (argc > 6) { FILE* f = fopen(argv[6], "wb"); fwrite(out.data(), 4, out.size(), f); fclose(f); }
}
