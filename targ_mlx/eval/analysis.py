"""Every number of the report, computed from records (no text here; report.py renders it).

Each analysis runs on both metrics: EM and accuracy (a gold answer contained). The headline is
the informative one: when EM stays below 2% for Never and Always alike (a small model answering in
sentences), accuracy carries the comparison and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from targ_mlx.eval import controls as ctl
from targ_mlx.eval import sweep
from targ_mlx.eval.sweep import Signals
from targ_mlx.gates import scored_names

METRICS = ("em", "acc")
LABEL = {"em": "EM", "acc": "accuracy"}
UNINFORMATIVE = 0.02  # a metric whose Never and Always means are both below this carries no comparison
PAPER_TAUS = (0.3, 0.5, 0.65, 0.8)  # the paper's prefix-length ablation grid (Table: k x tau)
MATCHED_RATES = (0.05, 0.1, 0.2, 0.3)
RECHECK_TAUS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
RECHECK_EVERY = 10

CI = tuple[float, float, float]  # estimate, 2.5%, 97.5%


def headline_metric(sig: Signals) -> str:
    """Accuracy when EM is uninformative for this model (both branches below 2%), else EM."""
    em = max(float(sig.never["em"].mean()), float(sig.always["em"].mean()))
    return "acc" if em < UNINFORMATIVE else "em"


@dataclass(frozen=True)
class Verdict:
    """A budget-calibrated gate (margin unless said) on the test split, for one metric: three questions."""

    metric: str
    rho: float
    tau: float
    k: int
    rate: float
    gate: float
    never: float
    always: float
    vs_never: CI
    vs_always: CI
    vs_random: CI  # paired: the gate minus a random gate's expected outcome at the same rate
    random: ctl.RandomControl
    oracle: float  # best any gate can do at the same rate on the same questions
    n: int
    gate_name: str = "margin"

    def answers(self) -> dict[str, str]:
        def yes(ci: CI) -> str:
            return "yes" if ci[1] > 0 else ("no (worse)" if ci[2] < 0 else "not shown (CI includes 0)")

        return {"never": yes(self.vs_never), "always": yes(self.vs_always), "random": yes(self.vs_random)}


def verdict(sig: Signals, dev: np.ndarray, test: np.ndarray, metric: str, k: int, n_boot: int, seed: int,
            gate: str = "margin") -> Verdict:
    """rho in BUDGETS chosen by dev score on `metric`, tau from dev by the one rule, judged on test."""
    d, t = sig.subset(dev), sig.subset(test)
    best = None
    for rho in sweep.BUDGETS:
        tau = sweep.tau_for_budget(d.u[gate][k], rho)
        score = float(ctl.gated(d.u[gate][k] > tau, d.never[metric], d.always[metric]).mean())
        if best is None or score > best[0] + 1e-12:
            best = (score, rho, tau)
    _, rho, tau = best
    r = t.u[gate][k] > tau
    nv, al = t.never[metric], t.always[metric]
    g = ctl.gated(r, nv, al)
    rate = float(r.mean())
    return Verdict(metric, rho, tau, k, rate, float(g.mean()), float(nv.mean()), float(al.mean()),
                   sweep.paired_ci(g, nv, n_boot, seed), sweep.paired_ci(g, al, n_boot, seed),
                   sweep.paired_ci(g, ctl.random_expected(nv, al, rate), n_boot, seed),
                   ctl.random_control(r, nv, al, n_boot, seed), ctl.oracle_score(nv, al, rate), t.n, gate)


@dataclass(frozen=True)
class Control:
    """A gate's operating point beside the random gate and the oracle at its own rate."""

    name: str
    rate: float
    score: float
    random: ctl.RandomControl
    oracle: float


def control_point(name: str, retrieve: np.ndarray, never: np.ndarray, always: np.ndarray, n_draws: int,
                  seed: int) -> Control:
    rc = ctl.random_control(retrieve, never, always, n_draws, seed)
    return Control(name, rc.rate, rc.gate, rc, ctl.oracle_score(never, always, rc.rate))


