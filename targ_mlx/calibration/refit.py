"""Refit the evidence gate's calibrations from the user's labels on logged decisions.

A label (the chat's F2 / F3, `targ label`, `POST /v1/feedback`) speaks for the branch that ran:
on a decision that read, a good answer says "Always right" at that question's top-1 similarity
and at its support (a point for each read fit); on one answered from memory, it says "Never right"
at its U_mar (a point for the memory fit, the confirmed or unconfirmed one by what the context
said). The current calibration (the user's own fit, else the shipped one, else the pooled
default) enters as its knots, each standing for `prior / knots` questions (its n by default), so a
handful of labels nudges it and many labels move it. tau is then the budget rule over every logged
question of the model under the refitted calibration, at the rate the old tau read them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from targ_mlx.calibration.thresholds import budget_threshold, isotonic
from targ_mlx.errors import TargError
from targ_mlx.gates.evidence import evidence_score, interp, memory_fit, read_probability
from targ_mlx.log.decisions import POSITIVE_LABELS, DecisionLog
from targ_mlx.log.store import filters

MIN_LABELS = 30  # fewer labels move a calibration by whole steps each
GRID = 101  # points over each fit's x range where its movement is measured


class NotEnoughLabelsError(TargError):
    """Too few labelled decisions to refit from."""


@dataclass(frozen=True)
class LoggedRow:
    """One logged decision that searched: what the evidence gate reads, and its label if any."""

    id: int
    s1: float
    u_mar: float
    confirmed: bool | None
    retrieved: bool
    label: str | None
    support: float | None = None  # the selection's support, where the log holds it


def logged_rows(log: DecisionLog, model: str, k: int, beta: float) -> list[LoggedRow]:
    """Decisions of `model` at (k, beta) whose search was logged (the evidence gate's inputs)."""
    where, params = filters(model=model, k=k, beta=beta)
    where += (" AND " if where else "WHERE ") + "u_margin IS NOT NULL AND extra IS NOT NULL"
    sql = f"""SELECT d.id, d.u_margin, d.retrieved, d.extra,
                     (SELECT label FROM feedback f WHERE f.decision_id = d.id ORDER BY f.id DESC LIMIT 1) AS label
              FROM decisions d {where} ORDER BY d.id"""
    out = []
    for r in log._query(sql, params):
        extra = json.loads(r["extra"])
        if "found" not in extra:
            continue
        s1 = max((float(p[2]) for p in extra["found"]), default=0.0)
        out.append(LoggedRow(r["id"], s1, float(r["u_margin"]), extra.get("confirmed"), bool(r["retrieved"]),
                             r["label"], extra.get("support")))
    return out


def _refit_one(prior: Mapping, prior_n: float, x: Sequence[float], right: Sequence[float], increasing: bool) -> dict:
    px, py = list(prior["x"]), list(prior["y"])
    w = [prior_n / len(px)] * len(px) + [1.0] * len(x)
    kx, ky = isotonic(px + list(x), py + list(right), increasing, w)
    return {"x": [round(v, 6) for v in kx], "y": [round(v, 6) for v in ky]}


def refit(cal: Mapping, rows: Sequence[LoggedRow], prior_n: float | None = None) -> tuple[dict, dict[str, int]]:
    """The calibration refitted with the labelled rows; returns (calibration, rows used per fit)."""
    prior_n = float(cal.get("n", 300) if prior_n is None else prior_n)
    labelled = [r for r in rows if r.label is not None]
    good = lambda r: 1.0 if r.label in POSITIVE_LABELS else 0.0  # noqa: E731
    read = [r for r in labelled if r.retrieved]
    memory = [r for r in labelled if not r.retrieved]
    out = {"read": _refit_one(cal["read"], prior_n, [r.s1 for r in read], [good(r) for r in read], True),
           "memory": _refit_one(cal["memory"], prior_n, [r.u_mar for r in memory], [good(r) for r in memory], False)}
    used = {"read": len(read), "memory": len(memory)}
    if "read_support" in cal:
        part = [r for r in read if r.support is not None]
        out["read_support"] = _refit_one(cal["read_support"], prior_n, [r.support for r in part],
                                         [good(r) for r in part], True)
        used["read_support"] = len(part)
    if "memory_confirmed" in cal:
        for side, flag in (("memory_confirmed", True), ("memory_unconfirmed", False)):
            part = [r for r in memory if bool(r.confirmed) == flag]
            out[side] = _refit_one(cal[side], prior_n / 2, [r.u_mar for r in part], [good(r) for r in part], False)
            used[side] = len(part)
    return out, used


def u_evi(cal: Mapping, rows: Sequence[LoggedRow]) -> np.ndarray:
    out = []
    for r in rows:
        mem = memory_fit(cal, r.confirmed)
        out.append(evidence_score(read_probability(cal, r.s1, r.support), interp(mem["x"], mem["y"], r.u_mar)))
    return np.asarray(out, float)


def moved(old: Mapping, new: Mapping) -> dict[str, float]:
    """Per fit, the largest change of its probability over the x range both cover (points)."""
    out = {}
    for name in new:
        if name not in old or not isinstance(new[name], Mapping):
            continue
        lo = min(old[name]["x"][0], new[name]["x"][0])
        hi = max(old[name]["x"][-1], new[name]["x"][-1])
        grid = np.linspace(lo, hi, GRID)
        a = np.array([interp(old[name]["x"], old[name]["y"], g) for g in grid])
        b = np.array([interp(new[name]["x"], new[name]["y"], g) for g in grid])
        out[name] = float(np.max(np.abs(a - b)))
    return out


@dataclass(frozen=True)
class Refit:
    calibration: dict  # the refitted knots, tau and provenance, as `config.save_evidence` stores them
    used: dict[str, int]  # labelled rows per fit
    moved: dict[str, float]  # largest change per fit, probability
    tau_before: float  # the tau in use
    tau_unlabelled: float  # the same rule on the same rows under the old calibration: what the labels changed
    tau_after: float
    rate: float  # the reading rate tau is set for on the logged rows
    logged: int  # logged rows tau was set on


def refit_from_log(log: DecisionLog, model: str, k: int, beta: float, cal: Mapping, old_tau: float,
                   prior_n: float | None = None, min_labels: int = MIN_LABELS, rate: float | None = None) -> Refit:
    """Refit `cal` (used with `old_tau`) from the labels in `log` for `model`; see the module docstring."""
    rows = logged_rows(log, model, k, beta)
    n_labels = sum(r.label is not None for r in rows)
    if n_labels < min_labels:
        raise NotEnoughLabelsError(
            f"{n_labels} labelled decisions of {model} (k={k}, beta={beta:g}) in {log.path}; a refit needs at least "
            f"{min_labels} (fix: label answers with F2/F3 in the chat, `targ label ID correct|wrong`, or "
            "POST /v1/feedback; or --min-labels)")
    new, used = refit(cal, rows, prior_n)
    before = u_evi(cal, rows)
    rate = float(np.mean(before > old_tau)) if rate is None else rate
    tau = budget_threshold(u_evi(new, rows), rate)
    n_prior = int(cal.get("n", 0))
    info = {"tau": round(float(tau), 6), "tau_rate": rate, "n": n_prior, "feedback": int(n_labels)}
    return Refit({**new, **info}, used, moved(cal, new), float(old_tau), budget_threshold(before, rate), float(tau),
                 rate, len(rows))
