"""Query-likelihood reranking (UPR: mean log p(question | passage) under SmolLM2) over BM25's top
20, fused by rank with BM25's own order at weight w, against BM25's order alone (issue 55,
deliver 4): hit@1 / hit@3 / hit@5 (a gold answer string in the top k passages: what a read of
the top k can find) and the seconds the judge takes a question.

w is chosen on the dev halves (each cell's seeded split, pooled over the cells given) by mean
hit@5 then hit@3; all figures are reported on the test halves, paired against BM25's order with
a 95% bootstrap CI.

    python scripts/bench/bench_upr.py --index index/large-bm25 \
        --records results/qwen2.5-coder-1.5b/clean --limit 400 --json runs/upr/upr.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

from targ_mlx import rerank  # noqa: E402
from targ_mlx.eval.run import read_jsonl  # noqa: E402
from targ_mlx.eval.sweep import paired_ci, split  # noqa: E402
from targ_mlx.matching import contains  # noqa: E402

WEIGHTS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, math.inf)  # 0: BM25's order; inf: the likelihood's alone
KS = (1, 3, 5)
POOL = 500  # the eval's split pool (--split-pool 500)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--records", required=True, type=Path, help="an eval output folder (one subfolder per dataset)")
    ap.add_argument("--limit", type=int, default=400, help="first N records of each dataset")
    ap.add_argument("--depth", type=int, default=rerank.RERANK_FROM)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from bm25_only import BM25Only

    r = BM25Only(args.index)  # hit figures need no cosine
    judge = rerank.load_reranker(rerank.UPR)
    judge.likelihoods("warm up", r.search_batch(["warm up"], 2)[0])
    per, seconds = {}, []
    for f in sorted(args.records.glob("*/records.jsonl")):
        recs = read_jsonl(f)[: args.limit]
        rows = {w: [] for w in WEIGHTS}
        for x in recs:
            found = r.search_batch([x["question"].strip()], args.depth)[0]
            t0 = time.perf_counter()
            ll = judge.likelihoods(x["question"], found) if len(found) > 1 else [0.0] * len(found)
            seconds.append(time.perf_counter() - t0)
            for w in WEIGHTS:
                ranked = rerank.reorder(found, rerank.fused_with_likelihood(ll, w))
                rows[w].append([contains(" ".join(p.text for p in ranked[:k]), x["answers"]) for k in KS])
        # the eval's own split of its 500-question pool (what its budgets were chosen on), cut to these
        dev, test = (h[h < len(recs)] for h in split(max(len(recs), POOL), 0, pool=POOL))
        per[f.parent.name] = dict(rows={w: np.array(v, float) for w, v in rows.items()}, dev=dev, test=test)
        print(f"{f.parent.name}: {len(recs)}, {statistics.median(seconds):.2f} s a question", file=sys.stderr)

    def mean_at(w, part, col):
        return float(np.mean(np.concatenate([d["rows"][w][d[part], col] for d in per.values()])))

    best = max((w for w in WEIGHTS if w > 0), key=lambda w: (mean_at(w, "dev", 2), mean_at(w, "dev", 1)))
    out = {"chosen_w": best, "dev": {str(w): [mean_at(w, "dev", c) for c in range(len(KS))] for w in WEIGHTS},
           "judge_seconds_median": statistics.median(seconds), "judge_seconds_p95": sorted(seconds)[int(.95 * (len(seconds) - 1))],
           "cells": {}}
    for name, d in per.items():
        t = np.array(d["test"])
        base, got = d["rows"][0.0][t], d["rows"][best][t]
        out["cells"][name] = {"n": int(len(t)), **{f"hit@{k}": [float(base[:, c].mean()), float(got[:, c].mean())]
                                                  for c, k in enumerate(KS)},
                              "hit@5 diff CI": list(paired_ci(got[:, 2], base[:, 2]))}
    print(json.dumps(out, indent=2, default=str))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