def trivial_scores(sig: Signals) -> dict[str, np.ndarray]:
    """Signals a reviewer tries before believing in logits (higher = retrieve): draft length,
    question length and, where the dataset has it (PopQA), low subject popularity."""
    out = {"draft length": sig.draft_len, "question length": sig.qlen, "top-1 similarity": sig.top_sim}
    if np.isfinite(sig.pop).all():
        out["low popularity (−log s_pop)"] = -np.log10(sig.pop + 1.0)
    return out


def baseline_scores(sig: Signals) -> dict[str, np.ndarray]:
    """The reflective baselines as scores (higher = retrieve), where the records have the probes."""
    out = {"FLARE (1 − min p)": 1.0 - sig.min_p}
    if np.isfinite(sig.p_need).all():
        out["Self-Eval (P yes)"] = sig.p_need
        out["Self-RAG-lite (1 − P supported)"] = 1.0 - sig.p_supported
    return out


def all_scores(sig: Signals, ks: Sequence[int]) -> dict[str, np.ndarray]:
    out = {}
    for g in scored_names():
        for k in ks:
            if np.isfinite(sig.u[g][k]).all():
                out[f"{g} k={k}"] = sig.u[g][k]
    return {**out, **trivial_scores(sig), **baseline_scores(sig)}


NAN_CI: CI = (float("nan"),) * 3


@dataclass(frozen=True)
class AurocRow:
    """AUROCs of one score. "Retrieval helps" needs both of: the model is wrong closed-book, and
    retrieval then gets it right; `rescued` and `covered` say which of the two a score misses."""

    name: str
    never_wrong: CI
    helps: CI
    rescued: CI = NAN_CI  # Always right, among the questions Never gets wrong
    covered: CI = NAN_CI  # an answer string in the top-K passages (hit@K), all questions


MIN_CLASS = 10  # an AUROC from fewer questions in either class is not reported


def auroc_or_nan(score: np.ndarray, label: np.ndarray | None, n_boot: int, seed: int) -> CI:
    """AUROC with its bootstrap CI, or NaNs without a label or with fewer than MIN_CLASS in a class."""
    if label is None or min(label.sum(), (~label).sum()) < MIN_CLASS:
        return NAN_CI
    return ctl.auroc_ci(score, label, n_boot, seed)


def aurocs(sig: Signals, metric: str, ks: Sequence[int], n_boot: int, seed: int) -> list[AurocRow]:
    lab = ctl.labels(sig.never[metric], sig.always[metric])
    wrong = lab["never_wrong"]
    rescued = sig.always[metric][wrong] >= 0.5
    covered = sig.hit > 0.5 if np.isfinite(sig.hit).all() else None

    def ci(s, y):
        return auroc_or_nan(s, y, n_boot, seed)

    return [AurocRow(name, ci(s, wrong), ci(s, lab["helps"]), ci(s[wrong], rescued), ci(s, covered))
            for name, s in all_scores(sig, ks).items()]


@dataclass(frozen=True)
class MatchedRow:
    """Each method retrieving the top `rate` share of the test split by its own score."""

    name: str
    scores: dict[float, float]  # rate -> mean outcome


def matched_budgets(t: Signals, k: int, metric: str, skr: np.ndarray | None,
                    rates: Sequence[float] = MATCHED_RATES) -> list[MatchedRow]:
    nv, al = t.never[metric], t.always[metric]
    named = {f"TARG {g} (k={k})": t.u[g][k] for g in scored_names() if np.isfinite(t.u[g][k]).all()}
    named.update(baseline_scores(t))
    if skr is not None:
        named["SKR (kNN on dev labels)"] = skr
    named.update(trivial_scores(t))
    rows = [MatchedRow(n, {r: float(ctl.gated(ctl.retrieve_top(s, r), nv, al).mean()) for r in rates})
            for n, s in named.items()]
    rows.append(MatchedRow("random (expected)", {r: float(ctl.random_expected(nv, al, round(r * t.n) / t.n).mean())
                                                 for r in rates}))
    rows.append(MatchedRow("oracle (ceiling)", {r: ctl.oracle_score(nv, al, r) for r in rates}))
    return rows


