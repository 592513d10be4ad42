"""The gates of cells extended with `--split-pool`, judged on three test sets: the original test half,
the added questions alone (never seen by any choice: budgets, tau and calibrations were fixed on the
dev half before they were recorded) and both together (what each cell's summary.md reports).

    python scripts/analysis/judge_extension.py results/smollm2-135m/{seeded,clean,large}/{nq_open,popqa,triviaqa} \
        results/qwen2.5-coder-1.5b/clean/{nq_open,popqa,triviaqa} \
        --out results/extension.md

Each row: the gate's accuracy (a gold answer contained: the headline table's metric, for every model;
`--metric em` for exact match) at its reading rate and its paired difference to a random gate at the
same rate (bootstrap 95% CI over questions), exactly as the overview tables compute it (`analysis.verdict`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from targ_mlx.eval import analysis as an
from targ_mlx.eval.run import RECORDS, read_jsonl
from targ_mlx.eval.sweep import Signals, split, split_pool

GATES = ("evidence", "margin")


def _ci(v: an.Verdict) -> str:
    d, lo, hi = v.vs_random
    s = f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    return f"**{s}**" if lo > 0 else s


def judge(folder: Path, k: int, n_boot: int, metric: str = "acc") -> list[str]:
    cfg = json.loads((folder / "config.json").read_text())
    pool, seed = split_pool(cfg), int(cfg.get("settings", {}).get("seed", 0))
    if pool is None:
        raise SystemExit(f"judge_extension: {folder} was not extended (no --split-pool in its config.json)")
    sig = Signals(read_jsonl(folder / RECORDS))
    dev, test = split(sig.n, seed, pool=pool)
    parts = {"original test": test[test < pool], "added": test[test >= pool], "all test": test}
    rows = []
    for gate in GATES:
        cells = []
        for idx in parts.values():
            if len(idx) < 2:
                cells.append("– | –")
                continue
            v = an.verdict(sig, dev, idx, metric, k, n_boot, seed, gate=gate)
            cells.append(f"{100 * v.gate:.1f} @ {v.rate:.2f} (N {100 * v.never:.1f}, A {100 * v.always:.1f}, n {v.n}) "
                         f"| {_ci(v)}")
        rows.append(f"| {folder.parent.parent.name} · {folder.parent.name} · {folder.name} | {gate} | " + " | ".join(cells) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path, help="cell folders (records.jsonl + config.json)")
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--metric", choices=("acc", "em"), default="acc")
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args(argv)
    m = args.metric
    head = [f"| cell | gate | original test: {m} @ reading rate | − random [95% CI] | added: {m} @ rate | − random "
            f"| all test: {m} @ rate | − random |", "|---|---|---|---|---|---|---|---|"]
    lines = head + [r for f in args.folders for r in judge(f, args.k, args.bootstrap, m)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
