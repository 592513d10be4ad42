"""Fit the evidence gate's calibrations and tau from labelled questions (eval records).

Each question gives one row: the search's top-1 similarity s_1, the draft's U_mar at k, whether
the context says what the k-token draft says (`pipeline.confirms`), and whether each branch was
right (a gold answer contained, the metric every model's headline compares on). From the rows:

    P(Always right | s_1)              increasing isotonic fit ("read")
    P(Always right | support)          increasing isotonic fit ("read_support"), where every record
                                       holds the selection's support
    P(Never right  | U_mar)            decreasing isotonic fit ("memory"), and apart for confirmed
                                       and other questions where each side has MIN_SPLIT rows
    tau                                the budget rule over the rows' U_evi: `rate` of them read

`targ-calibrate fit` feeds it the questions it recorded (all of them); the shipped file
(`gates/evidence_calibration.json`) is fitted on the dev halves of committed eval cells
(`scripts/analysis/fit_evidence.py`), so their test halves stay held out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from targ_mlx.calibration.thresholds import budget_threshold
from targ_mlx.gates import margin_score
from targ_mlx.gates.evidence import MIN_SPLIT, evidence_score, fit_calibration, interp, memory_fit, read_probability

METRIC = "acc"  # a gold answer contained
DEFAULT_RATE = 0.3  # the shipped tau: this share of the fitted questions would read
DIGITS = 6  # knots are stored rounded: the fits are read to far fewer places


class FitError(ValueError):
    """The records cannot be fitted (no confirms, too few questions): one line with the fix."""


@dataclass(frozen=True)
class FitRows:
    """One labelled question per position."""

    s1: np.ndarray
    u_mar: np.ndarray
    always: np.ndarray  # the Always (read) answer was right, 0/1
    never: np.ndarray  # the Never (memory) answer was right, 0/1
    confirmed: np.ndarray  # bool
    where: tuple[str, ...] = ()  # which records, for the fit's provenance
    # the selection's support per row (`selection.support`); None where a record lacks it (records
    # made before it: scripts/analysis/rescore_records.py adds it), and then no support fit is made
    support: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.s1.size)


def record_row(r: dict, k: int, beta: float, where: str = "") -> tuple[float, float, float, float, bool, float | None]:
    """(s_1, U_mar, always right, never right, confirmed, support or None) of one eval record."""
    passages = r["always"].get("passages") or []
    c = r["always"].get("confirms")
    if c is None or str(k) not in c:
        raise FitError(f"{where or 'a record'} has no always.confirms at k={k}; "
                       "fix: run scripts/rescore_records.py on it, or record it again")
    return (max((p[2] for p in passages), default=0.0), margin_score(r["gaps"][:k], beta),
            float(r["always"][METRIC]), float(r["never"][METRIC]), bool(c[str(k)]), r["always"].get("support"))


def rows_of(records: Sequence[dict], k: int, beta: float, where: str = "", half: str = "") -> FitRows:
    vals = [record_row(r, k, beta, where) for r in records]
    cols = list(zip(*vals)) if vals else [()] * 6
    what = f"{half} half, {len(vals)}" if half else str(len(vals))
    support = None if any(v is None for v in cols[5]) else np.asarray(cols[5], float)
    return FitRows(*(np.asarray(c, float) for c in cols[:4]), np.asarray(cols[4], bool),
                   (f"{where} ({what})",) if where else (), support)


def pool(parts: Iterable[FitRows]) -> FitRows:
    parts = list(parts)
    cat = lambda name, dtype: np.concatenate([np.asarray(getattr(p, name), dtype) for p in parts])  # noqa: E731
    support = None if any(p.support is None for p in parts) else cat("support", float)
    return FitRows(cat("s1", float), cat("u_mar", float), cat("always", float), cat("never", float),
                   cat("confirmed", bool), tuple(w for p in parts for w in p.where), support)


def cells(folder: Path, datasets: Sequence[str] | None = None) -> list[Path]:
    """The eval cells under `folder`: itself when it holds records.jsonl, else its sub-folders that do."""
    folder = Path(folder)
    if (folder / "records.jsonl").is_file():
        return [folder]
    found = sorted(p.parent for p in folder.glob("*/records.jsonl"))
    return [p for p in found if datasets is None or p.name in datasets]


def read_cell(cell: Path) -> tuple[list[dict], np.ndarray, np.ndarray]:
    """(records, dev rows, test rows) of one eval cell, split as its report splits it."""
    from targ_mlx.eval.run import read_jsonl
    from targ_mlx.eval.sweep import split, split_pool

    recs = read_jsonl(cell / "records.jsonl")
    cfg_path = cell / "config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else None
    seed = int(((cfg or {}).get("args") or {}).get("seed") or 0)
    dev, test = split(len(recs), seed, pool=split_pool(cfg))
    return recs, dev, test


def cell_rows(folders: Sequence[Path], k: int, beta: float, half: str = "dev",
              datasets: Sequence[str] | None = None) -> FitRows:
    """Rows from eval cells: each cell's dev half (its test half stays for judging), or all of it."""
    parts = []
    for folder in folders:
        found = cells(folder, datasets)
        if not found:
            raise FitError(f"no records.jsonl in {folder} or its sub-folders; fix: pass an eval --output-dir")
        for cell in found:
            recs, dev, _ = read_cell(cell)
            picked = [recs[i] for i in dev] if half == "dev" else recs
            parts.append(rows_of(picked, k, beta, str(cell), half if half == "dev" else ""))
    return pool(parts)


def scores(cal: dict, rows: FitRows) -> np.ndarray:
    """U_evi of each row under the calibration `cal`."""
    u = []
    support = rows.support if rows.support is not None else [None] * rows.n
    for s, m, c, sup in zip(rows.s1, rows.u_mar, rows.confirmed, support):
        mem = memory_fit(cal, bool(c))
        u.append(evidence_score(read_probability(cal, float(s), None if sup is None else float(sup)),
                                interp(mem["x"], mem["y"], float(m))))
    return np.asarray(u, float)


def fit(rows: FitRows, rate: float = DEFAULT_RATE, digits: int | None = DIGITS) -> dict:
    """The calibration the gate reads and its tau at `rate`: {"read", "memory", ["memory_confirmed",
    "memory_unconfirmed"], "tau", "tau_rate", "n", "n_confirmed", "records"}."""
    if rows.n == 0:
        raise FitError("no labelled questions to fit")
    out = fit_calibration(rows.s1, rows.u_mar, rows.always, rows.never, rows.confirmed, digits=digits,
                          support=rows.support)
    tau = budget_threshold(scores(out, rows), rate)
    return {**out, "tau": round(float(tau), 6) if digits is not None else float(tau), "tau_rate": rate,
            "n": rows.n, "n_confirmed": int(rows.confirmed.sum()), "records": list(rows.where)}


def split_note(cal: dict) -> str:
    return "split by confirmed" if "memory_confirmed" in cal else f"one memory fit (< {MIN_SPLIT} on a side)"
