"""Peak int8 multiply-add rate of one core, the ceiling any int8 prefill kernel works under.

Compiles a loop of 12 independent accumulator chains (8 for AVX2, whose 16 registers hold no more without spilling; no loads)
for the instructions the kernels use: `vpdpbusd` on 512-bit registers (AVX512-VNNI) and
`vpmaddubsw` + `vpaddw` on 256-bit registers (AVX2, each product pair summed into 16 bits, as
`targ_mlx/runtime/native/csrc/qgemm.h` and llama.cpp's AVX2 kernels do), and where the CPU has
AMX-INT8 and the kernel grants its tile data, `tdpbssd` on four C tiles: operands held in the
tiles (the instruction's ceiling) and with a B tile loaded from L1 before every product (the
ceiling of a kernel's inner loop), on random bytes and on small repeating ones. Prefill of a model costs about
its weight count in multiply-adds per token, so tokens/s x MACs/token over cores x this rate is
the share of the peak a prefill reaches (BENCHMARKS.md, row
"int8 peak").

    python scripts/kernels/bench_int8_peak.py            # -march=native, and x86-64-v3 (an AVX2 build)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile

SOURCE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define N 240000000L
#ifdef __AVX512VNNI__
__attribute__((noinline)) static double vnni512(void) {
  __m512i a[12], w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
  for (int i = 0; i < 12; i++) a[i] = _mm512_set1_epi32(i);
  double t = now();
  for (long n = 0; n < N / 12; n++) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
    __asm__ volatile("" : "+v"(w));
  }
  t = now() - t;
  int s = 0;
  for (int i = 0; i < 12; i++) s += _mm512_reduce_add_epi32(a[i]);
  if (s == 1) printf(" ");
  return (double)(N / 12 * 12) * 64 / t;
}
#endif
#if defined(__AMX_INT8__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
// AMX: C tiles 0-3 (16 x 16 int32), A tiles 4 and 6 (16 rows x 64 bytes), B tiles 5 and 7 (16 rows
// x 64 bytes): each TDPBSSD is 16 x 16 x 64 = 16,384 multiply-adds, four independent chains.
// `loads` 0: operands stay in the tiles (the instruction's own ceiling); 1: a B tile loaded from
// L1 before every product, as a kernel's inner loop must. Random bytes (what weights and
// activations look like) and small repeating ones: both ran at ~2.3 T a core on the Xeon AMX VM,
// and in some minutes there every rate here halved at once (the VM's neighbours), hence the best
// of 3 rounds.
static unsigned char cfg[64] __attribute__((aligned(64)));
static signed char buf[2][1024] __attribute__((aligned(64)));
__attribute__((noinline)) static double amx(int loads, int random) {
  for (int i = 0; i < 64; i++) cfg[i] = 0;
  cfg[0] = 1;
  for (int t = 0; t < 8; t++) { cfg[16 + 2 * t] = 64; cfg[48 + t] = 16; }
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
  for (int i = 0; i < 1024; i++)
    buf[0][i] = (signed char)(random ? i * 37 % 251 : i % 7), buf[1][i] = (signed char)(random ? i * 101 % 241 : i % 5);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  _tile_loadd(4, buf[0], 64); _tile_loadd(6, buf[1], 64); _tile_loadd(5, buf[1], 64); _tile_loadd(7, buf[0], 64);
  const long n = N / 16384 * 64;
  double t = now();
  for (long i = 0; i < n; i++) {
    if (loads) _tile_loadd(5, buf[i & 1], 64);
    _tile_dpbssd(0, 4, 5); _tile_dpbssd(2, 6, 5);
    if (loads) _tile_loadd(7, buf[(i + 1) & 1], 64);
    _tile_dpbssd(1, 4, 7); _tile_dpbssd(3, 6, 7);
  }
  t = now() - t;
  int out[256] __attribute__((aligned(64)));
  _tile_stored(0, out, 64);
  _tile_release();
  if (out[0] == 1) printf(" ");
  return (double)n * 4 * 16384 / t;
}
#endif
__attribute__((noinline)) static double avx2(void) {
  __m256i a[8], w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5);
  for (int i = 0; i < 8; i++) a[i] = _mm256_set1_epi16(i);
  double t = now();
  for (long n = 0; n < N / 8; n++) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
      __asm__ volatile("" : "+v"(x));  // x "changes": the product is recomputed, not hoisted
      a[i] = _mm256_add_epi16(a[i], _mm256_maddubs_epi16(w, x));
    }
  }
  t = now() - t;
  int s = 0;
  for (int i = 0; i < 8; i++) s += _mm256_extract_epi16(a[i], 0);
  if (s == 1) printf(" ");
  return (double)(N / 8 * 8) * 32 / t;
}
int main(void) {
#if defined(__AMX_INT8__) && defined(__linux__)
  const int tiles = syscall(SYS_arch_prctl, 0x1023, 18) == 0;  // ARCH_REQ_XCOMP_PERM, XTILEDATA
#endif
  for (int r = 0; r < 3; r++) {
#if defined(__AMX_INT8__) && defined(__linux__)
    if (tiles) {
      printf("tdpbssd, small bytes: %.1f G int8 MAC/s\n", amx(0, 0) / 1e9);
      printf("tdpbssd, random bytes: %.1f G int8 MAC/s\n", amx(0, 1) / 1e9);
      printf("tdpbssd, random, a B load each: %.1f G int8 MAC/s\n", amx(1, 1) / 1e9);
    }
#endif
#ifdef __AVX512VNNI__
    printf("vpdpbusd zmm: %.1f G int8 MAC/s\n", vnni512() / 1e9);
#endif
    printf("vpmaddubsw+vpaddw ymm: %.1f G int8 MAC/s\n", avx2() / 1e9);
  }
  return 0;
}
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--march", nargs="+", default=["native", "x86-64-v3"])
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "peak.c")
        with open(src, "w") as f:
            f.write(SOURCE)
        for march in args.march:
            exe = os.path.join(tmp, f"peak_{march}")
            subprocess.run(["gcc", "-O2", f"-march={march}", src, "-o", exe], check=True)
            out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.splitlines()
            best: dict[str, float] = {}
            for line in out:  # the best of 3: other jobs only ever slow a run down
                name, rate = line.split(": ")
                best[name] = max(best.get(name, 0.0), float(rate.split()[0]))
            for name, rate in best.items():
                print(f"-march={march:10} {name:32} {rate:7.1f} G int8 MAC/s per core")


if __name__ == "__main__":
    main()
