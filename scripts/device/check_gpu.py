"""The GPU path (mlx[cuda], or Metal) against MLX's CPU ops in one process: a model's k-token
drafts and gate signals on both, then the GPU's speed (BENCHMARKS.md, rows "GPU: ...").

    python scripts/device/check_gpu.py MODEL.gguf [MORE.gguf ...]   # the first is also run on the CPU

The first file is drafted on the GPU and on the CPU (MLX's own ops, float32: the CPU kernels are
turned off so the two differ only in device); the others on the GPU only. Prints the load time,
the first draft (which includes compiling the GPU's kernels) and a second one, the three paper
gates' scores, prefill/decode tokens/s, and the GPU-CPU differences in logits, entropies and gaps.
A stand-in file from scripts/device/synth_gguf.py does for speed and agreement (its answers are noise).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TARG_MLX_NATIVE", "0")  # MLX's own CPU ops: the reference here

from targ_mlx import bind_openblas

bind_openblas()
import mlx.core as mx
import numpy as np

from targ_mlx import gates
from targ_mlx.runtime.backbone import load_backbone
from targ_mlx.runtime.draft import draft

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from bench_backbone import TEXT, mlx_round  # noqa: E402

QUESTION = "Question: who wrote the origin of species?\nAnswer:"


def speed(bb, n_prompt: int = 256, n_decode: int = 64) -> tuple[float, float]:
    """(prefill, decode) tokens/s, the last of 3 runs (bench_backbone's timed round)."""
    prompt = bb.tokenizer.encode(TEXT)[:n_prompt]
    for _ in range(3):
        prefill_s, decode_s = mlx_round(bb, prompt, n_decode)
    return n_prompt / prefill_s, n_decode / decode_s


def run_on(device, path: str, timed: bool) -> dict:
    mx.set_default_device(device)
    t0 = time.perf_counter()
    bb = load_backbone(path, kernels=False)
    load_s = time.perf_counter() - t0
    ids = bb.tokenizer.encode(QUESTION)
    d = draft(bb, ids, k=20)
    t1 = time.perf_counter()
    draft(bb, ids, k=20)
    again = time.perf_counter() - t1
    v = draft(bb, ids, k=20, n_samples=5, temperature=0.7, seed=0)
    logits = np.array(bb.prefill(ids, bb.make_cache()).astype(mx.float32).tolist()).reshape(-1)
    print(f"{os.path.basename(path)} on {device}: weights {bb.dtype}, load {load_s:.1f} s, first draft "
          f"{d.prefill_s + d.decode_s:.3f} s, again {again:.3f} s; U entropy {gates.entropy_score(d.entropies):.4f}, "
          f"margin {gates.margin_score(d.gaps):.4f}, variance {gates.variance_score(v.samples, 20):.4f}", flush=True)
    if timed:
        pf, dc = speed(bb)
        print(f"  speed: prefill {pf:,.0f} tok/s (256 tokens), decode {dc:.1f} tok/s (batch 1)", flush=True)
    return {"draft": d, "logits": logits}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help=".gguf files; the first is also run on the CPU")
    args = ap.parse_args(argv)
    if mx.default_device() == mx.cpu:
        sys.exit("check_gpu: MLX has no GPU here (install mlx[cuda] on NVIDIA; Metal on a Mac)")
    print(f"mlx {mx.__version__}, default device {mx.default_device()}", flush=True)
    for i, path in enumerate(args.models):
        gpu = run_on(mx.gpu, path, timed=True)
        if i:
            continue
        cpu = run_on(mx.cpu, path, timed=False)
        g, c = gpu["draft"], cpu["draft"]
        same = sum(a == b for a, b in zip(g.tokens, c.tokens)) / max(1, len(c.tokens))
        print(f"  GPU vs CPU: logits max |diff| {np.abs(gpu['logits'] - cpu['logits']).max():.3g} "
              f"(range {np.ptp(cpu['logits']):.3g}); greedy draft tokens equal {same:.2f}; max |diff| of the "
              f"entropies {np.abs(np.subtract(g.entropies, c.entropies)).max():.3g}, of the gaps "
              f"{np.abs(np.subtract(g.gaps, c.gaps)).max():.3g}", flush=True)
        mx.set_default_device(mx.gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
