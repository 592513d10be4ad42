"""What the selection's support (`selection.support`, the evidence gate's second search signal)
costs per question: computed over each eval record's packed passages, as the runner does.

The passages come from the index's `passages.db` by the records' keys (no model, no search), so the
time is the support's own: sentence splitting and word matching over the top K passages.

    python scripts/bench/bench_support.py results/qwen2.5-coder-1.5b/clean/nq_open index/clean-minilm \
        results/qwen2.5-coder-1.5b/large/nq_open index/large-bm25
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from targ_mlx.eval.record import passage_lookup
from targ_mlx.eval.run import read_jsonl
from targ_mlx.selection import support


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", nargs="+", help="RUN_FOLDER INDEX pairs (the index the run's records were made with)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    if len(args.pairs) % 2:
        ap.error("pass RUN_FOLDER INDEX pairs")
    for run, index in zip(args.pairs[::2], args.pairs[1::2]):
        text = passage_lookup(Path(index))
        items = [(r["question"], [text(p[0]) for p in r["always"]["passages"]])
                 for r in read_jsonl(Path(run) / "records.jsonl")]
        per = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            for q, passages in items:
                support(q, passages)
            per.append((time.perf_counter() - t0) / len(items))
        n = sum(len(p) for _, p in items) / len(items)
        print(f"{run}: {len(items)} questions, {n:.1f} passages each: support {statistics.median(per) * 1e3:.3f} ms "
              f"a question (median of {args.reps}; min {min(per) * 1e3:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
