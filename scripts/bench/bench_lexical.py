"""Lexical engines side by side on one index's passages: Tantivy (the product's) against bm25s (what
indexes were built with before): build time, build peak RSS, size on disk, open time, query p50 /
p95, and hit@5 / hit@20 on the eval's questions, paired question by question.

Each engine builds in its own child process from the index's passages.db (the product's row
stream), so each peak RSS is that build's alone. hit@K = an accepted answer string occurs in the
top K passages' text (the eval's `contains`), on the eval's seeded samples (500 questions, seed 0).

    python scripts/bench/bench_lexical.py --index index/large-bm25 --json runs/lexical-large.json
"""

from __future__ import annotations

import argparse
import json
import resource
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench_scale import QA, cpu_flags, folder_gb

ENGINES = ("bm25s", "tantivy")
DEPTH = 20


def build_child(engine: str, index: Path, out: Path) -> None:
    """(in the child) Build `engine` over the passages of `index` into `out`/bm25; print the figures."""
    from targ_mlx.index.lexical import build_lexical_from, index_databases, lexical_dir, passage_rows

    t0 = time.perf_counter()
    dbs = index_databases(index)
    if engine == "tantivy":
        build_lexical_from(dbs, lexical_dir(out))
    else:
        from targ_mlx.index.lexical_bm25s import build_bm25s

        build_bm25s(passage_rows(dbs)(None), lexical_dir(out))
    print(json.dumps({"build_s": round(time.perf_counter() - t0, 1),
                      "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3)}))


def _texts(db: Path, keys: list[int]) -> dict[int, str]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        marks = ",".join("?" * len(keys))
        return {k: f"{t} {x}" for k, t, x in c.execute(f"SELECT key, title, text FROM passages WHERE key IN ({marks})", keys)}


def measure(engine: str, index: Path, work: Path, limit: int) -> dict:
    from targ_mlx.eval.datasets import read_jsonl, sample
    from targ_mlx.index.lexical import index_databases, open_lexical
    from targ_mlx.matching import contains

    out = work / engine
    if not (out / "bm25" / "lexical.json").is_file():
        run = subprocess.run([sys.executable, __file__, "--build-child", engine, "--index", str(index), "--work", str(work)],
                             capture_output=True, text=True, check=True)
        (work / f"{engine}.build.json").write_text(run.stdout)
    built = json.loads((work / f"{engine}.build.json").read_text())
    t0 = time.perf_counter()
    lex = open_lexical(out)
    open_s = time.perf_counter() - t0
    db = index_databases(index)[0]
    res = {**built, "disk_gb": round(folder_gb(out / "bm25"), 3), "open_s": round(open_s, 3), "datasets": {}}
    ms = []
    for name, path in QA.items():
        items = sample(read_jsonl(path), limit, 0)
        hits = {5: [], 20: []}
        for it in items:
            t0 = time.perf_counter()
            found = lex.search([it.question], DEPTH)[0]
            ms.append(1000 * (time.perf_counter() - t0))
            keys = [k for k, _ in found]
            texts = _texts(db, keys) if keys else {}
            for k in hits:
                hits[k].append(contains(" ".join(texts[key] for key in keys[:k] if key in texts), it.answers))
        res["datasets"][name] = {f"hit@{k}": [float(x) for x in v] for k, v in hits.items()}
    res["query_p50_ms"] = round(float(np.percentile(ms, 50)), 2)
    res["query_p95_ms"] = round(float(np.percentile(ms, 95)), 2)
    return res


def paired(a: list[float], b: list[float]) -> str:
    """b - a in points with a 95% bootstrap interval, and how many questions only one side hits."""
    from targ_mlx.eval.metrics import bootstrap_ci

    d = np.asarray(b) - np.asarray(a)
    _, lo, hi = bootstrap_ci(d)
    return (f"{100 * d.mean():+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] "
            f"(only bm25s {int((d < 0).sum())}, only tantivy {int((d > 0).sum())})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--index", required=True, help="a built index folder (its passages.db is read)")
    p.add_argument("--work", default=None, help="where both engines build (default runs/lexical/<index name>)")
    p.add_argument("--limit", type=int, default=500, help="questions of each QA set")
    p.add_argument("--json", default=None)
    p.add_argument("--build-child", choices=ENGINES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    index = Path(args.index)
    work = Path(args.work or f"runs/lexical/{index.name}")
    if args.build_child:
        build_child(args.build_child, index, work / args.build_child)
        return 0
    work.mkdir(parents=True, exist_ok=True)
    res = {e: measure(e, index, work, args.limit) for e in ENGINES}
    print("| engine | build | build peak RSS | on disk | open | query p50 / p95 | " +
          " | ".join(f"{d} hit@5 / @20" for d in QA) + " |")
    for e, r in res.items():
        cells = [f"{100 * np.mean(r['datasets'][d]['hit@5']):.1f} / {100 * np.mean(r['datasets'][d]['hit@20']):.1f}" for d in QA]
        print(f"| {e} | {r['build_s']} s | {r['peak_rss_gb']} GB | {r['disk_gb']} GB | {r['open_s']} s | "
              f"{r['query_p50_ms']} / {r['query_p95_ms']} ms | " + " | ".join(cells) + " |")
    for d in QA:
        for k in (5, 20):
            print(f"{d} hit@{k}, tantivy - bm25s: {paired(res['bm25s']['datasets'][d][f'hit@{k}'], res['tantivy']['datasets'][d][f'hit@{k}'])}")
    if args.json:
        out = {"index": str(index), "limit": args.limit, "cpu_flags": cpu_flags(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "command": "python scripts/bench/bench_lexical.py " + " ".join(argv or sys.argv[1:]), "engines": res}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
