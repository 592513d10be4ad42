"""How the evidence gate fares with another model's calibration: the transfer table.

For each offline model and each of its committed eval cells, the gate's U_evi is recomputed from
the records (no model runs) under four calibrations: the model's own shipped fit, the other
model's, the pooled "default" (what every other model gets; it was fitted on both models' dev
halves, this one's included), and the model's own fit **without the cell's dataset** (refitted here
as fit_evidence.py fits the shipped one, on the dev halves of its seeded and clean cells of the
other two datasets: leave one dataset out, so the calibration has never seen that kind of question). Each is then judged exactly as the report judges the shipped gate
(`eval.analysis.verdict`: the reading budget chosen on the dev half, tau by the budget rule, the
test half scored): evidence − random at its reading rate, paired bootstrap 95% CI, accuracy points.
Two own − other columns: the gated accuracy's difference, and evidence − random's (the own fit's
minus the other model's); the count of cells where the latter is within 0.5 points closes the run.

    PYTHONPATH=. python scripts/analysis/transfer_calibration.py [--boot 1000] [--no-fit-tau 0.05] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

import numpy as np

from targ_mlx.eval import analysis as an
from targ_mlx.eval.record import record_signals
from targ_mlx.eval.sweep import Signals
from targ_mlx.calibration.evidence import DEFAULT_RATE, cell_rows, fit, read_cell
from targ_mlx.gates import GateParams, get
from targ_mlx.gates.evidence import DEFAULT_KEY, calibrations

ROOT = Path(__file__).resolve().parents[2] / "results"
MODELS = {"smollm2-135m": "SmolLM2", "qwen2.5-coder-1.5b": "Qwen 1.5B"}
CORPORA = ("seeded", "clean", "large")
FITTED_ON = ("clean", "seeded")  # the shipped fits' folders (evidence_calibration.json's command)
DATASETS = {"nq_open": "NQ-Open", "popqa": "PopQA", "triviaqa": "TriviaQA"}
K, BETA, METRIC = 20, 3.0, "acc"


def rescored(records: list[dict], model: str, cal: dict) -> list[dict]:
    """The records with the evidence gate's U at k=K recomputed under calibration `cal`."""
    gate, p = get("evidence"), GateParams(K, BETA, cal)
    out = []
    for r in records:
        u = gate.score(record_signals(r, model, K), p)
        out.append({**r, "scores": {**r["scores"], "evidence": {**r["scores"]["evidence"], str(K): u}}})
    return out


def without_dataset(model: str, held_out: str) -> dict:
    """The model's own fit as shipped, but from its other two datasets' cells only."""
    others = [d for d in DATASETS if d != held_out]
    return fit(cell_rows([ROOT / model / c for c in FITTED_ON], K, BETA, "dev", others), DEFAULT_RATE)


def cell_verdicts(cell: Path, model: str, cals: dict[str, dict], n_boot: int) -> dict[str, tuple]:
    """Per calibration: (the report's verdict: budget chosen on dev; the test half at the calibration's
    own shipped tau: (reading rate, evidence − random CI)), the second being what a model gets
    with no dev half of its own to choose a budget on."""
    from targ_mlx.eval import controls as ctl
    from targ_mlx.eval.sweep import paired_ci

    recs, dev, test = read_cell(cell)
    out = {}
    for name, cal in cals.items():
        sig = Signals(rescored(recs, model, cal))
        t = sig.subset(test)
        r = t.u["evidence"][K] > float(cal.get("tau_used", cal["tau"]))
        nv, al = t.never[METRIC], t.always[METRIC]
        fixed = (float(r.mean()), paired_ci(ctl.gated(r, nv, al), ctl.random_expected(nv, al, float(r.mean())), n_boot, 0))
        out[name] = (an.verdict(sig, dev, test, METRIC, K, n_boot, 0, gate="evidence"), fixed)
    return out


def _ci(ci) -> str:
    est, lo, hi = (100 * x for x in ci)
    bold = "**" if lo > 0 else ""
    return f"{bold}{est:+.1f} [{lo:+.1f}, {hi:+.1f}]{bold}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--boot", type=int, default=1000, help="bootstrap resamples (default 1000, the report's)")
    ap.add_argument("--no-fit-tau", type=float, metavar="TAU",
                    help="also score the pooled fit at this tau (what a model with no fit would read at)")
    ap.add_argument("--out", type=Path, help="write the tables to this file (results/calibration_transfer.md) too")
    args = ap.parse_args(argv)
    if args.out:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            report(args)
        given = " ".join(argv if argv is not None else sys.argv[1:])
        text = ("# The evidence gate under other calibrations: the other model's, the pooled one, the own fit "
                f"without the cell's dataset\n\n`PYTHONPATH=. python scripts/analysis/transfer_calibration.py {given}`\n\n"
                + buf.getvalue())
        args.out.write_text(text, encoding="utf-8")
        print(text, end="")
        return 0
    report(args)
    return 0


