"""Two eval runs of the same questions that differ in what the Always branch reads (`--read
passages` against `--read sentences`, BM25 against hybrid, with and without `--draft-route`; both
with --reuse-records so the draft and the Never answer are shared): Always accuracy each, the
paired difference with a bootstrap 95% CI, the mean context tokens read, how often the context
held an answer (hit@K of the passages; read_hit, an answer string in what was read as cut, where
recorded), and the same split by whether the closed-book draft (the Never answer) was right: a
change to the search that uses the draft must not pull wrong drafts' reading down.

    python scripts/analysis/compare_read.py runs/acc/passages/nq_open runs/acc/sentences/nq_open
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from targ_mlx.eval.metrics import bootstrap_ci
from targ_mlx.eval.run import read_jsonl


def paired(a: dict, b: dict, ids: list[str], metric: str, boot: int) -> dict:
    """Always `metric` of both runs on `ids` (%), and b − a with its 95% CI."""
    x = np.array([a[i]["always"][metric] for i in ids], float)
    y = np.array([b[i]["always"][metric] for i in ids], float)
    lo, hi = bootstrap_ci(y - x, boot)[1:] if len(ids) else (float("nan"), float("nan"))
    mean = lambda v: round(100 * float(np.mean(v)), 2) if len(v) else float("nan")  # noqa: E731
    return {"n": len(ids), "base": mean(x), "other": mean(y), "diff": mean(y - x),
            "ci": [round(100 * lo, 2), round(100 * hi, 2)]}


def read_hit(run: dict, ids: list[str]) -> float | None:
    """% of `ids` whose read context held an answer string; None where a record predates the field."""
    vals = [run[i]["always"]["read_hit"] for i in ids if "read_hit" in run[i]["always"]]
    return round(100 * float(np.mean(vals)), 2) if len(vals) == len(ids) and ids else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base", help="one run (its folder with records.jsonl)")
    p.add_argument("other", help="the run that reads otherwise, compared against it")
    p.add_argument("--metric", default="acc")
    p.add_argument("--boot", type=int, default=1000)
    args = p.parse_args(argv)
    a = {r["id"]: r for r in read_jsonl(Path(args.base) / "records.jsonl")}
    b = {r["id"]: r for r in read_jsonl(Path(args.other) / "records.jsonl")}
    ids = [i for i in a if i in b]
    out = paired(a, b, ids, args.metric, args.boot) | {
        "tokens": [float(np.mean([r[i]["always"]["tok_ctx"] for i in ids])) for r in (a, b)],
        "hit": [round(100 * float(np.mean([r[i]["always"]["hit"] for i in ids])), 2) for r in (a, b)],
        "read_hit": [read_hit(a, ids), read_hit(b, ids)],
        "never": round(100 * float(np.mean([a[i]["never"][args.metric] for i in ids])), 2)}
    right = [i for i in ids if a[i]["never"][args.metric]]
    wrong = [i for i in ids if not a[i]["never"][args.metric]]
    out["by_draft"] = {"right": paired(a, b, right, args.metric, args.boot) | {"read_hit": [read_hit(a, right), read_hit(b, right)]},
                       "wrong": paired(a, b, wrong, args.metric, args.boot) | {"read_hit": [read_hit(a, wrong), read_hit(b, wrong)]}}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
