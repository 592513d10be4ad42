"""Batch-1 decode on the CPU kernels, and the CPU the thread scheduling it spends.

A decode step's graph is built and scheduled by the calling thread (Python, then MLX's eval)
while the kernels run on MLX's stream thread and the kernels' pool: on 2 cores that thread's CPU
comes out of the kernels' time. This prints the best of `--rounds` decodes of `--tokens` tokens
after a `--prompt`-token prefill, and that thread's CPU per token. Compare two trees by running it
alternately with each on PYTHONPATH (BENCHMARKS.md, row "decode step scheduling"):

    for t in /tmp/old /path/to/repo; do (cd $t && PYTHONPATH=$t python scripts/bench/bench_decode.py); done
"""

from __future__ import annotations

import argparse
import os
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=4, help="the first is a warm-up")
    args = ap.parse_args(argv)

    from targ_mlx._blas import bind_openblas

    bind_openblas()  # before mlx.core loads
    import mlx.core as mx

    from targ_mlx.runtime.backbone import load_backbone

    bb = load_backbone(args.model, huge_pages="collapse")
    prompt = list(range(1000, 1000 + args.prompt))
    decode, prefill, cpu = [], [], []
    for _ in range(args.rounds):
        cache = bb.make_cache()
        t0 = time.perf_counter()
        logits = bb.prefill(prompt, cache)
        mx.eval(logits)
        prefill.append(time.perf_counter() - t0)
        y = mx.argmax(logits, axis=-1)
        mx.async_eval(y)
        c0, t0 = time.thread_time(), time.perf_counter()
        for _ in range(args.tokens):  # pipelined as runtime.draft does: schedule the next, then read this one
            nxt = mx.argmax(bb.step(y, cache), axis=-1)
            mx.async_eval(nxt)
            y.tolist()
            y = nxt
        y.tolist()
        decode.append((time.perf_counter() - t0) / args.tokens)
        cpu.append((time.thread_time() - c0) / args.tokens)
    d, p, c = min(decode[1:] or decode), min(prefill[1:] or prefill), min(cpu[1:] or cpu)
    print(f"{os.getcwd()} {args.model}: decode {1 / d:.1f} tok/s, prefill {args.prompt / p:.0f} tok/s, "
          f"scheduling thread {1e3 * c:.2f} ms CPU a token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
