"""Answer coverage of an index: hit@5 and hit@20 for dense, BM25 and hybrid search side by side.

hit@K = an accepted answer string occurs in the text of the top K passages (the eval's
`contains`, the same test as the records' `hit`), on the eval's own seeded samples of each QA set
(500 questions, seed 0, as `python -m targ_mlx.eval` draws them). Every mode the index supports is
searched: dense (vectors), bm25 (its BM25 part) and hybrid (both, fused by reciprocal rank), and with
--exact dense search without the HNSW graph (every vector compared: what the graph costs); a
BM25-only index (built with --no-dense) has no dense mode, and its hybrid re-orders BM25's top 20 by
cosine, encoding them per question (slow: ~20 passages a question). BM25 ranks here come from the
lexical index directly, so no passage is encoded just for them.

    python scripts/bench/bench_coverage.py --index vital=index/vital-articles-minilm --index clean=index/clean-minilm \
        --index large=index/large-bm25 --output runs/coverage.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

from targ_mlx.eval.datasets import read_jsonl, sample
from targ_mlx.eval.metrics import contains
from targ_mlx.index.lexical import has_lexical, open_lexical
from targ_mlx.index.merged import open_indexes
from targ_mlx.index.retriever import open_retriever

QA = Path(__file__).resolve().parents[3] / "shared" / "data" / "qa"
DATASETS = {"nq_open": QA / "nq_open_dev.jsonl", "triviaqa": QA / "triviaqa_dev.jsonl", "popqa": QA / "popqa_1k.jsonl"}
DEPTH = 20


def _searchers(folder: Path, exact: bool = False) -> dict:
    """mode -> f(questions) -> top-DEPTH passage texts per question."""
    base = open_retriever(folder)
    dense = base.index is not None
    out = {}
    if dense:
        out["dense"] = lambda qs: [[p.text for p in ps] for ps in base.search_batch(qs, DEPTH)]
        if exact:  # every vector compared, no graph: what the HNSW approximation costs in coverage
            def dense_exact(qs):
                vecs = base.encoder.encode_queries(qs)
                return [[p.text for p in ps] for ps in base.search_vectors(vecs, DEPTH, exact=True)]

            out["exact"] = dense_exact
    if has_lexical(folder):
        lex = open_lexical(folder)

        def bm25(qs):
            found = lex.search(qs, DEPTH)
            texts = base.passages([k for row in found for k, _ in row])
            return [[texts[k][1] for k, _ in row if k in texts] for row in found]

        out["bm25"] = bm25
        # on a BM25-only index hybrid is BM25's top 20 re-ordered by cosine (encoded per search):
        # its hit@20 is BM25's, and it is slow here (20 passages encoded per question)
        hybrid = open_indexes([folder], retriever="hybrid")
        out["hybrid"] = lambda qs: [[p.text for p in ps] for ps in hybrid.search_batch(qs, DEPTH)]
    return out


def measure(folder: Path, limit: int, seed: int, exact: bool = False) -> dict:
    res: dict = {}
    searchers = _searchers(folder, exact)
    for name, path in DATASETS.items():
        items = sample(read_jsonl(path), limit, seed)
        qs = [it.question for it in items]
        for mode, search in searchers.items():
            t0 = time.perf_counter()
            texts = []
            for i in range(0, len(qs), 50):
                texts += search(qs[i : i + 50])
            ms = 1000 * (time.perf_counter() - t0) / len(qs)
            hits = {k: statistics.mean(contains(" ".join(t[:k]), it.answers) for t, it in zip(texts, items))
                    for k in (5, 20)}
            res.setdefault(name, {})[mode] = {"hit@5": hits[5], "hit@20": hits[20], "ms_per_query": ms}
            print(f"{folder.name:28} {name:9} {mode:7} hit@5 {100 * hits[5]:5.1f}  hit@20 {100 * hits[20]:5.1f}  "
                  f"{ms:7.1f} ms/q", flush=True)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--index", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--limit", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default="runs/coverage.json")
    p.add_argument("--exact", action="store_true", help="also dense search without the HNSW graph (brute force)")
    args = p.parse_args(argv)
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or platform.machine(),
           "cpu_flags": subprocess.run("grep -o 'avx512[a-z_]*\\|avx2' /proc/cpuinfo | sort -u | tr '\\n' ' '",
                                       shell=True, capture_output=True, text=True).stdout.strip(),
           "limit": args.limit, "seed": args.seed, "indexes": {}}
    for spec in args.index:
        name, _, folder = spec.partition("=")
        m = open_retriever(folder).manifest
        out["indexes"][name] = {"folder": folder, "passages": m["counts"]["passages"], "corpora": m["build"]["corpora"],
                                "results": measure(Path(folder), args.limit, args.seed, args.exact)}
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(out, indent=2))
    modes = ("dense", "exact", "bm25", "hybrid") if args.exact else ("dense", "bm25", "hybrid")
    print("\n| index (passages) | dataset | " + " | ".join(f"{m} hit@5 / @20" for m in modes) + " |")
    print("|---|---|" + "---|" * len(modes))
    for name, ix in out["indexes"].items():
        for ds, found in ix["results"].items():
            cells = [f"{100 * found[m]['hit@5']:.1f} / {100 * found[m]['hit@20']:.1f}" if m in found else "—"
                     for m in modes]
            print(f"| {name} ({ix['passages']:,}) | {ds} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
