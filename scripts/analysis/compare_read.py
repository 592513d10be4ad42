"""Two eval runs of the same questions that differ in what the Always branch reads (`--read
passages` against `--read sentences`, both with --reuse-records so the draft and the Never answer
are shared): Always accuracy each, the paired difference with a bootstrap 95% CI, the mean context
tokens read, and how often the context held an answer (hit@K of the passages; the selection's
read_hit where recorded).

    python scripts/analysis/compare_read.py runs/acc/passages/nq_open runs/acc/sentences/nq_open
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from targ_mlx.eval.metrics import bootstrap_ci
from targ_mlx.eval.run import read_jsonl


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base", help="the run that reads the top-K passages (its folder with records.jsonl)")
    p.add_argument("other", help="the run that reads the selected sentences")
    p.add_argument("--metric", default="acc")
    p.add_argument("--boot", type=int, default=1000)
    args = p.parse_args(argv)
    a = {r["id"]: r for r in read_jsonl(Path(args.base) / "records.jsonl")}
    b = {r["id"]: r for r in read_jsonl(Path(args.other) / "records.jsonl")}
    ids = [i for i in a if i in b]
    x = np.array([a[i]["always"][args.metric] for i in ids], float)
    y = np.array([b[i]["always"][args.metric] for i in ids], float)
    lo, hi = bootstrap_ci(y - x, args.boot)[1:] if len(ids) else (float("nan"), float("nan"))
    out = {"n": len(ids), "passages": 100 * x.mean(), "sentences": 100 * y.mean(),
           "diff": 100 * (y - x).mean(), "ci": [100 * lo, 100 * hi],
           "tokens": [float(np.mean([a[i]["always"]["tok_ctx"] for i in ids])),
                      float(np.mean([b[i]["always"]["tok_ctx"] for i in ids]))],
           "hit_passages": 100 * float(np.mean([a[i]["always"]["hit"] for i in ids])),
           "read_hit_sentences": 100 * float(np.mean([b[i]["always"].get("read_hit", np.nan) for i in ids])),
           "never": 100 * float(np.mean([a[i]["never"][args.metric] for i in ids]))}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
