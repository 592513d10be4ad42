"""Local Ray build vs single-process build of the same corpus, side by side in one run, and the
full-English-Wikipedia sizing derived from the measured rates (BENCHMARKS.md, row "Ray build").

    python scripts/bench/bench_ray.py --corpus ../shared/data/corpus/wiki_pool.jsonl --limit 1500

Each build runs as its own `python -m targ_mlx.index build` process (a fresh interpreter, so
neither inherits the other's torch threads or Ray), into a fresh folder; the order alternates
over `--rounds` so drift in a shared machine's load falls on both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
WIKI_CHUNKS = 30_000_000  # ~7M English articles at 1,000-character chunks (index/README.md)


def _build(corpus: str, out: Path, limit: int, ray: bool, workers: int, shard_size: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out.with_name(out.name + ".partial"), ignore_errors=True)
    cmd = [sys.executable, "-m", "targ_mlx.index", "build", "--corpus", corpus, "--out", str(out),
           "--limit", str(limit), "--quiet"]
    if ray:
        cmd += ["--ray", "--workers", str(workers), "--shard-size", str(shard_size)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"build failed: {' '.join(cmd)}\n{done.stderr[-2000:]}")
    m = json.loads((out / "manifest.json").read_text())
    n = m["counts"]["passages"]
    return {"wall_s": round(wall, 2), "passages": n, "passages_per_s": round(n / wall, 2),
            "encode_s": m["timing"]["encode_s"], "index_s": m["timing"]["index_s"],
            "shards": m["counts"].get("shards", 1), "bytes": sum(f["bytes"] for f in m["files"].values())}


def sizing(per_worker_rate: float, bytes_per_vector: dict, passage_bytes: float) -> dict:
    """Full English Wikipedia from measured per-chunk sizes and the per-worker encode rate."""
    return {
        "chunks": WIKI_CHUNKS,
        "vectors_gb": {d: round(WIKI_CHUNKS * b / 1e9, 1) for d, b in bytes_per_vector.items()},
        "passages_gb": round(WIKI_CHUNKS * passage_bytes / 1e9, 1),
        "encode_days_per_worker": round(WIKI_CHUNKS / per_worker_rate / 86400, 1),
        "encode_hours_on": {n: round(WIKI_CHUNKS / per_worker_rate / n / 3600, 1) for n in (16, 64, 256)},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=str(DATA / "corpus" / "wiki_pool.jsonl"))
    p.add_argument("--limit", type=int, default=1500, help="articles read (default: 1500)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="Ray encoder actors, 1 CPU each")
    p.add_argument("--shard-size", type=int, default=500)
    p.add_argument("--rounds", type=int, default=1, help="pairs of builds; the order alternates")
    p.add_argument("--work", type=Path, default=Path("/tmp/bench-ray"))
    p.add_argument("--output", type=Path, default=REPO / "runs" / "bench_ray.json")
    args = p.parse_args(argv)

    runs: dict[str, list[dict]] = {"single": [], "ray": []}
    for r in range(args.rounds):
        order = ["single", "ray"] if r % 2 == 0 else ["ray", "single"]
        for kind in order:
            res = _build(args.corpus, args.work / kind, args.limit, kind == "ray", args.workers, args.shard_size)
            runs[kind].append(res)
            print(kind, res, flush=True)
    best = {k: max(v, key=lambda x: x["passages_per_s"]) for k, v in runs.items()}
    ratio = best["ray"]["passages_per_s"] / best["single"]["passages_per_s"]
    n = best["single"]["passages"]
    # worker-seconds of encoding per chunk, from the Ray run (each actor holds one CPU)
    per_worker = n / best["ray"]["encode_s"]
    vectors_bytes = (args.work / "single" / "vectors.usearch").stat().st_size / n
    passages_bytes = (args.work / "single" / "passages.db").stat().st_size / n
    # f16 file per vector measured here; i8 and f32 change only the vector payload (384 B, 1536 B)
    per_dtype = {"f16": vectors_bytes, "i8": vectors_bytes - 384, "f32": vectors_bytes + 768}
    result = {
        "command": "python scripts/bench/bench_ray.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs",
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "corpus": args.corpus, "limit": args.limit, "workers": args.workers,
        "runs": runs, "ray_vs_single_passages_per_s": round(ratio, 3),
        "per_worker_passages_per_s": round(per_worker, 2),
        "bytes_per_chunk": {"vectors_f16": round(vectors_bytes, 1), "passages": round(passages_bytes, 1)},
        "sizing": sizing(per_worker, per_dtype, passages_bytes),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("ray_vs_single_passages_per_s", "per_worker_passages_per_s",
                                             "bytes_per_chunk", "sizing")}, indent=2))


if __name__ == "__main__":
    main()
