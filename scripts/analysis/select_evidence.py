"""Choose the evidence gate's form on dev halves only (2-fold cross-validation inside each dev half).

Every candidate is a monotone combination of calibrations of one or two search signals (s_1, the
selection's support, BM25's top score, the top 3's mean, the gap to the K-th) and
P(Never right | U_mar) (over every question, or apart for questions whose packed context says
what the draft says, "confirmed", and the others), or s_1 alone. For each model, the dev half of every cell (the half the
reports never judge on) is split in two folds; calibrations are fitted on one fold pooled over the
model's cells, the reading budget and tau chosen on that fold by the eval's one rule, and the gate
judged against a random gate at its rate on the other fold; then the folds swap. The form with
the highest mean gain over random across cells is what ships (`targ_mlx/gates/evidence.py`); the
test halves are judged only afterwards, by the eval.

    python scripts/analysis/select_evidence.py --repeats 10 \
        --run smollm2-135m results/smollm2-135m/{clean,seeded,large} \
        --run qwen2.5-coder-1.5b results/qwen2.5-coder-1.5b/{clean,seeded,large} \
        --out results/evidence_selection.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from targ_mlx.calibration.thresholds import budget_threshold, isotonic
from targ_mlx.eval import controls as ctl
from targ_mlx.eval.run import read_jsonl
from targ_mlx.eval.sweep import BUDGETS, split, split_pool
from targ_mlx.gates import margin_score
from targ_mlx.gates.evidence import fit_calibration, interp, memory_fit

DATASETS = ("nq_open", "popqa", "triviaqa")
METRIC = "acc"


def step(kx, ky, x):
    """The isotonic fit as a step function (each block's mean up to its right edge)."""
    i = np.clip(np.searchsorted(np.asarray(kx), x, side="left"), 0, len(ky) - 1)
    return np.asarray(ky)[i]


def cells(folders, k, beta):
    out = {}
    for folder in folders:
        for name in DATASETS:
            path = Path(folder) / name / "records.jsonl"
            if not path.exists():
                continue
            recs = read_jsonl(path)
            dev, _ = split(len(recs), 0, pool=split_pool(json.loads((path.parent / "config.json").read_text())))
            rows = [recs[i] for i in dev]
            out[f"{Path(folder).name}/{name}"] = {
                "s1": np.array([max((p[2] for p in r["always"]["passages"]), default=0.0) for r in rows]),
                "umar": np.array([margin_score(r["gaps"][:k], beta) for r in rows]),
                "A": np.array([r["always"][METRIC] for r in rows], float),
                "N": np.array([r["never"][METRIC] for r in rows], float),
                # the search's other shapes: how far the best stands above the K-th, the top 3's mean
                "gapK": np.array([ps[0][2] - ps[-1][2] if len(ps := r["always"]["passages"]) > 1 else 0.0 for r in rows]),
                "mean3": np.array([np.mean([p[2] for p in r["always"]["passages"][:3]]) for r in rows]),
                # the selection's support (records made before it: scripts/analysis/rescore_records.py adds it)
                "sup": np.array([r["always"]["support"] for r in rows]),
                "b1": np.array([max((p[3] for p in r["always"]["passages"] if len(p) > 3), default=0.0) for r in rows]),
                "conf": np.array([r["always"]["confirms"][str(k)] for r in rows], bool)}
    return out


def forms(fit):
    rx, ry, mx_, my = fit["read"]["x"], fit["read"]["y"], fit["memory"]["x"], fit["memory"]["y"]
    lin = lambda kx, ky, x: np.array([interp(kx, ky, float(v)) for v in x])  # noqa: E731
    on = lambda f, x: lin(f["x"], f["y"], x)  # noqa: E731
    # as the gate reads it: the confirmed or unconfirmed fit where shipped, else the one fit
    mem = lambda c: np.where(c["conf"], on(memory_fit(fit, True), c["umar"]), on(memory_fit(fit, False), c["umar"]))  # noqa: E731
    return {
        "product, read on s_1, memory split by confirmed (shipped until 2026-11-28)": lambda c: lin(rx, ry, c["s1"]) * (1 - mem(c)),
        "product, interpolated (shipped until 2026-11-26)": lambda c: lin(rx, ry, c["s1"]) * (1 - lin(mx_, my, c["umar"])),
        "product, read on s_1 - s_K (gap to the K-th), split": lambda c: lin(*fit["read_gap"], c["gapK"]) * (1 - mem(c)),
        "product, read on the top 3's mean similarity, split": lambda c: lin(*fit["read_mean3"], c["mean3"]) * (1 - mem(c)),
        "product, read on the selection's support, split": lambda c: lin(*fit["read_sup"], c["sup"]) * (1 - mem(c)),
        "product, read on the mean of P(A; s_1) and P(A; support), split (shipped)": lambda c: (lin(rx, ry, c["s1"]) + lin(*fit["read_sup"], c["sup"])) / 2 * (1 - mem(c)),
        "product, read on P(A; s_1) P(A; support) / P(A), split": lambda c: np.clip(lin(rx, ry, c["s1"]) * lin(*fit["read_sup"], c["sup"]) / fit["pA"], 0, 1) * (1 - mem(c)),
        "product, read on the mean of P(A; s_1) and P(A; BM25 top), split": lambda c: (lin(rx, ry, c["s1"]) + lin(*fit["read_b1"], c["b1"])) / 2 * (1 - mem(c)),
        "difference, memory split by confirmed": lambda c: lin(rx, ry, c["s1"]) - mem(c),
        "product, steps, ties by s_1": lambda c: step(rx, ry, c["s1"]) * (1 - step(mx_, my, c["umar"])) + 1e-9 * c["s1"],
        "difference, interpolated": lambda c: lin(rx, ry, c["s1"]) - lin(mx_, my, c["umar"]),
        "top-1 similarity alone": lambda c: c["s1"],
        "margin U alone (the paper's)": lambda c: c["umar"],
    }


def judge(score_fit, score_eval, c_fit, c_eval):
    best = None
    for rho in BUDGETS:
        tau = budget_threshold(score_fit, rho)
        acc = ctl.gated(score_fit > tau, c_fit["N"], c_fit["A"]).mean()
        if best is None or acc > best[0] + 1e-12:
            best = (acc, tau)
    r = score_eval > best[1]
    g = ctl.gated(r, c_eval["N"], c_eval["A"])
    return float(g.mean() - ctl.random_expected(c_eval["N"], c_eval["A"], float(r.mean())).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", nargs="+", action="append", required=True, metavar=("MODEL", "FOLDER"))
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--beta", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=1,
                    help="fold splits averaged (a different random halving each): less noise from one split")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    gains: dict[str, dict[str, float]] = {}
    for model, *folders in args.run:
        cs = cells(folders, args.k, args.beta)
        rng = np.random.default_rng(0)
        for f, folds in ((f, folds) for _ in range(args.repeats)
                         for folds in [{n: rng.permutation(len(c["s1"])) % 2 for n, c in cs.items()}]
                         for f in (0, 1)):
            part = lambda c, n, which: {k: v[folds[n] == which] for k, v in c.items()}  # noqa: E731
            fit_rows = {k: np.concatenate([part(c, n, f)[k] for n, c in cs.items()]) for k in ("s1", "umar", "A", "N", "conf", "gapK", "mean3", "sup", "b1")}
            # the fits scripts/analysis/fit_evidence.py ships, and two candidates' own read fits
            fit = fit_calibration(fit_rows["s1"], fit_rows["umar"], fit_rows["A"], fit_rows["N"], fit_rows["conf"])
            fit["read_gap"] = isotonic(fit_rows["gapK"], fit_rows["A"])
            fit["read_mean3"] = isotonic(fit_rows["mean3"], fit_rows["A"])
            fit["read_sup"] = isotonic(fit_rows["sup"], fit_rows["A"])
            fit["read_b1"] = isotonic(fit_rows["b1"], fit_rows["A"])
            fit["pA"] = max(float(fit_rows["A"].mean()), 1e-6)
            for form, fn in forms(fit).items():
                for n, c in cs.items():
                    a, b = part(c, n, f), part(c, n, 1 - f)
                    key = f"{model.split('-')[0]} · {n}"
                    gains.setdefault(form, {}).setdefault(key, 0.0)
                    gains[form][key] += judge(fn(a), fn(b), a, b) / (2 * args.repeats)
    names = sorted(next(iter(gains.values())))
    lines = ["# Evidence gate: its form chosen on dev halves (2-fold CV inside each dev half)", "",
             f"Gain over a random gate at the same reading rate, accuracy points, mean of the two folds "
             f"over {args.repeats} random halving(s) (each fold ~125 questions; the test halves are not read). "
             "Command: `python scripts/analysis/select_evidence.py " + (f"--repeats {args.repeats} " if args.repeats > 1 else "") + " ".join(f"--run {' '.join(r)}" for r in args.run) + "`.", "",
             "| form | mean over cells | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for form, g in sorted(gains.items(), key=lambda kv: -np.mean(list(kv[1].values()))):
        lines.append(f"| {form} | {100 * np.mean(list(g.values())):+.2f} | " +
                     " | ".join(f"{100 * g[n]:+.1f}" for n in names) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
