"""Standalone retrieval queries for follow-ups, judged on TREC CAsT against the manual rewrites.

For every turn with earlier turns, the index is searched with the organisers' manual rewrite
(the reference) and with each way of forming the query; a way is as good as the passages it
shares with the reference's top 5:
  overlap@5   |top5(query) & top5(rewrite)| / 5
  recall@20   |top20(query) & top5(rewrite)| / 5
Ways: `none` (the question as asked), `questions-1/2/all` (that many earlier questions + the
question: `conversation.questions_query`), `model` (the backbone rewrites it:
`conversation.model_rewrite`, one short greedy generation, timed). CAsT gives the earlier
questions but not the answers, so the model sees questions only. The model runs on a seeded
sample (`--model-limit`); every way is also scored on that same sample.

    python scripts/bench_rewrite.py --index index/vital1k-minilm --model-limit 150
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import time
from datetime import date

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

from targ_mlx.conversation import Turn, model_rewrite, questions_query

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "conv", "trec_cast_2019_2020.jsonl")
CHEAP = {"none": 0, "questions-1": 1, "questions-2": 2, "questions-all": None}


def overlap(found: list, reference: list, k: int) -> float:
    ref = {p.key for p in reference[:5]}
    return len(ref & {p.key for p in found[:k]}) / max(1, len(ref))


def score(turns: list[dict], queries: dict[str, list[str]], retriever, top: int = 20) -> dict[str, dict]:
    """overlap@5 and recall@20 of every way's queries against the manual rewrite's top 5."""
    ref = retriever.search_batch([t["rewrite"] for t in turns], 5)
    out = {}
    for name, qs in queries.items():
        found = retriever.search_batch(qs, top)
        pairs = list(zip(found, ref))
        out[name] = {"overlap@5": statistics.mean(overlap(f, r, 5) for f, r in pairs),
                     "recall@20": statistics.mean(overlap(f, r, top) for f, r in pairs), "n": len(pairs)}
    return out


def cpu_flags() -> str:
    out = subprocess.run("grep -o 'avx512[a-z_]*\\|avx2' /proc/cpuinfo | sort -u", shell=True,
                         capture_output=True, text=True).stdout.split()
    return " ".join(out) or "-"


def table(title: str, scores: dict[str, dict], latency: dict[str, float]) -> str:
    lines = [f"{title}", "", "| query | overlap@5 | recall@20 | added latency (mean / p95) |", "|---|---|---|---|"]
    for name, s in scores.items():
        lat = latency.get(name)
        lat_s = "-" if lat is None else f"{lat['mean'] * 1000:.1f} / {lat['p95'] * 1000:.1f} ms"
        lines.append(f"| {name} | {s['overlap@5']:.3f} | {s['recall@20']:.3f} | {lat_s} |")
    return "\n".join(lines)


def timed(fn, items) -> tuple[list[str], dict]:
    out, secs = [], []
    for item in items:
        t0 = time.perf_counter()
        out.append(fn(item))
        secs.append(time.perf_counter() - t0)
    secs_sorted = sorted(secs)
    return out, {"mean": statistics.mean(secs), "p95": secs_sorted[int(0.95 * (len(secs) - 1))]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-file", default=DATA)
    ap.add_argument("--index", required=True, help="index folder searched by every way and by the manual rewrite")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--model-limit", type=int, default=150, help="turns the model rewrites (seeded sample; 0 = all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", default="runs/bench_rewrite")
    args = ap.parse_args(argv)
    from targ_mlx.index import open_retriever

    with open(args.data_file) as f:
        turns = [t for t in map(json.loads, f) if t["history"]]
    history = lambda t: [Turn(q, "") for q in t["history"]]  # noqa: E731
    retriever = open_retriever(args.index)
    queries, latency = {}, {}
    for name, kept in CHEAP.items():
        queries[name], latency[name] = timed(lambda t: questions_query(t["question"], history(t), kept), turns)
    everything = score(turns, queries, retriever)
    differ = [i for i, t in enumerate(turns) if t["question"] != t["rewrite"]]
    changed = score([turns[i] for i in differ], {n: [q[i] for i in differ] for n, q in queries.items()}, retriever)

    from targ_mlx.backbone import load_backbone

    bb = load_backbone(args.model)
    model_rewrite(bb, turns[0]["question"], history(turns[0]))  # warm-up
    n = len(turns) if args.model_limit <= 0 else min(args.model_limit, len(turns))
    sample = sorted(random.Random(args.seed).sample(range(len(turns)), n))
    rewrites, latency["model"] = timed(lambda i: model_rewrite(bb, turns[i]["question"], history(turns[i])), sample)
    sub_queries = {name: [q[i] for i in sample] for name, q in queries.items()} | {"model": rewrites}
    on_sample = score([turns[i] for i in sample], sub_queries, retriever)

    meta = {"date": str(date.today()), "machine": platform.machine(), "cpu_flags": cpu_flags(),
            "cpus": os.cpu_count(), "load": os.getloadavg()[0], "index": args.index, "index_size": len(retriever),
            "model": bb.model_id, "turns_with_history": len(turns), "differing": len(differ), "model_sample": n}
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "all": everything, "differing": changed, "sample": on_sample, "latency": latency,
                   "rewrites": [{"id": turns[i]["id"], "question": turns[i]["question"], "manual": turns[i]["rewrite"],
                                 "model": r} for i, r in zip(sample, rewrites)]}, f, indent=1)
    print(json.dumps(meta))
    print(table(f"All {len(turns)} turns with earlier turns:", everything, latency))
    print()
    print(table(f"The {len(differ)} turns whose manual rewrite differs from the question:", changed, latency))
    print()
    print(table(f"Seeded sample of {n} turns, with the model's rewrite:", on_sample, latency))


if __name__ == "__main__":
    main()
