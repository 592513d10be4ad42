"""Does an index built here find what a committed cell's index found? For each record's Always
passages (their keys, in the order read), the same question searched over `--index` now: how many
read lists come back identical, and how many lead with the same passage. An HNSW graph built on
another machine (or in another order) differs a little, so pair reader arms only against cells
recorded over the same index files.

    python scripts/analysis/same_search.py --index index/large-hybrid --retriever hybrid \
        results/qwen2.5-coder-1.5b/large-hybrid/{nq_open,triviaqa,popqa}
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from targ_mlx import bind_openblas

bind_openblas()  # before anything loads mlx.core
from targ_mlx.eval.run import read_jsonl  # noqa: E402
from targ_mlx.index import load_encoders, open_indexes  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cells", nargs="+", help="eval output folders (records.jsonl)")
    ap.add_argument("--index", required=True)
    ap.add_argument("--retriever", default="hybrid")
    ap.add_argument("--n", type=int, default=40, help="records a cell (default 40)")
    a = ap.parse_args(argv)
    r = load_encoders(open_indexes([a.index], retriever=a.retriever))
    for cell in a.cells:
        same = first = n = 0
        for rec in itertools.islice(read_jsonl(Path(cell) / "records.jsonl"), a.n):
            want = [p[0] for p in rec["always"]["passages"]]
            got = [p.key for p in r.search(rec["question"], k=20)][: len(want)]
            n, same, first = n + 1, same + (got == want), first + (got[:1] == want[:1])
        print(f"{cell}: {same}/{n} read lists identical, {first}/{n} lead with the same passage")


if __name__ == "__main__":
    main()
