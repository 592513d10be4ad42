"""Encoder speed and agreement: the float32 backends (mlx, torch) and the int8 ONNX one, side by side.

Speed: the same real ~1,000-character chunks (the first N of the default vital-articles corpus,
titles in front, as builds encode them; or, with `--index`, an index's own stored chunks past
rowid `--skip`) are encoded by each variant in its own fresh process, `--reps` times, alternating
variants so that load from other processes falls on all alike; chunks/s per run, the median and
the ratio to `torch` are reported. Variants:

  mlx          the mlx backend, in a process with OpenBLAS bound for MLX (as every entry point is)
  mlx-bf16     the mlx backend with its products in bfloat16 on the kernels (AVX512-BF16)
  torch        sentence-transformers in a process of its own, nothing else loaded (its best case)
  torch-bound  torch in a process where OpenBLAS is bound for MLX, as inside `targ ask` and the app
  torch-bf16   torch with bfloat16 matrix products (autocast), bound as index builds are
  onnx-int8    the int8 ONNX backend
  V:nokeep     any of these with TARG_MLX_KEEP_BUFFERS=0 (glibc's allocator left as it is,
               `_blas.keep_freed_buffers`). It matters on the large corpus's chunks (~190-230
               tokens), whose largest buffer passes glibc's mmap threshold; the Vital leads'
               (~130 tokens) do not.

Agreement: recall@5 of each other backend's top 5 against float32 torch's top 5 for NQ-Open dev
questions over the first `--passages` chunks of the same corpus, exact (brute-force) search, so
only the encoders differ; also with float32 queries over each backend's passage vectors (an index
it built, searched by the default float32 encoder).

    python scripts/bench/bench_encoder.py --chunks 256 --reps 3 --variants mlx,torch,torch-bound --passages 3000 \
        --questions 1000 --output-dir runs/bench_encoder_mlx
    # an index build's encoding, freed buffers kept or not
    python scripts/bench/bench_encoder.py --index index/large-bm25 --chunks 512 --reps 3 --passages 0 \
        --variants torch-bf16,torch-bf16:nokeep,mlx-bf16,mlx-bf16:nokeep
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

NQ_DEV = Path(__file__).resolve().parents[3] / "shared" / "data" / "qa" / "nq_open_dev.jsonl"
VARIANTS = ("mlx", "mlx-bf16", "torch", "torch-bound", "torch-bf16", "onnx-int8")


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", type=int, default=256, help="chunks encoded per speed run (default 256)")
    p.add_argument("--reps", type=int, default=3, help="speed runs per variant, alternating (default 3)")
    p.add_argument("--batch-size", type=int, default=32, help="encoder batch size (default 32)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, of {', '.join(VARIANTS)}, each optionally with :nokeep")
    p.add_argument("--index", help="time an index's stored chunks (its passages.db) instead of the Vital leads")
    p.add_argument("--skip", type=int, default=100000,
                   help="with --index: start after this rowid (past the Vital leads)")
    p.add_argument("--passages", type=int, default=2000, help="passages searched for agreement (default 2000; 0: skip)")
    p.add_argument("--questions", type=int, default=1000, help="NQ-Open dev questions (default 1000)")
    p.add_argument("--data-file", default=str(NQ_DEV), help=f"questions JSONL (default {NQ_DEV})")
    p.add_argument("--output-dir", help="write results.json here")
    p.add_argument("--speed-worker", help=argparse.SUPPRESS)
    return p


def machine() -> dict:
    flags = sorted(set(re.findall(r"\b(avx512[a-z0-9_]*|amx[a-z0-9_]*|avx2|fma|avx_vnni)\b", Path("/proc/cpuinfo").read_text())))
    model = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
    return {"cpu": model.group(1) if model else platform.processor(), "cores": os.cpu_count(), "flags": flags,
            "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def chunks(n: int, index: str | None = None, skip: int = 0) -> tuple[list[str], list[str]]:
    """Titles and texts of n chunks: the Vital leads as a build cuts them, or an index's stored ones."""
    if index:
        import sqlite3

        with sqlite3.connect(f"file:{Path(index) / 'passages.db'}?mode=ro", uri=True) as db:  # a bench never writes it
            rows = db.execute("SELECT title, text FROM passages WHERE rowid > ? LIMIT ?", (skip, n)).fetchall()
        return [r[0] for r in rows], [r[1] for r in rows]
    from targ_mlx.index.build import iter_chunks
    from targ_mlx.index.chunking import ChunkParams
    from targ_mlx.index.corpus import VITAL

    cs = list(itertools.islice(iter_chunks([VITAL], ChunkParams()), n))
    return [c.title for c in cs], [c.text for c in cs]


def speed_worker(variant: str, n: int, batch_size: int, index: str | None, skip: int) -> None:
    """One timed run in this fresh process; prints {"chunks_per_s": ...}."""
    backend = variant.partition(":")[0]
    if backend != "torch":
        from targ_mlx._blas import bind_openblas

        bind_openblas()
    from targ_mlx.index.encoder import load_encoder

    t0 = time.perf_counter()
    enc = load_encoder(backend="torch" if backend == "torch-bound" else backend)
    load_s = time.perf_counter() - t0
    titles, texts = chunks(n, index, skip)
    n = len(titles)
    # warm-up: a full batch's first-call allocations, thread pools
    enc.encode_passages(titles[:batch_size], texts[:batch_size], batch_size)
    t0 = time.perf_counter()
    enc.encode_passages(titles, texts, batch_size)
    print(json.dumps({"chunks_per_s": n / (time.perf_counter() - t0), "load_s": load_s}))


