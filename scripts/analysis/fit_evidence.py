"""Refit the shipped `targ_mlx/gates/evidence_calibration.json` from committed eval records.

The fitting is `targ_mlx.calibration.evidence` (what `targ-calibrate fit` runs for a user's model); this
script fits each model on the dev halves of its cells (their test halves stay for the report) and
a "default" pooled over every model, for models with no fit of their own:

    python scripts/analysis/fit_evidence.py \
        --run smollm2-135m results/smollm2-135m/clean results/smollm2-135m/seeded \
        --run qwen2.5-coder-1.5b results/qwen2.5-coder-1.5b/clean results/qwen2.5-coder-1.5b/seeded
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from targ_mlx.defaults import DEFAULT_BETA, DEFAULT_K
from targ_mlx.calibration.evidence import DEFAULT_RATE, METRIC, cell_rows, fit, pool, split_note

OUT = Path(__file__).resolve().parents[2] / "targ_mlx" / "gates" / "evidence_calibration.json"
DATASETS = ("nq_open", "popqa", "triviaqa")  # MuSiQue: every method at <= 0.4%, nothing to fit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", nargs="+", action="append", required=True, metavar=("MODEL", "FOLDER"),
                    help="a model key and its run folders (each holding <dataset>/records.jsonl)")
    ap.add_argument("--k", type=int, default=DEFAULT_K)
    ap.add_argument("--beta", type=float, default=DEFAULT_BETA)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    models, parts = {}, []
    for model, *folders in args.run:
        if not folders:
            ap.error(f"--run {model} names no folder")
        rows = cell_rows([Path(f) for f in folders], args.k, args.beta, "dev", DATASETS)
        models[model] = fit(rows, DEFAULT_RATE)
        parts.append(rows)
    models["default"] = fit(pool(parts), DEFAULT_RATE)
    doc = {"about": "evidence gate calibrations, fitted on dev halves by scripts/analysis/fit_evidence.py", "k": args.k,
           "beta": args.beta, "metric": METRIC, "command": "python scripts/analysis/fit_evidence.py " + " ".join(
               f"--run {' '.join(r)}" for r in args.run), "models": models}
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    for m, c in models.items():
        print(f"{m}: n={c['n']}, confirmed {c['n_confirmed']}, read knots {len(c['read']['x'])}, "
              f"memory knots {len(c['memory']['x'])} ({split_note(c)}), tau@{DEFAULT_RATE} {c['tau']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
