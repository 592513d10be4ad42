"""How finely the CPU kernels split a step among their threads, on an idle machine and beside a
busy one (a user's other programs).

Each kernel splits its output rows or columns into `TARG_MLX_TASKS_PER_THREAD` tasks a thread,
which the threads take from a shared counter, so a thread the OS stops mid-kernel leaves the rest
of its share to the others. The value is read once per process, so each setting runs in a fresh
process, settings alternating round by round; with `--busy` a Python busy loop at normal priority
runs beside them (3 runnable threads on 2 cores). Per process: one warm-up, then `--reps` times a
256-token prefill and 32 greedy decode steps.

    python scripts/kernels/bench_tasks.py --model qwen2.5-coder-1.5b --tasks 1 16 --rounds 3 [--busy]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import datetime, timezone

CHILD = """
import json, sys, time
from targ_mlx import bind_openblas
bind_openblas()
import mlx.core as mx
from targ_mlx.runtime.backbone import load_backbone
bb = load_backbone(sys.argv[1])
toks = [(i * 7919) % 20000 + 100 for i in range(256)]
def run():
    c = bb.make_cache()
    t = time.perf_counter(); lg = bb.prefill(toks, c); mx.eval(lg); tp = time.perf_counter() - t
    y = mx.argmax(lg, axis=-1)
    t = time.perf_counter()
    for _ in range(32):
        y = mx.argmax(bb.step(y, c), axis=-1); mx.eval(y)
    return 256 / tp, 32 / (time.perf_counter() - t)
run()
print(json.dumps([run() for _ in range(int(sys.argv[2]))]))
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--tasks", type=int, nargs="+", default=[1, 16], help="TARG_MLX_TASKS_PER_THREAD values")
    ap.add_argument("--rounds", type=int, default=3, help="processes per value, values alternating")
    ap.add_argument("--reps", type=int, default=3, help="prefill + decode runs per process")
    ap.add_argument("--busy", action="store_true", help="a busy Python thread at normal priority beside them")
    ap.add_argument("--output", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    got: dict[int, list] = {n: [] for n in args.tasks}
    try:
        for r in range(args.rounds):
            for n in args.tasks:
                env = {**os.environ, "TARG_MLX_TASKS_PER_THREAD": str(n)}
                out = subprocess.run([sys.executable, "-c", CHILD, args.model, str(args.reps)], env=env,
                                     capture_output=True, text=True, check=True, timeout=900)
                got[n] += json.loads(out.stdout.strip().splitlines()[-1])
                print(f"round {r + 1} tasks/thread {n}: " + ", ".join(f"{p:.0f} / {d:.1f}" for p, d in got[n][-args.reps:])
                      + " tok/s (prefill / decode)", flush=True)
    finally:
        if busy is not None:
            busy.kill()
    print(f"\n{args.model}, {'beside a busy thread' if args.busy else 'idle'}: medians over "
          f"{args.rounds} x {args.reps} runs")
    summary = {}
    for n in args.tasks:
        p, d = statistics.median(x for x, _ in got[n]), statistics.median(y for _, y in got[n])
        summary[n] = {"prefill_tok_s": p, "decode_tok_s": d, "runs": got[n]}
        print(f"  tasks/thread {n:>3}: prefill {p:7.1f} tok/s, decode {d:6.1f} tok/s")
    if args.output:
        meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.platform(),
                "cpus": os.cpu_count(), "model": args.model, "busy": args.busy, "load_avg": os.getloadavg()}
        with open(args.output, "w") as f:
            json.dump({"meta": meta, "summary": summary}, f, indent=2)


if __name__ == "__main__":
    main()
