"""The lexical index at Wikipedia scale: build time, peak memory, size and query latency at N chunks.

The N chunks are made on the fly from the two real Wikipedia slices in ../shared/data/corpus
(sentences of real articles recombined, in runs of up to three consecutive sentences, into ~1,000-
character chunks under real titles), so term statistics stay Wikipedia's; nothing is stored but a
sentence pool cut once from the slices (--pool). A child process writes the chunks into a pipe and
this process builds from it with the product's own `build_lexical`, so the peak RSS reported is the
build's alone (the generator's sentence pool is not in it). The build resumes like any index
build: run the same command again after a kill and it goes on after the last committed chunk.
Searches are the eval's real questions (NQ-Open, TriviaQA, PopQA; --questions of each), top 20.

    python scripts/bench/bench_scale.py --chunks 3000000 --json runs/scale/3m.json
    python scripts/bench/bench_scale.py --chunks 20000000 --json runs/scale/20m.json   # hours; resumes

Output JSON: chunks, build_s, peak_rss_gb, disk_gb, open_s, query_p50_ms, query_p95_ms, and
rss_anon_gb / rss_anon_added_gb / rss_file_gb (a fresh process with the index open and searched:
its own memory, what opening and searching added to it, and the index pages it has mapped, which
the kernel drops under pressure), the engine, machine, CPU flags, date, and whether the build resumed.
"""

from __future__ import annotations

import argparse
import json
import lzma
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
SLICES = [DATA / "corpus" / "enwiki_2025_early.jsonl.xz", DATA / "corpus" / "simplewiki_2021.jsonl.xz"]
QA = {"nq_open": DATA / "qa" / "nq_open_dev.jsonl", "triviaqa": DATA / "qa" / "triviaqa_dev.jsonl",
      "popqa": DATA / "qa" / "popqa_1k.jsonl"}
BLOCK = 4096  # chunks drawn from one seeded generator: chunk i is the same on every run
TARGET, RUN = 1000, 3  # characters a chunk reaches; consecutive sentences taken at a time
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def build_pool(pool: Path) -> None:
    """sentences.bin (UTF-8, one after another), offsets.npy and titles.txt from both slices."""
    pool.mkdir(parents=True, exist_ok=True)
    offsets, titles, size = [0], [], 0
    with open(pool / "sentences.tmp", "wb") as out:
        for path in SLICES:
            with lzma.open(path, "rt", encoding="utf-8") as f:
                for line in f:
                    art = json.loads(line)
                    titles.append(art["title"].replace("\t", " ").replace("\n", " "))
                    for para in art["text"].split("\n"):
                        for s in _SENTENCE.split(para):
                            b = s.strip().replace("\t", " ").encode()
                            if 40 <= len(b) <= 400:
                                out.write(b + b" ")
                                size += len(b) + 1
                                offsets.append(size)
    np.save(pool / "offsets.npy", np.asarray(offsets, dtype=np.int64))
    (pool / "titles.txt").write_text("\n".join(titles), encoding="utf-8")
    (pool / "sentences.tmp").rename(pool / "sentences.bin")


def generate(pool: Path, chunks: int, after: int, seed: int) -> None:
    """Write chunks after+1 .. chunks-1 to stdout as `key<TAB>title<TAB>text` lines."""
    text = np.memmap(pool / "sentences.bin", dtype=np.uint8, mode="r")
    offsets = np.load(pool / "offsets.npy", mmap_mode="r")
    titles = (pool / "titles.txt").read_text(encoding="utf-8").split("\n")
    n = len(offsets) - 1
    out = sys.stdout.buffer
    first = after + 1
    for block in range(first // BLOCK, -(-chunks // BLOCK)):
        rng = np.random.default_rng([seed, block])
        title_of = rng.integers(0, len(titles), BLOCK)
        starts = rng.integers(0, n - RUN, (BLOCK, 12))
        lines = []
        for j in range(BLOCK):
            key = block * BLOCK + j
            if key < first or key >= chunks:
                continue
            parts, length = [], 0
            for s in starts[j]:
                lo, hi = int(offsets[s]), int(offsets[s + RUN])
                parts.append(bytes(text[lo:hi]))
                length += hi - lo
                if length >= TARGET:
                    break
            lines.append(b"%d\t%s\t%s\n" % (key, titles[title_of[j]].encode(), b"".join(parts).strip()))
        out.write(b"".join(lines))
    out.flush()


def synthetic_rows(pool: Path, chunks: int, seed: int):
    """A `RowSource` over the generator child: rows(after) streams chunks after that key."""

    def rows(after: int | None = None):
        cmd = [sys.executable, __file__, "--generate", "--pool", str(pool), "--chunks", str(chunks),
               "--after", str(-1 if after is None else after), "--seed", str(seed)]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, bufsize=1 << 20) as child:
            for line in child.stdout:
                key, title, text = line.decode("utf-8", "replace").rstrip("\n").split("\t", 2)
                yield int(key), title, text
        if child.returncode:
            raise RuntimeError(f"the chunk generator stopped with exit code {child.returncode}")

    return rows


