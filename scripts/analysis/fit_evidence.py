"""Fit the evidence gate's two calibrations per model from eval records (dev halves only).

For each model, over the dev half (`sweep.split(n, 0)`, the split every report judges on the
other half) of each given run folder's datasets:

    P(Always right | top-1 similarity)   increasing isotonic fit
    P(Never right  | U_mar at k)         decreasing isotonic fit, over every question ("memory"), and
                                         apart for the questions whose packed context says what the
                                         k-token draft says (pipeline.confirms) and the others ("memory_confirmed",
                                         "memory_unconfirmed"; only where each has MIN_SPLIT rows)

and a "default" entry pooled over every model, for models with no fit of their own. Writes
`targ_mlx/gates/evidence_calibration.json`:

    python scripts/analysis/fit_evidence.py \
        --run smollm2-135m results/smollm2-135m/clean results/smollm2-135m/seeded \
        --run qwen2.5-coder-1.5b results/qwen2.5-coder-1.5b/clean results/qwen2.5-coder-1.5b/seeded
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from targ_mlx.calibration import budget_threshold
from targ_mlx.defaults import DEFAULT_BETA, DEFAULT_K
from targ_mlx.eval.run import read_jsonl
from targ_mlx.eval.sweep import split, split_pool
from targ_mlx.gates import margin_score
from targ_mlx.gates.evidence import MIN_SPLIT

OUT = Path(__file__).resolve().parents[2] / "targ_mlx" / "gates" / "evidence_calibration.json"
DATASETS = ("nq_open", "popqa", "triviaqa")  # MuSiQue: every method at <= 0.4%, nothing to fit
METRIC = "acc"  # a gold answer contained: the metric every model's headline compares on
SHIP_RATE = 0.3  # the shipped tau: this share of dev questions would read


def dev_rows(folders: list[Path], k: int, beta: float) -> dict[str, np.ndarray]:
    s1, umar, a, n, conf, where = [], [], [], [], [], []
    for folder in folders:
        for name in DATASETS:
            path = folder / name / "records.jsonl"
            if not path.exists():
                continue
            recs = read_jsonl(path)
            dev, _ = split(len(recs), 0, pool=split_pool(json.loads((path.parent / "config.json").read_text())))
            for i in dev:
                r = recs[i]
                ps = r["always"].get("passages") or []
                s1.append(max((p[2] for p in ps), default=0.0))
                umar.append(margin_score(r["gaps"][:k], beta))
                a.append(r["always"][METRIC])
                n.append(r["never"][METRIC])
                c = r["always"].get("confirms")
                if c is None:
                    raise SystemExit(f"fit_evidence: {path} has records without always.confirms; "
                                     "run scripts/analysis/rescore_records.py on it first")
                conf.append(int(c[str(k)]))
            where.append(f"{path.parent} (dev half, {len(dev)})")
    if not s1:
        raise SystemExit(f"fit_evidence: no records.jsonl under {', '.join(map(str, folders))}/{{{','.join(DATASETS)}}}")
    return {"s1": np.array(s1), "umar": np.array(umar), "always": np.array(a), "never": np.array(n),
            "confirmed": np.array(conf, bool), "where": where}


def fit(rows: dict) -> dict:
    from targ_mlx.gates.evidence import evidence_score, fit_calibration, interp, memory_fit

    out = fit_calibration(rows["s1"], rows["umar"], rows["always"], rows["never"], rows["confirmed"], digits=6)
    c = rows["confirmed"]
    u = []
    for s, m, ci in zip(rows["s1"], rows["umar"], c):
        mem = memory_fit(out, bool(ci))
        u.append(evidence_score(interp(out["read"]["x"], out["read"]["y"], s), interp(mem["x"], mem["y"], m)))
    return {**out, "tau": round(float(budget_threshold(u, SHIP_RATE)), 6), "tau_rate": SHIP_RATE,
            "n": int(len(rows["s1"])), "n_confirmed": int(c.sum()), "records": rows["where"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", nargs="+", action="append", required=True, metavar=("MODEL", "FOLDER"),
                    help="a model key and its run folders (each holding <dataset>/records.jsonl)")
    ap.add_argument("--k", type=int, default=DEFAULT_K)
    ap.add_argument("--beta", type=float, default=DEFAULT_BETA)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    models, pooled = {}, {}
    for model, *folders in args.run:
        if not folders:
            ap.error(f"--run {model} names no folder")
        rows = dev_rows([Path(f) for f in folders], args.k, args.beta)
        models[model] = fit(rows)
        for key, v in rows.items():
            pooled[key] = (list(pooled[key]) if key in pooled else []) + list(v)
    models["default"] = fit({k: (np.array(v) if k != "where" else v) for k, v in pooled.items()})
    doc = {"about": "evidence gate calibrations, fitted on dev halves by scripts/analysis/fit_evidence.py", "k": args.k,
           "beta": args.beta, "metric": METRIC, "command": "python scripts/analysis/fit_evidence.py " + " ".join(
               f"--run {' '.join(r)}" for r in args.run), "models": models}
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    for m, c in models.items():
        split = "split by confirmed" if "memory_confirmed" in c else f"one fit (< {MIN_SPLIT} on a side)"
        print(f"{m}: n={c['n']}, confirmed {c['n_confirmed']}, read knots {len(c['read']['x'])}, "
              f"memory knots {len(c['memory']['x'])} ({split}), tau@{SHIP_RATE} {c['tau']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