def quadrants(sig: Signals, metric: str, k: int, tau: float) -> dict[str, float]:
    return sweep.quadrants(sig.u["margin"][k], sig.always[metric] - sig.never[metric], tau)


@dataclass(frozen=True)
class Cell:
    score: float
    rate: float


def k_grid(sig: Signals, metric: str, taus: Sequence[float] = PAPER_TAUS) -> dict[int, list[Cell]]:
    """The paper's prefix-length ablation: margin gate at fixed tau for every recorded k."""
    out = {}
    for k in sig.ks:
        u = sig.u["margin"][k]
        out[k] = [Cell(float(ctl.gated(u > t, sig.never[metric], sig.always[metric]).mean()), float((u > t).mean()))
                  for t in taus]
    return out


def k_at_budget(sig: Signals, metric: str, rates: Sequence[float] = MATCHED_RATES) -> dict[int, list[Cell]]:
    """1-D slice: score against k with tau set to each budget by the one tau rule (Fig. S3 right)."""
    out = {}
    for k in sig.ks:
        u = sig.u["margin"][k]
        cells = []
        for r in rates:
            tau = sweep.tau_for_budget(u, r)
            cells.append(Cell(float(ctl.gated(u > tau, sig.never[metric], sig.always[metric]).mean()), float((u > tau).mean())))
        out[k] = cells
    return out


def tau_slice(sig: Signals, metric: str, k: int) -> list[tuple[float, Cell]]:
    """1-D slice: score against tau at fixed k over 20 quantiles of U (Fig. S3 left)."""
    u = sig.u["margin"][k]
    return [(t, Cell(float(ctl.gated(u > t, sig.never[metric], sig.always[metric]).mean()), float((u > t).mean())))
            for t in sweep.thresholds(u)]


def recheck_retrieve(gaps: Sequence[Sequence[float]], tau: float, every: int, beta: float) -> np.ndarray:
    """Dynamic re-check (Alg. 1 with stride m) read from the records: retrieve iff the margin U of
    the running greedy prefix exceeds tau at any checkpoint m, 2m, ... within the recorded steps."""
    from targ_mlx.gates import margin_score

    out = np.zeros(len(gaps), bool)
    for i, g in enumerate(gaps):
        for end in range(every, len(g) + every, every):
            if margin_score(g[: min(end, len(g))], beta) > tau:
                out[i] = True
                break
    return out


@dataclass(frozen=True)
class RecheckRow:
    tau: float
    single: Cell
    recheck: Cell


def recheck(sig: Signals, metric: str, k: int, beta: float, every: int = RECHECK_EVERY,
            taus: Sequence[float] = RECHECK_TAUS) -> list[RecheckRow]:
    gaps = [r["gaps"] for r in sig.records]
    nv, al = sig.never[metric], sig.always[metric]
    rows = []
    for t in taus:
        s, rc = sig.u["margin"][k] > t, recheck_retrieve(gaps, t, every, beta)
        rows.append(RecheckRow(t, Cell(float(ctl.gated(s, nv, al).mean()), float(s.mean())),
                               Cell(float(ctl.gated(rc, nv, al).mean()), float(rc.mean()))))
    return rows


@dataclass(frozen=True)
class VarianceLength:
    """How much of U_var is answer length: samples that stop early agree on 'stopped'."""

    k: int
    spearman_len: float  # rank correlation of U_var with the greedy draft's length
    auroc_short: CI  # AUROC of U_var for "the greedy draft ended before k tokens"
    share_short: float


def variance_vs_length(sig: Signals, k: int, n_boot: int, seed: int) -> VarianceLength | None:
    u = sig.u["variance"][k]
    if not np.isfinite(u).all():
        return None
    short = sig.draft_len < k
    return VarianceLength(k, ctl.spearman(u, sig.draft_len), ctl.auroc_ci(u, short, n_boot, seed), float(short.mean()))


