"""Would bfloat16 weights beat the K-quant tiles at prefill? One core, the 1.5B's two big shapes
at 1,024 rows: oneDNN's bfloat16 matmul (torch, AMX-BF16 tiles where granted) against our Q4_K /
Q6_K AMX tiles (scripts/kernels/bench_amx.cpp), alternating, best of each round.

Why: a dequantized bfloat16 copy of the weights would fold the sub-block scales into the weights,
so a tile product would sum all of K at once (the int8 tiles sum 32 of their 64 k per product on
Q4_K). It costs 2 bytes a weight of memory; it pays only if bfloat16 tiles run faster in practice.

    python scripts/kernels/bench_bf16_weights.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [("q4k", 8960, 1536), ("q6k", 1536, 8960)]  # (kind, N outputs, K inputs): gate/up and down


def torch_bf16(n: int, k: int, m: int) -> float:
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(m, k).bfloat16(), torch.randn(k, n).bfloat16()
    a @ b
    best = 1e9
    for _ in range(3):
        t = time.thread_time()
        a @ b
        best = min(best, time.thread_time() - t)
    return m * n * k / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=1024)
    args = ap.parse_args()
    exe = "/tmp/bench_amx"
    subprocess.run(["g++", "-std=gnu++20", "-O3", "-march=native", f"-I{ROOT}/targ_mlx/runtime/native/csrc",
                    str(ROOT / "scripts/kernels/bench_amx.cpp"), "-o", exe, "-lpthread"], check=True)
    env = dict(os.environ, TARG_MLX_THREADS="1")
    for r in range(args.rounds):
        for kind, n, k in SHAPES:
            out = subprocess.run([exe, kind, str(n), str(k), str(args.rows), "3", "amx"], env=env, check=True,
                                 capture_output=True, text=True).stdout.strip()
            print(f"round {r} {kind} N={n} K={k}: torch bfloat16 {torch_bf16(n, k, args.rows):.0f} GMAC/s | {out}")


if __name__ == "__main__":
    main()
