"""The evidence gate: search first, then read only where reading is likely to help.

On a local index the search costs milliseconds and reading costs 2-4x a closed-book answer, so
this gate decides whether to *read* after looking at what the search found. Its score estimates
P(retrieval helps) as the product of two monotone calibrations, each of one training-free signal:

    U_evi = P(Always right | top-1 similarity) * P(Never wrong | U_mar, confirmed)

P(Never wrong | U_mar, confirmed) says the model does not know: the paper's margin score (k and
beta as set), read separately for questions whose context already says what the draft says
("confirmed", `pipeline.confirms`: every claim word of the draft occurs in it, so its answer is
likelier right and reading changes little) and the others. P(Always right | s_1) says the index holds something
close to the question. Each is an isotonic fit on dev-half eval records, shipped per model in
`evidence_calibration.json` (`scripts/analysis/fit_evidence.py` writes it; the eval judges it on the other
half); a model with too few confirmed dev questions ships one memory fit for both. One scalar against
one threshold, so the one budget rule calibrates it like the paper's gates. No second model
pass over the passages: that is the reading it saves.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Sequence

import numpy as np

from targ_mlx.calibration import isotonic
from targ_mlx.gates.base import DRAFT, SEARCH, Gate, GateDecision, GateParams, Signals, register
from targ_mlx.gates.paper import margin_score

CALIBRATION_FILE = "evidence_calibration.json"
MIN_SPLIT = 30  # fewer confirmed (or unconfirmed) dev questions than this: one memory fit for both
DEFAULT_KEY = "default"  # pooled over every model's records: used for a model with no fit of its own


def interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), flat beyond the ends (xs ascending: a monotone fit's knots)."""
    if not xs:
        raise ValueError("a calibration needs at least one knot, got none")
    if x <= xs[0]:
        return float(ys[0])
    if x >= xs[-1]:
        return float(ys[-1])
    lo, hi = 0, len(xs) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if xs[mid] <= x else (lo, mid)
    span = xs[hi] - xs[lo]
    w = (x - xs[lo]) / span if span > 0 else 1.0
    return float(ys[lo] + w * (ys[hi] - ys[lo]))


@lru_cache(maxsize=1)
def calibrations() -> dict:
    """The shipped fits: {model key: {"read": {"x", "y"}, "memory": {"x", "y"}, "tau", ...}}."""
    text = resources.files("targ_mlx.gates").joinpath(CALIBRATION_FILE).read_text(encoding="utf-8")
    return json.loads(text)["models"]


def calibration_for(model: str) -> dict:
    cal = calibrations()
    return cal.get(model) or cal[DEFAULT_KEY]


def top_similarity(sig: Signals) -> float:
    """s_1: the best passage's similarity, 0 when the search found nothing."""
    return max((e.similarity for e in sig.evidence or ()), default=0.0)


def memory_fit(cal: dict, confirmed: bool | None) -> dict:
    """The P(Never right | U_mar) fit for this question: the confirmed or unconfirmed one where
    the model ships both and the runner could tell, else the one fit over every question."""
    if confirmed is None:
        return cal["memory"]
    return cal.get("memory_confirmed" if confirmed else "memory_unconfirmed") or cal["memory"]


def fit_calibration(s1: Sequence[float], u_mar: Sequence[float], always_right: Sequence[float],
                    never_right: Sequence[float], confirmed: Sequence[bool], digits: int | None = None) -> dict:
    """The isotonic fits the gate reads, from labelled questions (dev-half eval records): "read"
    (P(Always right | s_1), increasing), "memory" (P(Never right | U_mar), decreasing, over every
    question) and, where each side has MIN_SPLIT questions, "memory_confirmed" and
    "memory_unconfirmed". Knots as {"x", "y"} lists, rounded to `digits` when given."""
    r = (lambda v: [round(float(t), digits) for t in v]) if digits is not None else list  # noqa: E731
    knots = lambda x, y, inc: dict(zip(("x", "y"), map(r, isotonic(x, y, increasing=inc))))  # noqa: E731
    s1, u_mar, a, n = (np.asarray(v, float) for v in (s1, u_mar, always_right, never_right))
    c = np.asarray(confirmed, bool)
    out = {"read": knots(s1, a, True), "memory": knots(u_mar, n, False)}
    if min(c.sum(), (~c).sum()) >= MIN_SPLIT:
        out["memory_confirmed"] = knots(u_mar[c], n[c], False)
        out["memory_unconfirmed"] = knots(u_mar[~c], n[~c], False)
    return out


def parts(sig: Signals, p: GateParams = GateParams()) -> tuple[float, float, float, float]:
    """(s_1, U_mar, P(Always right | s_1), P(Never right | U_mar, confirmed)) for one question."""
    if sig.evidence is None:
        raise ValueError("the evidence gate needs the search's passages; the runner searches before it decides")
    cal = calibration_for(sig.model)
    s1 = top_similarity(sig)
    u_mar = margin_score(list(sig.gaps)[: p.k], p.beta)
    p_read = interp(cal["read"]["x"], cal["read"]["y"], s1)
    mem = memory_fit(cal, sig.confirmed)
    p_mem = interp(mem["x"], mem["y"], u_mar)
    return s1, u_mar, p_read, p_mem


def evidence_score(p_read: float, p_mem: float) -> float:
    """U_evi = P(Always right) * P(Never wrong), in [0, 1]: larger means reading likelier helps."""
    return p_read * (1.0 - p_mem)


class EvidenceGate(Gate):
    name, needs, default_tau = "evidence", frozenset({DRAFT, SEARCH}), 0.05

    def model_tau(self, model: str) -> float | None:
        """The tau fitted beside this model's calibration (a 30% reading rate on its dev records)."""
        cal = calibrations().get(model)
        return None if cal is None else float(cal["tau"])

    def score(self, sig: Signals, p: GateParams = GateParams()) -> float:
        _, _, p_read, p_mem = parts(sig, p)
        return evidence_score(p_read, p_mem)

    def decide(self, sig: Signals, tau: float, p: GateParams = GateParams(), u: float | None = None) -> GateDecision:
        s1, u_mar, p_read, p_mem = parts(sig, p)
        u = evidence_score(p_read, p_mem) if u is None else u
        retrieve = bool(u > tau)
        unsure = p_mem < 0.5
        best = next((e for e in sig.evidence or () if e.similarity == s1), None)
        title = f", {best.title}" if best is not None and best.title else ""
        if retrieve:
            why = (f"model {'unsure' if unsure else 'may know'} (U {u_mar:.2f}), strong evidence "
                   f"({s1:.2f}{title}) → read {len(sig.evidence or ())} passages")
        elif sig.confirmed:
            why = f"the passages say what the model would say ({s1:.2f}{title}) → answered from memory"
        elif p_read <= 1.0 - p_mem:  # the evidence, not the model's confidence, is what held it back
            why = f"weak evidence (best {s1:.2f}{title}) → answered from memory"
        else:
            why = f"model sure (U {u_mar:.2f}) → answered from memory"
        no_source = not retrieve and unsure and p_read <= 1.0 - p_mem and not sig.confirmed
        return GateDecision(retrieve, float(u), float(tau), self.name, why, no_source)


register(EvidenceGate())
