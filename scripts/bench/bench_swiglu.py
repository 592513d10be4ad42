"""SwiGLU inside the gate|up product (AMX tiles) against the product and then the SwiGLU op.

For every layer's gate|up matrix, one random input of --rows rows, each round both ways in
alternating order, in one process (the machine's speed changes from minute to minute, so only
the per-round ratio is read). Where the kernels do not take the product on tiles both ways are
the same ops, and the ratio shows noise.

    python scripts/bench/bench_swiglu.py --model qwen2.5-coder-1.5b --rows 1024 256 --rounds 6
"""

from __future__ import annotations

import argparse
import statistics
import time

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rows", type=int, nargs="+", default=[1024, 256])
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args(argv)

    from targ_mlx.runtime.backbone import load_backbone

    lm = load_backbone(args.model, kernels=True).engine.lm
    N = lm.ops
    mats = [layer.gate_up[0] for layer in lm.layers if len(layer.gate_up) == 1 and layer.gate_up_bias is None]
    ways = {"fused": lambda p, x: p.linear(N, x, swiglu=True), "two ops": lambda p, x: N.swiglu(p.linear(N, x))}
    for rows in args.rows:
        x = mx.array(np.random.default_rng(0).standard_normal((1, rows, mats[0].shape[1])).astype(np.float32))
        mx.eval(x)
        ratios = []
        for r in range(args.rounds):
            t = {}
            for way in (("fused", "two ops") if r % 2 == 0 else ("two ops", "fused")):
                t0 = time.perf_counter()
                for p in mats:
                    mx.eval(ways[way](p, x))
                t[way] = time.perf_counter() - t0
            ratios.append(t["two ops"] / t["fused"])
            print(f"{rows} rows, round {r}: fused {t['fused']:.3f} s, two ops {t['two ops']:.3f} s ({len(mats)} matrices)")
        print(f"{rows} rows: two ops / fused per round {[round(v, 3) for v in ratios]}, median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
