"""The forms the kernels can keep a K-quant matrix in, side by side: its blocks as stored
(csrc/kquant.h), 16-column tiles with the block's own scales (Q4_K: gguf_blocks.q4k_tiles), and affine
16-column tiles with a float16 scale and bias per 32 (the repacking used before).

For real tensors of a Q4_K_M GGUF, side by side in one process: the time of y = x W^T at M = 1
(a decode step) and M = 256 (a prefill), best of 5 rounds that alternate the forms, the bytes
each form keeps, and each form's error against gguf-py's float dequantization.

    python scripts/kernels/bench_kquant.py --model qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
import time

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads
import mlx.core as mx
import numpy as np

TENSORS = ["blk.0.attn_q.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_down.weight", "blk.1.ffn_down.weight",
           "blk.0.attn_v.weight"]


def best_time(f, reps: int, rounds: int) -> float:
    mx.eval(f())
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            mx.eval(f())
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="alias or .gguf path")
    p.add_argument("--tensors", default=",".join(TENSORS))
    p.add_argument("--rows", default="1,256", help="M values")
    args = p.parse_args(argv)

    from gguf import GGUFReader
    from gguf.quants import dequantize

    from targ_mlx.runtime import gguf_blocks
    from targ_mlx.runtime.backbone import alias_path
    from targ_mlx.runtime.model_spec import ALIASES
    from targ_mlx.runtime.native import module, pack, status

    ops = module()
    print(f"kernels: {status()}")
    path = alias_path(args.model) if args.model in ALIASES else args.model
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    rng = np.random.default_rng(0)
    print("| tensor | type | (N, K) | form | MiB | rel. error vs gguf-py | M | time | vs affine tiles |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.tensors.split(","):
        t = tensors[name]
        shape = tuple(reversed(t.shape.tolist()))
        raw = np.asarray(t.data)
        kb = pack.KBlocks(mx.array(raw), int(t.tensor_type))
        a = gguf_blocks.affine(raw, t.tensor_type, shape)
        forms = {"stored": kb}
        if int(t.tensor_type) == pack.Q4_K:
            forms["q4k tiles"] = gguf_blocks.q4k_tiles(raw)
        forms["affine tiles"] = pack.from_values(a.vals, a.scales.astype(np.float16), a.biases.astype(np.float16), a.bits)
        ref = dequantize(raw, t.tensor_type).reshape(shape).astype(np.float32)
        x = rng.standard_normal((64, shape[1])).astype(np.float32)
        yref = x @ ref.T
        err = {k: float(np.linalg.norm(np.array(w.linear(ops, mx.array(x))) - yref) / np.linalg.norm(yref))
               for k, w in forms.items()}
        for m in (int(v) for v in args.rows.split(",")):
            xm = mx.array(rng.standard_normal((m, shape[1])).astype(np.float32))
            ts = {}
            for _ in range(5):  # alternate the forms, keep each one's best
                for label, w in forms.items():
                    dt = best_time(lambda: w.linear(ops, xm), 40 if m == 1 else 2, 1)
                    ts[label] = min(ts.get(label, dt), dt)
            for label, w in forms.items():
                s = ts[label]
                print(f"| {name} | {t.tensor_type.name} | {shape} | {label} | {w.nbytes / 2**20:.2f} | {err[label]:.2e} "
                      f"| {m} | {s * 1e3:.3f} ms ({2 * m * shape[0] * shape[1] / s / 1e9:.0f} GFLOP/s) "
                      f"| {ts['affine tiles'] / s:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
