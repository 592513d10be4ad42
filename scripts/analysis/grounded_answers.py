"""Is a read answer that the passages do not say worse than the closed-book one (issue 55)?

A cheap guard would keep the draft where the read answer is not in what was read, or where the
passages confirm the draft and not the read answer. On eval records, each question's Always
answer and closed-book (Never) answer are split by whether some sentence of the read passages
holds the answer's claim words (`reader.holders`: what the choice rule cites by) and whether the
two answers are the same; for each group the count and how many of each answer are right. No
model runs: the passages come from the index's passages.db by the recorded keys (whole passages:
the last one read may have been cut, so "held" is generous by at most that passage's tail).

    python scripts/analysis/grounded_answers.py --index index/large-bm25 results/*/large-hybrid/*
"""

from __future__ import annotations

import argparse
from pathlib import Path

from targ_mlx import reader
from targ_mlx.eval.record import passage_lookup
from targ_mlx.eval.run import read_jsonl
from targ_mlx.matching import normalize
from targ_mlx.retrieval import Passage


def groups(records, lookup) -> dict[tuple[bool, bool, bool], list[int]]:
    """{(read answer held, closed-book answer held, the two the same): [n, Always right, Never right]}."""
    out: dict[tuple[bool, bool, bool], list[int]] = {}
    for r in records:
        a, nv = r["always"], r["never"]
        rows = [lookup(p[0]) for p in a["passages"]]
        if not rows or any(x is None for x in rows):
            continue  # nothing read, or another index than the run's
        read = [Passage(p[0], t, x, 0.0) for p, (t, x) in zip(a["passages"], rows)]
        q = r["question"].strip()
        key = (bool(reader.holders(q, a["answer"], read)), bool(reader.holders(q, nv["answer"], read)),
               normalize(a["answer"]) == normalize(nv["answer"]))
        g = out.setdefault(key, [0, 0, 0])
        g[0] += 1
        g[1] += int(a["acc"])
        g[2] += int(nv["acc"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cells", nargs="+", type=Path, help="eval cell folders (records.jsonl)")
    ap.add_argument("--index", required=True, type=Path, help="an index holding the recorded passages")
    args = ap.parse_args()
    lookup = passage_lookup(args.index)
    for cell in args.cells:
        records = read_jsonl(cell / "records.jsonl")
        found = groups(records, lookup)
        print(f"{cell}: {sum(g[0] for g in found.values())} questions with passages read")
        for (held_read, held_draft, same), (n, a, nv) in sorted(found.items()):
            print(f"  read answer held {held_read!s:5}  closed-book held {held_draft!s:5}  same {same!s:5}: "
                  f"{n:4d} questions, read right {a:4d}, closed book right {nv:4d}")


if __name__ == "__main__":
    main()
