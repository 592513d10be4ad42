"""The reader (issue 55): each passage read on its own and the answer chosen by evidence, against
today's single prompt, on eval records of the same questions, drafts and searches.

Input: cells recorded with `--read each --each M` (records keep every reading's candidate) and,
for the same questions, cells recorded with `--read passages` (today's single prompt). Each
question's evidence (the search's top 20) is searched again over --index exactly as the eval
searched it, and every candidate's support is recomputed with today's `targ_mlx.reader`, so the
choice rule can be re-weighed without running the model.

The weights (`reader.Weights`) and m (passages read, 3 to M) are chosen on the dev halves of all
cells pooled (each cell's seeded split, as the eval's tables use) by accuracy; everything is
reported on the test halves: the choice, the first reading alone, a majority vote, the closed-book
answer, the oracle "any candidate right" (the ceiling of any choice rule), today's single prompt,
read-hit (a gold answer in what was read) and right-given-read-hit, and the share of read passages
repeating a title already read.

    python scripts/bench/bench_reader.py --index index/large-bm25 --retriever bm25 \
        --each runs/reader/qwen15b/each --single runs/reader/qwen15b/passages \
        --each runs/reader/smollm2-135m/each --single results/smollm2-135m/large-tantivy --json runs/reader/reader.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from targ_mlx import reader
from targ_mlx.eval.run import read_jsonl
from targ_mlx.eval.sweep import paired_ci, split, split_pool
from targ_mlx.matching import contains, normalize
from targ_mlx.retrieval import Passage

GRID = dict(rank=(0.0, 0.1, 0.25, 0.5, 1.0), likelihood=(0.0, 0.25, 0.5, 1.0), typed=(0.0, 0.25, 0.5, 1.0),
            votes=(0.0, 0.1, 0.25, 0.5))


def load(folder: Path) -> tuple[dict, list[dict]]:
    cfg_file = folder / "config.json"  # written when a cell finishes: a cell still running splits its rows so far
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    recs = read_jsonl(folder / "records.jsonl")
    return cfg, recs


def cells(root: Path) -> dict[str, Path]:
    return {p.parent.name: p.parent for p in sorted(root.glob("*/records.jsonl"))}


def evidence(retriever, questions: list[str]) -> list[list[Passage]]:
    return retriever.search_batch(questions, reader.SUPPORT_FROM)


def supported(q: str, cands: list[dict], found: list[Passage], m: int) -> list:
    """The distinct candidates of the first m readings and the closed-book one, with their
    evidence (`reader.supports`: computed once, scored under every weight tried)."""
    use = [c for c in cands if 0 <= c["source"] < m] + [c for c in cands if c["source"] < 0]
    return reader.supports(q, [reader.Candidate(c["text"], c["logprob"], c["source"]) for c in use], found)


def correct(cands: list[dict], text: str) -> float:
    return float(next(c["acc"] for c in cands if normalize(c["text"]) == normalize(text)))


def vote(cands: list[dict], m: int) -> dict:
    use = [c for c in cands if 0 <= c["source"] < m and c["text"]]
    if not use:
        return next(c for c in cands if c["source"] < 0)
    counts = Counter(normalize(c["text"]) for c in use)
    top = max(counts.values())
    return next(c for c in use if counts[normalize(c["text"])] == top)  # ties: the better-ranked reading


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--retriever", default=None)
    ap.add_argument("--each", required=True, type=Path, action="append",
                    help="folder of --read each cells (one per dataset); repeat for another model (dev halves pooled)")
    ap.add_argument("--single", type=Path, action="append", default=[],
                    help="folder of --read passages cells of the same questions, one per --each, in order")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    if args.retriever in (None, "bm25"):
        from bm25_only import BM25Only

        retriever = BM25Only(args.index)  # the eval's bm25 order; the evidence needs no cosine
    else:
        from targ_mlx.index import open_indexes

        retriever = open_indexes([args.index], retriever=args.retriever)
    data = {}
    for n, each in enumerate(args.each):
        single_root = args.single[n] if n < len(args.single) else None
        for name, folder in cells(each).items():
            cfg, recs = load(folder)
            recs = [r for r in recs if r["always"].get("candidates")]
            found = evidence(retriever, [r["question"].strip() for r in recs])
            single = {}
            if single_root and (single_root / name / "records.jsonl").is_file():
                single = {r["id"]: r for r in load(single_root / name)[1]}
            dev, test = split(len(recs), args.seed, pool=split_pool(cfg))
            label = f"{each}/{name}" if len(args.each) > 1 else name
            data[label] = dict(recs=recs, found=found, single=single, dev=set(dev.tolist()), test=set(test.tolist()))
            print(f"{label}: {len(recs)} records, dev {len(dev)}, test {len(test)}, single {len(single)}", file=sys.stderr)
    most = min(max(c["source"] for r in d["recs"] for c in r["always"]["candidates"]) + 1 for d in data.values())

    cache: dict = {}

    def acc(rows, m, w):
        out = []
        for r, f in rows:
            key = (id(r), m)  # the same question id recurs across models: key by the record itself
            if key not in cache:
                cache[key] = supported(r["question"].strip(), r["always"]["candidates"], f, m)
            out.append(correct(r["always"]["candidates"], reader.rank(cache[key], w)[0][0].text))
        return out

    def rows_of(part):
        return [(r, f) for d in data.values() for i, (r, f) in enumerate(zip(d["recs"], d["found"])) if i in d[part]]

    dev_rows = rows_of("dev")
    tried = []
    for m in range(min(3, most), most + 1):
        for rank, lik, typed, votes in itertools.product(*GRID.values()):
            w = reader.Weights(1.0, rank, lik, typed, votes)
            tried.append((float(np.mean(acc(dev_rows, m, w))), m, w))
    dev_acc, m, w = max(tried, key=lambda t: t[0])  # the first of the best (grid order)
    shipped_dev = float(np.mean(acc(dev_rows, reader.READ_EACH, reader.WEIGHTS)))
    print(f"chosen on dev ({len(dev_rows)} questions): m={m}, {w}, dev accuracy {dev_acc:.3f} "
          f"(shipped weights {shipped_dev:.3f}; {sum(t[0] >= dev_acc - 0.005 for t in tried)} of {len(tried)} "
          f"settings within 0.5 points of the best)", file=sys.stderr)
    shipped = reader.WEIGHTS

    out = {"chosen": {"m": m, "weights": w.__dict__, "dev_acc": dev_acc, "dev_n": len(dev_rows),
                      "shipped_dev_acc": shipped_dev, "near_best": sum(t[0] >= dev_acc - 0.005 for t in tried),
                      "tried": len(tried)}, "cells": {}}
    for name, d in data.items():
        rows = [(r, f) for i, (r, f) in enumerate(zip(d["recs"], d["found"])) if i in d["test"]]
        cell = {"n": len(rows)}
        for label, ww, mm in (("choice", w, m), ("choice_shipped", shipped, reader.READ_EACH)):
            cell[label] = acc(rows, mm, ww)
        cell["first"] = [float(next(c for c in r["always"]["candidates"] if c["source"] == 0)["acc"]) for r, _ in rows]
        cell["vote"] = [float(vote(r["always"]["candidates"], m)["acc"]) for r, _ in rows]
        cell["closed"] = [float(next(c for c in r["always"]["candidates"] if c["source"] < 0)["acc"]) for r, _ in rows]
        cell["oracle"] = [float(any(c["acc"] for c in r["always"]["candidates"] if c["source"] < m)) for r, _ in rows]
        hits = [any(c.get("hit") for c in r["always"]["candidates"] if 0 <= c["source"] < m) for r, _ in rows]
        cell["read_hit"] = float(np.mean(hits))
        cell["right_given_hit"] = float(np.mean([a for a, h in zip(cell["choice"], hits) if h])) if any(hits) else None
        if d["single"]:
            paired = [(r, d["single"][r["id"]]) for r, _ in rows if r["id"] in d["single"]]
            s_acc = [float(s["always"]["acc"]) for _, s in paired]
            c_acc = [a for (r, _), a in zip(rows, cell["choice"]) if r["id"] in d["single"]]
            s_hits = [bool(s["always"].get("read_hit", s["always"].get("hit"))) for _, s in paired]
            titles = [[p[1] for p in s["always"].get("read") or s["always"]["passages"]] for _, s in paired]
            cell["single"] = {"n": len(paired), "acc": float(np.mean(s_acc)),
                              "choice_minus_single": paired_ci(np.array(c_acc), np.array(s_acc)),
                              "read_hit": float(np.mean(s_hits)),
                              "right_given_hit": float(np.mean([a for a, h in zip(s_acc, s_hits) if h])) if any(s_hits) else None,
                              "duplicate_share": float(np.mean([1 - len(set(map(normalize, t))) / len(t) for t in titles if t]))}
        summary = {k: (float(np.mean(v)) if isinstance(v, list) else v) for k, v in cell.items()}
        summary["choice_minus_first"] = paired_ci(np.array(cell["choice"]), np.array(cell["first"]))
        out["cells"][name] = summary
        print(name, json.dumps(summary), file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