@dataclass
class Analysis:
    headline: str
    k: int
    n: int
    verdicts: dict[str, Verdict]
    table1: dict[str, list]  # metric -> [(name, Point or None, Control or None)]
    aurocs: dict[str, list[AurocRow]]
    matched: dict[str, list[MatchedRow]]
    quadrants: dict[str, dict[str, float]]
    k_grid: dict[str, dict[int, list[Cell]]]
    k_at_budget: dict[str, dict[int, list[Cell]]]
    tau_slice: dict[str, list]
    recheck: dict[str, list[RecheckRow]]
    variance_length: VarianceLength | None
    deciles: dict[str, dict[str, list]]
    hit_at_k: float | None
    extra: dict = field(default_factory=dict)
    # the same verdict for every gate compared (margin and the search-first evidence gate)
    gate_verdicts: dict[str, dict[str, Verdict]] = field(default_factory=dict)
    vs_margin: dict[str, dict[str, CI]] = field(default_factory=dict)  # gate -> metric -> (gate − margin) on test


VERDICT_GATES = ("margin", "evidence")  # the paper's headline gate and the shipped search-first gate


def gate_vs_margin(sig: Signals, test: np.ndarray, v: Verdict, vm: Verdict, gate: str, n_boot: int, seed: int) -> CI:
    """Paired CI of (gate − margin gate) on the test split, each at its own dev-chosen tau."""
    t = sig.subset(test)
    nv, al = t.never[v.metric], t.always[v.metric]
    g = ctl.gated(t.u[gate][v.k] > v.tau, nv, al)
    m = ctl.gated(t.u["margin"][vm.k] > vm.tau, nv, al)
    return sweep.paired_ci(g, m, n_boot, seed)


def analyse(sig: Signals, points, k: int, seed: int, n_boot: int, beta: float, skr_test: np.ndarray | None,
            dev: np.ndarray, test: np.ndarray) -> Analysis:
    """All numbers for one dataset (one model, one corpus)."""
    t = sig.subset(test)
    verdicts = {m: verdict(sig, dev, test, m, k, n_boot, seed) for m in METRICS}
    table1 = {}
    for m in METRICS:
        rows = []
        for g in scored_names():
            p = sweep.best_at_budget(points, g, k, 0.05, 0.30, metric=m)
            c = None if p is None else control_point(g, sig.u[g][k] > p.tau, sig.never[m], sig.always[m], n_boot, seed)
            rows.append((g, p, c))
        table1[m] = rows
    tau_q = verdicts["acc" if headline_metric(sig) == "acc" else "em"].tau
    gate_verdicts = {g: {m: verdict(sig, dev, test, m, k, n_boot, seed, gate=g) for m in METRICS}
                     for g in VERDICT_GATES if g in sig.u and np.isfinite(sig.u[g][k]).all()}
    vs_margin = {g: {m: gate_vs_margin(sig, test, v[m], verdicts[m], g, n_boot, seed) for m in METRICS}
                 for g, v in gate_verdicts.items() if g != "margin"}
    hits = [r.get("always", {}).get("hit") for r in sig.records]
    return Analysis(
        headline=headline_metric(sig), k=k, n=sig.n, verdicts=verdicts, table1=table1,
        aurocs={m: aurocs(sig, m, sig.ks, n_boot, seed) for m in METRICS},
        matched={m: matched_budgets(t, k, m, skr_test) for m in METRICS},
        quadrants={m: quadrants(sig.subset(dev), m, k, tau_q) for m in METRICS},
        k_grid={m: k_grid(sig, m) for m in METRICS},
        k_at_budget={m: k_at_budget(sig, m) for m in METRICS},
        tau_slice={m: tau_slice(sig, m, k) for m in METRICS},
        recheck={m: recheck(sig, m, k, beta) for m in METRICS},
        variance_length=variance_vs_length(sig, k, n_boot, seed),
        deciles={m: {g: sweep.deciles(sig.u[g][k], sig.never[m]) for g in scored_names() if np.isfinite(sig.u[g][k]).all()}
                 for m in METRICS},
        hit_at_k=float(np.mean(hits)) if hits and all(h is not None for h in hits) else None,
        gate_verdicts=gate_verdicts, vs_margin=vs_margin,
    )
