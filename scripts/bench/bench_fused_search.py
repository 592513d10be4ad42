"""A chat follow-up's search: several forms of one question fused by rank, as `retrieval.fuse` over
each form's full top 20 (every passage completed with text and cosine first) against the index's
own `search_fused` (`retrieval.search_fused`; hybrid.py: the fused top k completed only), side by
side, question by question (a dense index has no search of its own: the two ways are one).

On a BM25-only index a passage's cosine is encoded at search time, so the first way encodes up to
20 passages per form and the second k. Each "follow-up" is three forms built from two consecutive
NQ-Open dev questions (the second as asked, both joined, the first), weights 1 / 0.5 / 0.25 as a
chat's forms; prints milliseconds per search (median) each way, their ratio, and how many of the
fused top k lists are equal (keys and cosines).

    python scripts/bench/bench_fused_search.py --index index/large-bm25 --limit 40

`--fused-only --retriever bm25|hybrid`: the index's own fused search alone (nothing encoded
before it), what a chat's follow-up costs in each mode.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

from targ_mlx.eval.datasets import read_jsonl  # noqa: E402
from targ_mlx.index.merged import open_indexes  # noqa: E402
from targ_mlx.retrieval import FUSE_DEPTH, RETRIEVERS, fuse, search_fused  # noqa: E402

QA = Path(__file__).resolve().parents[3] / "shared" / "data" / "qa" / "nq_open_dev.jsonl"
WEIGHTS = [1.0, 0.5, 0.25]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--index", required=True)
    p.add_argument("--limit", type=int, default=40, help="follow-ups (pairs of questions)")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--retriever", choices=RETRIEVERS, help="search mode (default: the index's)")
    p.add_argument("--fused-only", action="store_true", help="time the index's own fused search alone")
    args = p.parse_args(argv)
    r = open_indexes([Path(args.index)], retriever=args.retriever)
    qs = [it.question for it in read_jsonl(QA)[: 2 * args.limit + 2]]
    r.search_batch(qs[:3], args.k)  # loads the encoder and maps the index
    generic, own, equal = [], [], 0
    for i in range(args.limit):
        forms = [qs[2 * i + 1], f"{qs[2 * i]} {qs[2 * i + 1]}", qs[2 * i]]
        t0 = time.perf_counter()
        a = [] if args.fused_only else fuse(r.search_batch(forms, max(args.k, FUSE_DEPTH)), args.k, weights=WEIGHTS)
        t1 = time.perf_counter()
        b = search_fused(r, forms, args.k, WEIGHTS)
        t2 = time.perf_counter()
        generic.append(t1 - t0)
        own.append(t2 - t1)
        equal += [(x.key, round(x.score, 5)) for x in a] == [(x.key, round(x.score, 5)) for x in b]
    g, o = 1000 * statistics.median(generic), 1000 * statistics.median(own)
    if args.fused_only:
        print(f"{args.index} ({getattr(r, 'mode', '-')}), {args.limit} follow-ups of 3 forms, top {args.k}: "
              f"search_fused {o:.0f} ms median, p95 {1000 * sorted(own)[int(0.95 * len(own))]:.0f} ms")
        return 0
    print(f"{args.index} ({type(r).__name__}, {getattr(r, 'mode', '-')}), {args.limit} follow-ups of 3 forms, top {args.k}: "
          f"fuse(search_batch) {g:.0f} ms, search_fused {o:.0f} ms (median), {g / o:.2f}x; "
          f"equal top {args.k}: {equal} of {args.limit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
