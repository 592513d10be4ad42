"""Probe: the weight of BM25 in hybrid search, on questions the eval does not use.

For an index with both parts (vectors and BM25), each held-out question (seed 1, none of the eval's
seed-0 sample of 500) is searched once by each ranking, FUSE_DEPTH deep; the two are fused by
weighted reciprocal rank, w / (60 + r_dense) + (1 - w) / (60 + r_bm25), for each w, and hit@5 is
whether an accepted answer occurs in the fused top 5 (the eval's `contains`). w = 0.5 is what
`--retriever hybrid` does; 1.0 is dense alone, 0.0 BM25 alone. docs/archive/benchmarks-journal.md,
"Answer coverage".

    python scripts/archive/probe_fusion.py --index index/large-hybrid --limit 500
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from targ_mlx.eval.datasets import read_jsonl, sample
from targ_mlx.eval.metrics import contains
from targ_mlx.index.lexical import open_lexical
from targ_mlx.index.retriever import open_retriever
from targ_mlx.retrieval import FUSE_DEPTH, Passage, fuse

QA = Path(__file__).resolve().parents[3] / "shared" / "data" / "qa"
DATASETS = {"nq_open": QA / "nq_open_dev.jsonl", "triviaqa": QA / "triviaqa_dev.jsonl", "popqa": QA / "popqa_1k.jsonl"}
WEIGHTS = (0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def fused_top(dense: list[int], bm25: list[int], w: float, k: int = 5) -> list[int]:
    """The top `k` keys of two rankings by the product's fusion, BM25 weighted 1 - w against w."""
    def ranked(keys):
        return [Passage(key, "", "", 0.0) for key in keys]

    return [p.key for p in fuse([ranked(dense), ranked(bm25)], k, weights=[w, 1.0 - w])]


def held_out(path: Path, limit: int) -> list:
    items = read_jsonl(path)
    eval_ids = {it.question for it in sample(items, 500, 0)}
    pool = sample(items, 2000, 1)  # PopQA's 1,000: all of them, so its held-out set is the other 500
    return [it for it in pool if it.question not in eval_ids][:limit]


def probe(folder: Path, path: Path, limit: int) -> dict:
    r = open_retriever(folder)
    lex = open_lexical(folder)
    items = held_out(path, limit)
    t0 = time.perf_counter()
    vecs = np.atleast_2d(r.encoder.encode_queries([it.question for it in items])).astype(np.float32)
    dense = [[p.key for p in row] for row in r.search_vectors(vecs, FUSE_DEPTH)]
    bm25 = [[k for k, _ in row] for row in lex.search([it.question for it in items], FUSE_DEPTH)]
    hits = {w: [] for w in WEIGHTS}
    for it, d, b in zip(items, dense, bm25):
        tops = {w: fused_top(d, b, w) for w in WEIGHTS}
        texts = r.passages([k for top in tops.values() for k in top])
        for w, top in tops.items():
            hits[w].append(contains(" ".join(texts[k][1] for k in top if k in texts), it.answers))
    return {"questions": len(items), "seconds": round(time.perf_counter() - t0, 1),
            "hit@5": {str(w): round(100 * statistics.mean(h), 1) for w, h in hits.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--index", required=True, type=Path, help="an index folder with vectors and a BM25 part")
    p.add_argument("--limit", type=int, default=500, help="held-out questions per dataset")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--output", type=Path, default=None, help="also write the figures as JSON here")
    args = p.parse_args(argv)
    out = {}
    print("| dataset (held-out questions) | " + " | ".join(f"w = {w}" for w in WEIGHTS) + " |")
    print("|---|" + "---|" * len(WEIGHTS))
    for name in args.datasets:
        res = out[name] = probe(args.index, DATASETS[name], args.limit)
        print(f"| {name} ({res['questions']}) | " + " | ".join(f"{v}" for v in res["hit@5"].values())
              + f" |  ({res['seconds']} s)", flush=True)
    if args.output:
        args.output.write_text(json.dumps({"index": str(args.index), "results": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