def speed(variants: list[str], n: int, reps: int, batch_size: int, index: str | None = None, skip: int = 0) -> dict:
    runs: dict[str, list[float]] = {v: [] for v in variants}
    loads: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(reps):
        for v in variants:
            cmd = [sys.executable, __file__, "--speed-worker", v, "--chunks", str(n), "--batch-size", str(batch_size),
                   "--skip", str(skip), *(["--index", index] if index else [])]
            env = dict(os.environ, TARG_MLX_KEEP_BUFFERS="0" if v.endswith(":nokeep") else "1")
            run = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
            out = run.stdout.strip().splitlines()[-1]
            r = json.loads(out)
            runs[v].append(r["chunks_per_s"])
            loads[v].append(r["load_s"])
            print(f"  rep {rep + 1} {v:12} {r['chunks_per_s']:7.2f} chunks/s (load {r['load_s']:.2f} s)", flush=True)
    med = {v: statistics.median(r) for v, r in runs.items()}
    base = med.get("torch")
    return {"chunks": n, "runs_chunks_per_s": runs, "load_s": loads, "median_chunks_per_s": med,
            "ratio_to_torch": {v: m / base for v, m in med.items()} if base else None}


def agreement_with(top_ref: np.ndarray, queries: np.ndarray, vecs: np.ndarray, ref: np.ndarray, k: int = 5) -> dict:
    """recall@k and top-1 agreement of exact search over `vecs` against the reference top k, and
    the least cosine between a passage's vector and its reference vector."""
    top = np.argsort(-(queries @ vecs.T), axis=1)[:, :k]
    return {f"recall@{k}": float(np.mean([len(set(a) & set(c)) / k for a, c in zip(top_ref, top)])),
            "top1_agreement": float(np.mean(top_ref[:, 0] == top[:, 0])),
            "passage_cosine_min": float(np.sum(ref * vecs, axis=1).min())}


def agreement(backends: list[str], n: int, questions: list[str], k: int = 5) -> dict:
    from targ_mlx._blas import bind_openblas

    bind_openblas()
    from targ_mlx.index.encoder import load_encoder

    titles, texts = chunks(n)
    ref_enc = load_encoder(backend="torch")
    ref = ref_enc.encode_passages(titles, texts)
    ref_queries = ref_enc.encode_queries(questions)
    top_ref = np.argsort(-(ref_queries @ ref.T), axis=1)[:, :k]
    out = {}
    for b in backends:
        enc = load_encoder(backend=b)
        vecs = enc.encode_passages(titles, texts)
        out[b] = {"passages": n, "questions": len(questions),
                  **agreement_with(top_ref, enc.encode_queries(questions), vecs, ref, k),
                  "max_abs_diff": float(np.abs(ref - vecs).max()),
                  f"recall@{k}_float32_queries": agreement_with(top_ref, ref_queries, vecs, ref, k)[f"recall@{k}"]}
        print(f"  {b:10} recall@{k} {out[b][f'recall@{k}']:.4f} (float32 queries "
              f"{out[b][f'recall@{k}_float32_queries']:.4f}), top-1 {out[b]['top1_agreement']:.3f}, "
              f"cosine min {out[b]['passage_cosine_min']:.6f}, max |diff| {out[b]['max_abs_diff']:.2e}", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    args = setup_arg_parser().parse_args(argv)
    if args.speed_worker:
        return speed_worker(args.speed_worker, args.chunks, args.batch_size, args.index, args.skip)
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v.partition(":")[0] not in VARIANTS or v.partition(":")[2] not in ("", "nokeep")]
    if bad:
        raise SystemExit(f"--variants: {', '.join(bad)} unknown; "
                         f"use {', '.join(VARIANTS)}, each optionally with :nokeep")
    info = {"machine": machine(), "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
            "batch_size": args.batch_size}
    source = f"{args.index} chunks past rowid {args.skip}" if args.index else "vital-articles chunks"
    print(f"speed: {args.chunks} {source}, {args.reps} alternating runs per variant", flush=True)
    info["speed"] = speed(variants, args.chunks, args.reps, args.batch_size, args.index, args.skip)
    if args.passages:
        with open(args.data_file, encoding="utf-8") as f:
            questions = [json.loads(line)["question"] for line in itertools.islice(f, args.questions)]
        print(f"agreement with float32 torch: {args.passages} passages, {len(questions)} questions", flush=True)
        others = sorted({v.partition(":")[0] for v in variants} - {"torch", "torch-bound"})
        info["agreement"] = agreement(others, args.passages, questions)
    print(json.dumps(info["speed"]["median_chunks_per_s"]), json.dumps(info["speed"]["ratio_to_torch"]))
    if args.output_dir:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
