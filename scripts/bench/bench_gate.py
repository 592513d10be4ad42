"""Gate overhead at batch 1 on real questions, measured side by side in one run.

1. Never-RAG (plain greedy decoding) vs TARG-margin with tau = 1.0 (U_mar <= 1, so it never
   retrieves): the whole cost of drafting with statistics + scoring, as a latency ratio.
2. The variance gate's draft (greedy row + N=5 sampled rows decoded as one batch sharing one
   prefill) vs one greedy draft.
The order of the two arms alternates per question so drift on a shared machine cancels.

    python scripts/bench/bench_gate.py --n 100 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from datetime import date

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

from targ_mlx import pipeline
from targ_mlx.assistant import Assistant, Settings
from targ_mlx.runtime.backbone import load_backbone
from targ_mlx.runtime.draft import draft

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "qa", "nq_open_dev.jsonl")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-file", default=DATA)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--prompt", default="paper", choices=("paper", "short"))
    ap.add_argument("--reps", type=int, default=1,
                    help="time each arm this many times per question (alternating) and keep its fastest: "
                         "noise from other jobs only ever adds time")
    ap.add_argument("--output-dir", default="runs/bench_gate")
    args = ap.parse_args(argv)
    with open(args.data_file) as f:
        questions = [json.loads(line)["question"] for line in f][: args.n]
    bb = load_backbone(args.model)
    a = Assistant(bb, None, Settings(gate="margin", tau=1.0, k=args.k, prompt_style=args.prompt))
    a.answer(questions[0], gate="never")  # warm-up: compile the stats graph, touch the weights
    a.answer(questions[0])
    never_s, targ_s, greedy_s, var_s, same = [], [], [], [], 0
    rng = random.Random(0)
    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0

    for i, q in enumerate(questions):
        ids = pipeline.prompt_ids(a.backbone, q, args.prompt)
        best = {"never": [], "targ": [], "greedy": [], "variance": []}
        for _ in range(args.reps):
            arms = ["never", "targ"]
            rng.shuffle(arms)
            got = {}
            for arm in arms:
                got[arm], dt = timed(lambda: a.answer(q, gate="never") if arm == "never" else a.answer(q))
                best[arm].append(dt)
            assert not got["targ"].retrieved
            arms = ["greedy", "variance"]
            rng.shuffle(arms)
            for arm in arms:
                _, dt = timed(lambda: draft(bb, ids, args.k, n_samples=5 if arm == "variance" else 0, seed=i))
                best[arm].append(dt)
        same += got["targ"].answer == got["never"].answer
        for arm, dest in (("never", never_s), ("targ", targ_s), ("greedy", greedy_s), ("variance", var_s)):
            dest.append(min(best[arm]))
        if (i + 1) % 10 == 0:
            print(f"{i + 1}/{len(questions)}: targ/never {sum(targ_s) / sum(never_s):.4f}  "
                  f"variance/greedy {sum(var_s) / sum(greedy_s):.3f}", flush=True)
    paired = lambda a_, b_: statistics.median(x / y for x, y in zip(a_, b_))  # noqa: E731
    out = {
        "date": str(date.today()), "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "load_avg": os.getloadavg(), "n": len(questions), "k": args.k, "prompt": args.prompt, "reps": args.reps,
        "never_s_per_q": sum(never_s) / len(never_s), "targ_s_per_q": sum(targ_s) / len(targ_s),
        "targ_over_never": sum(targ_s) / sum(never_s), "targ_over_never_median_paired": paired(targ_s, never_s),
        "identical_answers": same,
        "greedy_draft_s": sum(greedy_s) / len(greedy_s), "variance_draft_s": sum(var_s) / len(var_s),
        "variance_over_greedy": sum(var_s) / sum(greedy_s), "variance_over_greedy_median_paired": paired(var_s, greedy_s),
    }
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "bench_gate.json"), "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
