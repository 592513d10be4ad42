// Decode-step attention (one query per row) of the 1.5B's shape: 12 query heads over 2 kv heads,
// D = 128, over S cached positions, 28 layers' caches (so they do not all sit in L3), best of 10.
// Build it twice to time the grouped decode path (the group's query heads as one task, the
// default) against a task per query head; the outputs must be the same bits (cmp the files).
//
//   for g in 0 1; do g++ -std=gnu++20 -O3 -march=native -DTARG_ATTN_GROUPS=$g -Itarg_mlx/runtime/native/csrc \
//       scripts/kernels/bench_attention.cpp -o /tmp/bench_attention_$g -lpthread; done
//   /tmp/bench_attention_1 S [B] [out.bin]        # e.g. 700 1 /tmp/a1.bin; TARG_MLX_THREADS=2
#include "layers.h"
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
using namespace targ;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  const int S = atoi(argv[1]), B = argc > 2 ? atoi(argv[2]) : 1, Salloc = (S + 255) / 256 * 256;
  const int Hq = 12, Hkv = 2, D = 128, layers = 28;
  std::mt19937 rng(1);
  std::normal_distribution<float> Nd(0, 1);
  std::vector<std::vector<float>> Ks(layers), Vs(layers);
  for (int l = 0; l < layers; l++) {  // a cache as mlx-lm's KVCache holds it: S of Salloc positions used
    Ks[l].resize((size_t)B * Hkv * Salloc * D), Vs[l].resize(Ks[l].size());
    for (auto& x : Ks[l]) x = Nd(rng);
    for (auto& x : Vs[l]) x = Nd(rng);
  }
  std::vector<float> q((size_t)B * Hq * D), out(q.size());
  for (auto& x : q) x = Nd(rng);
  double best = 1e9;
  for (int r = 0; r < 10; r++) {
    const double t = now();
    for (int l = 0; l < layers; l++) {
      KV K{Ks[l].data(), (long)Hkv * Salloc * D, (long)Salloc * D, D}, V{Vs[l].data(), (long)Hkv * Salloc * D, (long)Salloc * D, D};
      attention(q.data(), K, V, nullptr, 0, B, Hq, Hkv, 1, S, D, 0.088f, out.data());
    }
    best = std::min(best, now() - t);
  }
  printf("groups=%d S=%d B=%d threads=%d: %.1f us per layer\n", TARG_ATTN_GROUPS, S, B, pool().size(), best / layers * 1e6);
  if (argc > 3) {
    FILE* f = fopen(argv[3], "wb");
    fwrite(out.data(), 4, out.size(), f);
    fclose(f);
  }
}
