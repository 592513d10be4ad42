// The sentence encoder's attention (MiniLM: 12 heads of 32) over a packed batch of 20 search
// results' lengths, bf16gemm.h's bf16_attention, on AMX-BF16 tiles and in vdpbf16ps (amx_mode),
// alternating, best of 20 each; what a perf profile of one path needs (symbols, one process).
//
//   g++ -std=gnu++20 -O3 -g -march=native -Itarg_mlx/runtime/native/csrc \
//       scripts/kernels/bench_encoder_attention.cpp -o /tmp/bench_enc_attn -lpthread
//   TARG_MLX_THREADS=1 /tmp/bench_enc_attn [amx|vnni|both] [rounds]
#include "bf16gemm.h"
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
using namespace targ;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  const char* which = argc > 1 ? argv[1] : "both";
  const int rounds = argc > 2 ? atoi(argv[2]) : 20;
  std::vector<int32_t> len = {230, 228, 220, 210, 205, 200, 198, 190, 186, 180, 178, 170, 168, 160, 150, 140, 130, 120, 110, 90};
  const int B = (int)len.size(), NH = 12, D = 32, H = NH * D;
  int T = 0;
  for (int n : len) T += n;
  std::mt19937 rng(1);
  std::normal_distribution<float> Nd(0, 1);
  std::vector<float> qkv((size_t)T * 3 * H), out((size_t)T * H);
  for (auto& x : qkv) x = Nd(rng);
  double best[2] = {1e9, 1e9};
  for (int r = 0; r < rounds; r++)
    for (int m = 0; m < 2; m++) {
      if ((m == 0 && !strcmp(which, "vnni")) || (m == 1 && !strcmp(which, "amx"))) continue;
      amx_mode().store(m == 0 ? kAmxHw : kAmxOff);
      const double t = now();
      bf16_attention(qkv.data(), len.data(), B, 0, true, NH, D, 0.17677669f, out.data());
      best[m] = std::min(best[m], now() - t);
    }
  printf("T=%d threads=%d: amx tiles %.2f ms, vdpbf16ps %.2f ms (one layer)\n", T, pool().size(), best[0] * 1e3, best[1] * 1e3);
}
