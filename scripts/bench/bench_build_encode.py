"""Chunks a second as an index build encodes them: an index's own stored chunks (titles in
front), batches of 32, each variant in a fresh process, alternating, so that what the machine
does meanwhile falls on all alike. Variants are backend[:keep|:nokeep]: `nokeep` runs with
TARG_MLX_KEEP_BUFFERS=0 (glibc's allocator left as it is, `_blas.keep_freed_buffers`).

Why its own script: `bench_encoder.py` encodes the Vital leads (~130 tokens), whose largest
buffer stays under glibc's mmap threshold; the large corpus's chunks (~190-230 tokens) do not.

    python scripts/bench/bench_build_encode.py --index index/large-bm25 --chunks 512 --rounds 3 \
        --variants torch-bf16:keep,torch-bf16:nokeep,mlx-bf16:keep,mlx-bf16:nokeep
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time


def worker(index: str, backend: str, n: int, skip: int) -> None:
    from targ_mlx import bind_openblas

    bind_openblas()
    from targ_mlx.index.encoder import load_encoder

    with sqlite3.connect(f"{index}/passages.db") as db:
        rows = db.execute("SELECT title, text FROM passages WHERE rowid > ? LIMIT ?", (skip, n)).fetchall()
    enc = load_encoder(None, backend=backend)
    enc.encode_passages([r[0] for r in rows[:32]], [r[1] for r in rows[:32]])  # warm: first-call costs out
    t = time.perf_counter()
    for i in range(0, len(rows), 32):
        enc.encode_passages([r[0] for r in rows[i:i + 32]], [r[1] for r in rows[i:i + 32]])
    print(json.dumps({"chunks_per_s": len(rows) / (time.perf_counter() - t)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True, help="an index folder (its passages.db)")
    ap.add_argument("--chunks", type=int, default=512)
    ap.add_argument("--skip", type=int, default=100000, help="start after this rowid (past the Vital leads)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="torch-bf16:keep,torch-bf16:nokeep,mlx-bf16:keep,mlx-bf16:nokeep")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.index, a.worker, a.chunks, a.skip)
    got: dict[str, list[float]] = {v: [] for v in a.variants.split(",")}
    for r in range(a.rounds):
        for v in got:
            backend, _, keep = v.partition(":")
            env = dict(os.environ, TARG_MLX_KEEP_BUFFERS="0" if keep == "nokeep" else "1")
            out = subprocess.run([sys.executable, __file__, "--index", a.index, "--chunks", str(a.chunks), "--skip",
                                  str(a.skip), "--worker", backend], env=env, capture_output=True, text=True, check=True)
            got[v].append(json.loads(out.stdout.strip().splitlines()[-1])["chunks_per_s"])
            print(f"round {r} {v}: {got[v][-1]:.1f} chunks/s", flush=True)
    for v, xs in got.items():
        print(f"{v}: median {statistics.median(xs):.1f} chunks/s ({', '.join(f'{x:.1f}' for x in xs)})")


if __name__ == "__main__":
    main()
