"""Encoder speed and agreement: the float32 torch encoder vs the int8 ONNX backend, side by side.

Speed: the same real ~1,000-character chunks (the first N of the default vital-articles corpus,
titles in front, as builds encode them) are encoded by each backend in turn, `--reps` times,
alternating so that load from other processes falls on both alike; chunks/s per run, the median
and the ratio are reported.

Agreement: recall@5 of the fast encoder's top 5 against the float32 encoder's top 5 for NQ-Open
dev questions, over the passages of a real index. The float32 reference vectors are read from a
build in progress (DIR.partial keeps each committed chunk's float32 vector; read-only), or
encoded here with the torch backend when no --reference is given. Search is exact (brute force),
so only the encoders differ.

    python scripts/bench_encoder.py --reference index/clean-minilm.partial --output-dir runs/bench_encoder
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import sqlite3
import statistics
import sys
import time
from contextlib import closing
from pathlib import Path

import numpy as np

from targ_mlx.index.build import iter_chunks
from targ_mlx.index.chunking import ChunkParams
from targ_mlx.index.corpus import VITAL
from targ_mlx.index.encoder import load_encoder

NQ_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "qa" / "nq_open_dev.jsonl"
FAST = "onnx-int8"


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", type=int, default=256, help="chunks encoded per speed run (default 256)")
    p.add_argument("--reps", type=int, default=3, help="speed runs per backend, alternating (default 3)")
    p.add_argument("--batch-size", type=int, default=32, help="encoder batch size (default 32)")
    p.add_argument("--reference", help="DIR.partial of a torch-encoded build: its committed float32 vectors")
    p.add_argument("--passages", type=int, default=2000, help="reference passages searched at most (default 2000)")
    p.add_argument("--questions", type=int, default=1000, help="NQ-Open dev questions (default 1000)")
    p.add_argument("--data-file", default=str(NQ_DEV), help=f"questions JSONL (default {NQ_DEV})")
    p.add_argument("--output-dir", help="write results.json here")
    return p


def machine() -> dict:
    flags = sorted(set(re.findall(r"\b(avx512[a-z_]*|avx2|fma|avx_vnni)\b", Path("/proc/cpuinfo").read_text())))
    model = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
    return {"cpu": model.group(1) if model else platform.processor(), "cores": os.cpu_count(), "flags": flags,
            "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def speed(encoders: dict, chunks, reps: int) -> dict:
    titles, texts = [c.title for c in chunks], [c.text for c in chunks]
    for enc in encoders.values():  # warm-up: first-call allocations, thread pools
        enc.encode_passages(titles[:8], texts[:8])
    runs: dict[str, list[float]] = {name: [] for name in encoders}
    for rep in range(reps):
        for name, enc in encoders.items():
            t0 = time.perf_counter()
            enc.encode_passages(titles, texts)
            runs[name].append(len(chunks) / (time.perf_counter() - t0))
            print(f"  rep {rep + 1} {name:10} {runs[name][-1]:7.2f} chunks/s", flush=True)
    med = {name: statistics.median(r) for name, r in runs.items()}
    return {"chunks": len(chunks), "runs_chunks_per_s": runs, "median_chunks_per_s": med,
            "speedup": med[FAST] / med["torch"]}


def reference_vectors(part: Path, limit: int) -> tuple[list[str], list[str], np.ndarray]:
    """(titles, texts, float32 vectors) of the first `limit` committed chunks of a build."""
    with closing(sqlite3.connect(f"file:{(part / 'passages.db').resolve()}?mode=ro", uri=True, timeout=5)) as db:
        rows = db.execute("SELECT p.title, p.text, v.vector FROM passages p JOIN pending v ON v.key = p.key "
                          "ORDER BY p.key LIMIT ?", (limit,)).fetchall()
    vecs = np.stack([np.frombuffer(r[2], dtype=np.float32) for r in rows])
    return [r[0] for r in rows], [r[1] for r in rows], vecs


def agreement(encoders: dict, titles, texts, ref: np.ndarray | None, questions: list[str], k: int = 5) -> dict:
    if ref is None:
        ref = encoders["torch"].encode_passages(titles, texts)
    fast = encoders[FAST].encode_passages(titles, texts)
    top_ref = np.argsort(-(encoders["torch"].encode_queries(questions) @ ref.T), axis=1)[:, :k]
    top_fast = np.argsort(-(encoders[FAST].encode_queries(questions) @ fast.T), axis=1)[:, :k]
    overlap = [len(set(a) & set(b)) / k for a, b in zip(top_ref, top_fast)]
    return {"passages": len(texts), "questions": len(questions), f"recall@{k}": float(np.mean(overlap)),
            "top1_agreement": float(np.mean(top_ref[:, 0] == top_fast[:, 0])),
            "passage_cosine_min": float(np.min(np.sum(ref * fast, axis=1))),
            "passage_cosine_mean": float(np.mean(np.sum(ref * fast, axis=1)))}


def main(argv: list[str] | None = None) -> None:
    args = setup_arg_parser().parse_args(argv)
    encoders = {"torch": load_encoder(backend="torch"), FAST: load_encoder(backend=FAST)}
    for enc in encoders.values():
        enc.batch_size = args.batch_size
    info = {"machine": machine(), "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
            "encoders": {n: e.describe() for n, e in encoders.items()}, "batch_size": args.batch_size}
    print(f"speed: {args.chunks} vital-articles chunks, {args.reps} alternating runs per backend", flush=True)
    chunks = list(itertools.islice(iter_chunks([VITAL], ChunkParams()), args.chunks))
    info["speed"] = speed(encoders, chunks, args.reps)
    with open(args.data_file, encoding="utf-8") as f:
        questions = [json.loads(line)["question"] for line in itertools.islice(f, args.questions)]
    if args.reference:
        titles, texts, ref = reference_vectors(Path(args.reference), args.passages)
        info["reference"] = str(args.reference)
    else:
        sample = list(itertools.islice(iter_chunks([VITAL], ChunkParams()), args.passages))
        titles, texts, ref = [c.title for c in sample], [c.text for c in sample], None
    info["agreement"] = agreement(encoders, titles, texts, ref, questions)
    s, a = info["speed"], info["agreement"]
    print(f"torch {s['median_chunks_per_s']['torch']:.2f} chunks/s, {FAST} {s['median_chunks_per_s'][FAST]:.2f} "
          f"chunks/s: {s['speedup']:.2f}x; recall@5 {a['recall@5']:.4f} over {a['passages']} passages, "
          f"{a['questions']} questions (load avg {info['machine']['load_avg_1m']:.1f})")
    if args.output_dir:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
