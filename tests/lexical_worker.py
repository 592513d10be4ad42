"""A BM25 build in a process of its own, for tests/test_index_lexical_scale.py to cap or kill -9:

    python tests/lexical_worker.py ENGINE OUT N [--cap-mb MB] [--heap-mb MB] [--commit-every K]

Builds the lexical part (`tantivy`, the product's, or `bm25s`, the engine before it) of N chunks
into folder OUT. The chunks are real sentences of the first articles of the Simple English
Wikipedia slice, recombined (chunk i is the same on every run), so a test needs no corpus file
beyond a few hundred articles. --cap-mb limits the process's data memory (RLIMIT_DATA: what
malloc and anonymous maps may hold), as a machine with that much free memory would. Prints one
line per commit ("committed N") and, at the end, a JSON line with the build's peak RSS.
"""

from __future__ import annotations

import argparse
import itertools
import json
import lzma
import random
import re
import resource
import sys
from pathlib import Path

SIMPLEWIKI = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus" / "simplewiki_2021.jsonl.xz"
ARTICLES = 400


def sentences() -> list[str]:
    with lzma.open(SIMPLEWIKI, "rt", encoding="utf-8") as f:
        arts = [json.loads(line) for line in itertools.islice(f, ARTICLES)]
    out = [s.strip() for a in arts for s in re.split(r"(?<=[.!?])\s+", a["text"].replace("\n", " ")) if len(s) > 30]
    return out


def chunk_rows(n: int):
    """A `RowSource`: rows(after) yields chunks after that key (keys 0..n-1)."""
    pool = sentences()

    def rows(after=None):
        for key in range(0 if after is None else after + 1, n):
            rng = random.Random(key)
            yield key, f"Chunk {rng.choice(pool)[:30]}", " ".join(rng.choice(pool) for _ in range(8))

    return rows


def _data_bytes() -> int:
    """The process's data memory now (VmData: what RLIMIT_DATA counts)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("engine", choices=("tantivy", "bm25s"))
    p.add_argument("out")
    p.add_argument("n", type=int)
    p.add_argument("--cap-mb", type=int)
    p.add_argument("--heap-mb", type=int)
    p.add_argument("--commit-every", type=int)
    args = p.parse_args()
    rows = chunk_rows(args.n)
    from targ_mlx.index import lexical_tantivy
    from targ_mlx.index.lexical import build_lexical
    from targ_mlx.index.lexical_bm25s import _bm25s, build_bm25s

    _bm25s()  # both engines imported before the cap: it bounds the build alone
    if args.cap_mb:
        cap = _data_bytes() + args.cap_mb * 1_000_000
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    if args.engine == "tantivy":
        if args.heap_mb:
            lexical_tantivy.HEAP = args.heap_mb * 1_000_000
        if args.commit_every:
            lexical_tantivy.COMMIT_EVERY = args.commit_every
        meta = build_lexical(rows, Path(args.out), {"chunks": args.n},
                             progress=lambda done: print(f"committed {done}", flush=True))
    else:
        meta = build_bm25s(rows(None), Path(args.out))
    print(json.dumps({"passages": meta["passages"], "resumed_at": meta.get("resumed_at", 0),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1000}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
