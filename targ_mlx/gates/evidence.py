"""The evidence gate: search first, then read only where reading is likely to help.

On a local index the search costs milliseconds and reading costs 2-4x a closed-book answer, so
this gate decides whether to *read* after looking at what the search found. Its score estimates
P(retrieval helps) as the product of two monotone calibrations, each of one training-free signal:

    U_evi = P(Always right | s_1, support) * P(Never wrong | U_mar, confirmed)

P(Always right | s_1, support) says the index holds something close to the question: the top-1
similarity s_1 and the selection's support (`selection.support`: the largest share of the question's
words one sentence of the passages holds), each calibrated alone and averaged (a fit without
"read_support" reads s_1 alone). Of the search's signals tried on the dev halves (s_1, BM25's top
score, the top 3's mean, the gap to the K-th, the support, and their combinations), this ranked
"reading helps" best (results/evidence_selection.md).

P(Never wrong | U_mar, confirmed) says the model does not know: the paper's margin score (k and
beta as set), read separately for questions whose context already says what the draft says
("confirmed", `pipeline.confirms`: every claim word of the draft occurs in it, so its answer is
likelier right and reading changes little) and the others.

Each is an isotonic fit on dev-half eval records, shipped per model in
`evidence_calibration.json` (`targ_mlx.calibration.evidence` fits it; the eval judges it on the other
half), or fitted to the user's own model by `targ-calibrate fit` (the config's `[evidence."key"]`,
passed in `GateParams.calibration`); a model with too few confirmed dev questions ships one memory fit for both. One scalar against
one threshold, so the one budget rule calibrates it like the paper's gates. No second model
pass over the passages: that is the reading it saves.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib import resources
from typing import Mapping, Sequence

import numpy as np

from targ_mlx.calibration.thresholds import isotonic
from targ_mlx.gates.base import DRAFT, SEARCH, Gate, GateDecision, GateParams, Signals, register
from targ_mlx.gates.paper import margin_score

CALIBRATION_FILE = "evidence_calibration.json"
MIN_SPLIT = 30  # fewer confirmed (or unconfirmed) dev questions than this: one memory fit for both
DEFAULT_KEY = "default"  # pooled over every model's records: used for a model with no fit of its own
# Model keys (comma-separated) whose shipped fit is set aside, so a shipped model can be treated as
# a new one: what a user of another model gets, and what `targ-calibrate fit` gives it.
HIDE_ENV = "TARG_MLX_HIDE_CALIBRATION"
SHIPPED, POOLED = "shipped", "default (pooled)"


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


def shipped_calibration(model: str) -> dict | None:
    """The fit shipped for this model key, None for a model with none (or one hidden by HIDE_ENV)."""
    hidden = {m.strip() for m in os.environ.get(HIDE_ENV, "").split(",")}
    return None if model in hidden or model == DEFAULT_KEY else calibrations().get(model)


def calibration_for(model: str) -> dict:
    return shipped_calibration(model) or calibrations()[DEFAULT_KEY]


def user_label(fit: Mapping) -> str:
    """How a user's own fit is named: "user, 300 questions, 2026-11-28" (", 40 labels" once refitted
    from feedback)."""
    labels = f", {fit['feedback']} labels" if fit.get("feedback") else ""
    return f"user, {fit.get('n', '?')} questions{labels}, {fit.get('date', '?')}"


def resolve(model: str, user: Mapping | None = None) -> tuple[Mapping, str]:
    """(the calibration the gate reads for this model, its label): the user's fit where the
    config holds one, else the shipped one, else the pooled default."""
    if user:
        return user, user_label(user)
    shipped = shipped_calibration(model)
    return (shipped, SHIPPED) if shipped is not None else (calibrations()[DEFAULT_KEY], POOLED)


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
                    never_right: Sequence[float], confirmed: Sequence[bool], digits: int | None = None,
                    support: Sequence[float] | None = None) -> dict:
    """The isotonic fits the gate reads, from labelled questions (dev-half eval records): "read"
    (P(Always right | s_1), increasing), "memory" (P(Never right | U_mar), decreasing, over every
    question) and, where each side has MIN_SPLIT questions, "memory_confirmed" and
    "memory_unconfirmed"; with `support`, "read_support" (P(Always right | support), increasing).
    Knots as {"x", "y"} lists, rounded to `digits` when given."""
    r = (lambda v: [round(float(t), digits) for t in v]) if digits is not None else list  # noqa: E731
    knots = lambda x, y, inc: dict(zip(("x", "y"), map(r, isotonic(x, y, increasing=inc))))  # noqa: E731
    s1, u_mar, a, n = (np.asarray(v, float) for v in (s1, u_mar, always_right, never_right))
    c = np.asarray(confirmed, bool)
    out = {"read": knots(s1, a, True), "memory": knots(u_mar, n, False)}
    if support is not None:
        out["read_support"] = knots(np.asarray(support, float), a, True)
    if min(c.sum(), (~c).sum()) >= MIN_SPLIT:
        out["memory_confirmed"] = knots(u_mar[c], n[c], False)
        out["memory_unconfirmed"] = knots(u_mar[~c], n[~c], False)
    return out


def parts(sig: Signals, p: GateParams = GateParams()) -> tuple[float, float, float, float]:
    """(s_1, U_mar, P(Always right | s_1), P(Never right | U_mar, confirmed)) for one question."""
    if sig.evidence is None:
        raise ValueError("the evidence gate needs the search's passages; the runner searches before it decides")
    cal = p.calibration or calibration_for(sig.model)
    s1 = top_similarity(sig)
    u_mar = margin_score(list(sig.gaps)[: p.k], p.beta)
    p_read = read_probability(cal, s1, sig.support)
    mem = memory_fit(cal, sig.confirmed)
    p_mem = interp(mem["x"], mem["y"], u_mar)
    return s1, u_mar, p_read, p_mem


def read_probability(cal: Mapping, s1: float, support: float | None) -> float:
    """P(Always right | s_1, support): the mean of the two calibrations (it ranked "reading helps"
    better on the dev halves than their product over P(A), results/evidence_selection.md);
    P(A | s_1) alone where the fit has no support calibration (fits made before it) or the runner
    gave no support."""
    p = interp(cal["read"]["x"], cal["read"]["y"], s1)
    sup = cal.get("read_support")
    if sup is None or support is None:
        return p
    return (p + interp(sup["x"], sup["y"], support)) / 2


def evidence_score(p_read: float, p_mem: float) -> float:
    """U_evi = P(Always right) * P(Never wrong), in [0, 1]: larger means reading likelier helps."""
    return p_read * (1.0 - p_mem)


class EvidenceGate(Gate):
    name, needs = "evidence", frozenset({DRAFT, SEARCH})
    # a model with no fit of its own reads through the pooled fit, so at the pooled fit's tau (30% of
    # its dev questions), not at a placeholder: at 0.05 SmolLM2 and Qwen 1.5B read 30-88% of their
    # test questions with it (scripts/analysis/transfer_calibration.py)
    default_tau = float(calibrations()[DEFAULT_KEY]["tau"])

    def model_tau(self, model: str) -> float | None:
        """The tau fitted beside this model's calibration (a 30% reading rate on its dev records)."""
        cal = shipped_calibration(model)
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
        # the support, where the runner gave it: how much of the question the best sentence names
        held = f"; one sentence holds {sig.support:.0%} of the question" if sig.support is not None else ""
        if retrieve:
            why = (f"model {'unsure' if unsure else 'may know'} (U {u_mar:.2f}), strong evidence "
                   f"({s1:.2f}{title}{held}) → read {len(sig.evidence or ())} passages")
        elif sig.confirmed:
            why = f"the passages say what the model would say ({s1:.2f}{title}) → answered from memory"
        elif p_read <= 1.0 - p_mem:  # the evidence, not the model's confidence, is what held it back
            why = f"weak evidence (best {s1:.2f}{title}{held}) → answered from memory"
        else:
            why = f"model sure (U {u_mar:.2f}) → answered from memory"
        no_source = not retrieve and unsure and p_read <= 1.0 - p_mem and not sig.confirmed
        return GateDecision(retrieve, float(u), float(tau), self.name, why, no_source)


register(EvidenceGate())
