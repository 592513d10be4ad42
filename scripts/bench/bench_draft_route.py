"""The closed-book draft as one more search route (BM25) (generation-augmented retrieval, issue 55): the
question's own ranking fused by rank with the ranking of question + draft, at weight w for the
second, against the question's alone; hit@5 and hit@20 (a gold answer string in the top k
passages), on the eval's recorded questions and drafts (their Never answers: what the model says
before any search), split by whether the draft was right. A wrong draft must not pull wrong
articles in: the figures for wrong drafts are the ones that decide.

w (and how many of the question's own top passages always lead, `keep`) is chosen on the dev halves (each cell's seeded split, pooled over the cells given) by mean
hit@20 then hit@5; all figures are reported on the test halves.

    python scripts/bench/bench_draft_route.py --index index/large-bm25 \
        --records results/qwen2.5-coder-1.5b/clean --limit 500 --json runs/draft-route-qwen.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from targ_mlx import retrieval
from targ_mlx.eval.run import read_jsonl
from targ_mlx.eval.sweep import paired_ci, split
from targ_mlx.matching import contains

# (the route's weight, how many of the question's own top passages always lead: `retrieval.fuse`'s keep)
WEIGHTS = ((0.0, 0),) + tuple((w, keep) for keep in (0, 2, 3) for w in (0.5, 1.0, 1.5))


def route_query(question: str, draft: str) -> str:
    return retrieval.draft_query(question, draft)


def hits(found, answers, k) -> float:
    return contains(" ".join(p.text for p in found[:k]), answers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--records", required=True, type=Path, help="an eval output folder (one subfolder per dataset)")
    ap.add_argument("--limit", type=int, default=500, help="first N records of each dataset (the split pool)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from bm25_only import BM25Only

    r = BM25Only(args.index)  # hit figures need no cosine
    per = {}
    for f in sorted(args.records.glob("*/records.jsonl")):
        recs = read_jsonl(f)[: args.limit]
        qs = [x["question"].strip() for x in recs]
        own = r.search_batch(qs, 20)
        routes = r.search_batch([route_query(q, x["never"]["answer"]) for q, x in zip(qs, recs)], 20)
        rows = {w: [] for w in WEIGHTS}
        for x, a, b in zip(recs, own, routes):
            for w in WEIGHTS:
                fused = a if w == (0.0, 0) else retrieval.fuse([a, b], 20, weights=[1.0, w[0]], keep=w[1])
                rows[w].append((hits(fused, x["answers"], 5), hits(fused, x["answers"], 20)))
        dev, test = split(len(recs), 0, pool=args.limit)
        per[f.parent.name] = dict(rows=rows, dev=dev, test=test, right=np.array([x["never"]["acc"] for x in recs]))
        print(f"{f.parent.name}: {len(recs)}", file=sys.stderr)

    def mean_at(w, part, col):
        return float(np.mean([v[col] for d in per.values() for i, v in enumerate(d["rows"][w]) if i in set(d[part])]))

    best = max(WEIGHTS, key=lambda w: (mean_at(w, "dev", 1), mean_at(w, "dev", 0), -w[0]))
    out = {"chosen_w": best, "dev": {str(w): [mean_at(w, "dev", 0), mean_at(w, "dev", 1)] for w in WEIGHTS}, "cells": {}}
    for name, d in per.items():
        t = np.array(d["test"])
        cell = {}
        for label, mask in (("all", np.ones(len(t), bool)), ("draft right", d["right"][t] > 0),
                            ("draft wrong", d["right"][t] == 0)):
            idx = t[mask]
            base = np.array([d["rows"][(0.0, 0)][i] for i in idx])
            got = np.array([d["rows"][best][i] for i in idx])
            cell[label] = {"n": int(len(idx)), "hit5": [float(base[:, 0].mean()), float(got[:, 0].mean())],
                           "hit20": [float(base[:, 1].mean()), float(got[:, 1].mean())],
                           "hit5_diff": paired_ci(got[:, 0], base[:, 0]), "hit20_diff": paired_ci(got[:, 1], base[:, 1])}
        out["cells"][name] = cell
        print(name, json.dumps(cell), file=sys.stderr)
    print(f"w chosen on dev: {best}; dev hit@5/hit@20 by w: {out['dev']}", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
