"""Search latency of an index as `targ ask` searches it (top 5), and where a BM25-only index's time goes.

For each --retriever mode: p50 / p95 seconds of `search(question, k=5)` over the first --n NQ-Open
dev questions (one warm-up search first: the encoder loaded, the files mapped). Then, since a
BM25-only index has no stored vectors, the passages a search returns are encoded at search time
for their cosine (the gate's similarity scale): 20 passages of the index timed with each encoder
backend installed here (median of 8 batches after a warm-up), the cost hybrid pays per question.
Each backend runs in a process of its own: loading the float32 torch backend sets torch to one
thread (`encoder._one_torch_thread_over_openblas`), which would slow a bfloat16 run after it.

    python scripts/bench/bench_search.py --index index/large-bm25 --retriever bm25 hybrid \
        --backends mlx torch torch-bf16 onnx-int8
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from targ_mlx import bind_openblas

bind_openblas()  # before anything loads mlx.core
from targ_mlx.index import load_encoders, open_indexes  # noqa: E402
from targ_mlx.index.encoder import load_encoder  # noqa: E402

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "qa" / "nq_open_dev.jsonl"


def _p(ts: list[float], q: float) -> float:
    return sorted(ts)[int(q * (len(ts) - 1))]


def search_times(index: str, mode: str, questions: list[str]) -> dict:
    r = load_encoders(open_indexes([index], retriever=mode))
    r.search(questions[0], k=5)
    ts = []
    for q in questions[1:]:
        t0 = time.perf_counter()
        r.search(q, k=5)
        ts.append(time.perf_counter() - t0)
    return {"mode": mode, "p50_ms": 1000 * statistics.median(ts), "p95_ms": 1000 * _p(ts, 0.95), "n": len(ts)}


def encode_times(index: str, backend: str) -> dict:
    name = json.loads((Path(index) / "manifest.json").read_text())["encoder"]["name"]
    with sqlite3.connect(f"file:{Path(index) / 'passages.db'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT title, text FROM passages WHERE key % 997 = 3 LIMIT 180").fetchall()
        if len(rows) < 180:  # a small index: its first 180 by key (keys are hashes: spread over it)
            rows = db.execute("SELECT title, text FROM passages ORDER BY key LIMIT 180").fetchall()
    enc = load_encoder(name, backend=backend)
    batches = [rows[i: i + 20] for i in range(0, 180, 20)]
    enc.encode_passages([t for t, _ in batches[0]], [x for _, x in batches[0]])  # warm-up
    ts = []
    for b in batches[1:]:
        t0 = time.perf_counter()
        enc.encode_passages([t for t, _ in b], [x for _, x in b])
        ts.append(time.perf_counter() - t0)
    return {"backend": backend, "median_ms": 1000 * statistics.median(ts), "min_ms": 1000 * min(ts)}


def _in_own_process(index: str, backend: str) -> dict:
    run = subprocess.run([sys.executable, __file__, "--index", index, "--one-backend", backend],
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--retriever", nargs="+", default=["bm25", "hybrid"])
    ap.add_argument("--backends", nargs="*", default=["mlx", "torch", "torch-bf16"])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--data-file", default=str(DATA))
    ap.add_argument("--one-backend", help=argparse.SUPPRESS)  # the child process of one backend's timing
    args = ap.parse_args(argv)
    if args.one_backend:
        print(json.dumps(encode_times(args.index, args.one_backend)))
        return 0
    with open(args.data_file, encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in f][: args.n]
    flags = subprocess.run("grep -o 'avx512[a-z_0-9]*\\|avx2\\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u",
                           shell=True, capture_output=True, text=True).stdout.split()
    out = {"date": str(date.today()), "index": args.index, "cpu_flags": " ".join(flags),
           "search": [search_times(args.index, m, questions) for m in args.retriever],
           "encode_20_passages": [_in_own_process(args.index, b) for b in args.backends]}
    print(json.dumps(out))
    for s in out["search"]:
        print(f"{s['mode']:>7}: p50 {s['p50_ms']:.0f} ms, p95 {s['p95_ms']:.0f} ms ({s['n']} questions)")
    for e in out["encode_20_passages"]:
        print(f"encode 20 passages, {e['backend']:>10}: median {e['median_ms']:.0f} ms (min {e['min_ms']:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