def questions(per_set: int) -> list[str]:
    from targ_mlx.eval.datasets import read_jsonl, sample

    return [it.question for path in QA.values() for it in sample(read_jsonl(path), per_set, 0)]


def folder_gb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e9


def cpu_flags() -> str:
    return subprocess.run("grep -o 'avx512[a-z_]*\\|avx2\\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\\n' ' '",
                          shell=True, capture_output=True, text=True).stdout.strip()


def measure(args) -> dict:
    from targ_mlx.index.lexical import build_lexical, lexical_dir

    index = Path(args.work) / f"{args.engine}-{args.chunks}"
    out = lexical_dir(index)
    rows = synthetic_rows(Path(args.pool), args.chunks, args.seed)
    source = {"synthetic": {"chunks": args.chunks, "seed": args.seed, "pool_bytes": (Path(args.pool) / "sentences.bin").stat().st_size}}
    t0 = time.perf_counter()
    built = out.is_dir() and (out / "lexical.json").is_file()
    if built:
        meta = json.loads((out / "lexical.json").read_text())  # built by an earlier run: measure it
    elif args.engine == "tantivy":
        meta = build_lexical(rows, out, source, progress=lambda n: print(f"{n:,} chunks", file=sys.stderr, flush=True))
    else:
        from targ_mlx.index.lexical_bm25s import build_bm25s

        meta = build_bm25s(rows(None), out)
    build_s = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB -> GB (approximately)
    # opened and searched in a fresh process, as the chat opens it: its own RSS, not the build's
    run = subprocess.run([sys.executable, __file__, "--search", str(index), "--chunks", str(args.chunks),
                          "--questions", str(args.questions)], capture_output=True, text=True, check=True)
    return {
        "chunks": args.chunks, "engine": args.engine,
        # an index built by an earlier run: its build's own time, and no peak of this process
        "build_s": meta.get("build_s") if built else round(build_s, 1), "peak_rss_gb": None if built else round(peak, 3),
        "disk_gb": round(folder_gb(out), 3), **json.loads(run.stdout),
        "resumed_at": meta.get("resumed_at", 0), "index_build_s": meta.get("build_s"),
        "machine": platform.processor() or platform.machine(), "cpu_flags": cpu_flags(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python scripts/bench/bench_scale.py " + " ".join(sys.argv[1:]),
    }


def rss_gb() -> dict:
    """The process's resident memory: anonymous (its own heap) and file-backed (mapped index pages,
    which the kernel can drop and read again), in GB."""
    kb = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
          if k in ("RssAnon", "RssFile")}
    return {"anon": kb["RssAnon"] * 1024 / 1e9, "file": kb["RssFile"] * 1024 / 1e9}


def search(index: Path, per_set: int) -> dict:
    """(in a fresh process) Open the index, search the questions one at a time, top 20."""
    from targ_mlx.index.lexical import open_lexical

    qs = questions(per_set)
    before = rss_gb()
    t0 = time.perf_counter()
    lex = open_lexical(index)
    open_s = time.perf_counter() - t0
    lex.search(qs[:20], 20)  # first touches of the mapped files, not counted
    ms = []
    for q in qs:
        t0 = time.perf_counter()
        lex.search([q], 20)
        ms.append(1000 * (time.perf_counter() - t0))
    after = rss_gb()
    return {"open_s": round(open_s, 3), "query_p50_ms": round(float(np.percentile(ms, 50)), 2),
            "query_p95_ms": round(float(np.percentile(ms, 95)), 2), "queries": len(qs),
            "rss_anon_gb": round(after["anon"], 3), "rss_anon_added_gb": round(after["anon"] - before["anon"], 3),
            "rss_file_gb": round(after["file"], 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunks", type=int, required=True)
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--engine", choices=("tantivy", "bm25s"), default="tantivy",
                   help="bm25s: the engine indexes were built with before (holds every token in memory)")
    p.add_argument("--work", default="runs/scale", help="where the index is built (kept: a rerun measures it)")
    p.add_argument("--pool", default="runs/scale/pool", help="the sentence pool cut from the slices (made once)")
    p.add_argument("--questions", type=int, default=500, help="questions of each QA set searched")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the built index (default: deleted after measuring)")
    p.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)  # the child's side
    p.add_argument("--after", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--search", help=argparse.SUPPRESS)  # the fresh process that opens and searches
    args = p.parse_args(argv)
    if args.search:
        print(json.dumps(search(Path(args.search), args.questions)))
        return 0
    if args.generate:
        generate(Path(args.pool), args.chunks, args.after, args.seed)
        return 0
    if not (Path(args.pool) / "sentences.bin").is_file():
        print("cutting the sentence pool from the two slices (once)", file=sys.stderr, flush=True)
        build_pool(Path(args.pool))
    res = measure(args)
    print(json.dumps(res, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    if not args.keep:
        shutil.rmtree(Path(args.work) / f"{args.engine}-{args.chunks}", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