def report(args) -> None:
    judged = ("own", "other", "default", "lodo")  # each judged both ways; "new" only at its fixed tau
    keys = judged + (("new",) if args.no_fit_tau is not None else ())
    shipped = calibrations()
    head = ("| model · corpus · dataset | test n | own: evidence − random (reading rate) | other model's | "
            "pooled default | own fit without this dataset | own − other (accuracy) | own − other (evidence − random) | "
            "own − without (evidence − random) | at each fit's shipped τ: own | other's | pooled's | without this dataset's |"
            + (f" pooled at τ {args.no_fit_tau:g} |" if args.no_fit_tau is not None else ""))
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    sums = {m: {k: [] for k in keys + tuple("fixed_" + k for k in keys)} for m in MODELS}
    wins = {"own": 0, "lodo": 0}
    transfer_gaps, lodo_gaps = [], []  # own − other and own − without-this-dataset of evidence − random, points
    for model, label in MODELS.items():
        other = next(m for m in MODELS if m != model)
        cals = {"own": shipped[model], "other": shipped[other], "default": shipped[DEFAULT_KEY]}
        if args.no_fit_tau is not None:
            cals["new"] = {**shipped[DEFAULT_KEY], "tau_used": args.no_fit_tau}
        lodo = {name: without_dataset(model, name) for name in DATASETS}
        for corpus in CORPORA:
            for name, dname in DATASETS.items():
                cell = ROOT / model / corpus / name
                if not (cell / "records.jsonl").is_file():
                    continue
                both = cell_verdicts(cell, model, {**cals, "lodo": lodo[name]}, args.boot)
                v = {key: b[0] for key, b in both.items()}
                for key in keys:
                    sums[model][key].append(v[key].vs_random[0])
                    sums[model]["fixed_" + key].append(both[key][1][1][0])
                gap = 100 * (v["own"].gate - v["other"].gate)
                transfer_gaps.append(100 * (v["own"].vs_random[0] - v["other"].vs_random[0]))
                lodo_gaps.append(100 * (v["own"].vs_random[0] - v["lodo"].vs_random[0]))
                for key in ("own", "lodo"):  # as shipped: beats random (CI above 0) at the fit's own tau
                    wins[key] += both[key][1][1][1] > 0
                cols = [f"{_ci(v[key].vs_random)} ({v[key].rate:.2f})" for key in judged]
                fixed = [f"{_ci(both[key][1][1])} ({both[key][1][0]:.2f})" for key in keys]
                print(f"| {label} · {corpus} · {dname} | {v['own'].n} | {' | '.join(cols)} | {gap:+.1f} | {transfer_gaps[-1]:+.2f} | "
                      f"{lodo_gaps[-1]:+.2f} | {' | '.join(fixed)} |")
                sys.stdout.flush()
    for model, label in MODELS.items():
        means = {k: 100 * float(np.mean(v)) for k, v in sums[model].items()}
        print(f"\n{label}: mean evidence − random over {len(sums[model]['own'])} cells: own {means['own']:+.2f}, "
              f"other model's {means['other']:+.2f}, pooled default {means['default']:+.2f}, own without the "
              f"cell's dataset {means['lodo']:+.2f} points; at each fit's "
              f"shipped tau: own {means['fixed_own']:+.2f}, other's {means['fixed_other']:+.2f}, "
              f"pooled's {means['fixed_default']:+.2f}, without the cell's dataset {means['fixed_lodo']:+.2f}"
              + (f", pooled at tau {args.no_fit_tau:g} {means['fixed_new']:+.2f}" if "new" in keys else ""))
    near = sum(abs(g) <= 0.5 for g in transfer_gaps)
    print(f"\nevidence − random under the other model's fit is within 0.5 points of the own fit's in {near} of "
          f"{len(transfer_gaps)} cells")
    print(f"without the cell's dataset: within 0.5 points of the own fit's in {sum(abs(g) <= 0.5 for g in lodo_gaps)} "
          f"of {len(lodo_gaps)} cells (budget from the dev half); at each fit's own tau, beats random (CI above 0) "
          f"in {wins['lodo']} of {len(lodo_gaps)} cells (own fit: {wins['own']})")


if __name__ == "__main__":
    sys.exit(main())
