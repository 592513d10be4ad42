"""Operating points from records: pure numpy over the one-pass signals, no model.

Every (gate, k, tau) point retrieves iff U > tau; its answer is the record's Always answer where it
retrieves and the Never answer elsewhere (a skipped answer continues the greedy draft, so it is
token for token the Never answer). tau runs over quantiles of U's empirical CDF plus fixed values.
Latency of a point is priced from batch-1 stage timings on a sample (latency.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from targ_mlx.gates import scored_names

N_QUANTILES = 20
FIXED_TAUS = {
    "entropy": (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0),
    "margin": (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8),
    "variance": (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7),
}
METRICS = ("em", "f1", "acc")
# reading budgets the verdicts choose from on dev; 0.4 since a search-first gate can read more
# often for the same latency (the aim: reach Always while reading for <= 40%)
BUDGETS = (0.05, 0.1, 0.2, 0.3, 0.4)


@dataclass(frozen=True)
class Point:
    method: str  # never | always | entropy | margin | variance | selfeval | flare | selfrag | crag | skr
    k: int | None
    tau: float | None  # the threshold (theta for baselines)
    rate: float  # retrieval rate
    em: float
    f1: float
    acc: float
    tok_draft: float  # mean tokens per query by stage: the paper's E[T(tau)] terms
    tok_ctx: float
    tok_out: float
    dlat: float | None  # seconds per query over Never-RAG (batch-1 sample); None without timings
    n: int
    used_ctx: float | None = None  # CRAG-lite: share of queries that kept the context

    @property
    def tokens(self) -> float:
        return self.tok_draft + self.tok_ctx + self.tok_out

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens": self.tokens}


class Signals:
    """Column arrays over records (one row per question)."""

    def __init__(self, records: Sequence[dict], latency: dict[str, dict] | None = None,
                 meta: dict[str, dict] | None = None):
        self.records = list(records)
        self.meta = meta or {}
        self.n = len(self.records)
        self.ids = [r["id"] for r in self.records]
        self.never = {m: np.array([r["never"][m] for r in self.records], float) for m in METRICS}
        self.always = {m: np.array([r["always"][m] for r in self.records], float) for m in METRICS}
        self.ks = sorted({int(k) for r in self.records for k in r["scores"]["margin"]})
        self.u = {g: {k: np.array([r["scores"].get(g, {}).get(str(k), np.nan) for r in self.records], float)
                      for k in self.ks} for g in scored_names()}
        self.draft_len = np.array([len(r["draft"]) for r in self.records], float)
        self.qlen = np.array([len(r["question"].split()) for r in self.records], float)
        # subject popularity (PopQA's s_pop, Wikipedia page views) where the dataset has it
        self.pop = np.array([float(self.meta.get(q, {}).get("s_pop", np.nan)) for q in self.ids], float)
        self.out_never = np.array([r["never"]["tok_out"] for r in self.records], float)
        self.out_always = np.array([r["always"]["tok_out"] for r in self.records], float)
        self.ctx = np.array([r["always"]["tok_ctx"] for r in self.records], float)
        self.delta = self.always["em"] - self.never["em"]
        probe = lambda key: np.array([r.get("probes", {}).get(key, np.nan) for r in self.records], float)  # noqa: E731
        self.p_need, self.p_supported, self.p_relevant = probe("p_need"), probe("p_supported"), probe("p_relevant")
        self.min_p = np.array([np.exp(min(r["logprobs"])) if r["logprobs"] else 1.0 for r in self.records])
        # an answer string in the top-K passages (hit@K); NaN in records made before it was kept
        self.hit = np.array([float(r["always"]["hit"]) if r["always"].get("hit") is not None else np.nan
                             for r in self.records], float)
        # the search's best similarity (the packed top passage), a trivial gate for TARG's scores
        self.top_sim = np.array([max((p[2] for p in r["always"].get("passages") or []), default=0.0)
                                 for r in self.records], float)
        self.latency = latency or {}
        self.lat_rows = np.array([i for i, q in enumerate(self.ids) if q in self.latency], int)

    def lat(self, key: str) -> np.ndarray:
        return np.array([self.latency[self.ids[i]][key] for i in self.lat_rows], float)

    def subset(self, idx: np.ndarray) -> "Signals":
        return Signals([self.records[i] for i in idx], self.latency, self.meta)


def thresholds(u: np.ndarray, fixed: Sequence[float] = (), n_quantiles: int = N_QUANTILES) -> list[float]:
    """tau at the 0, 1/n, ..., 1 quantiles of U's empirical CDF (retrieval rates 1 .. 0) plus fixed values."""
    u = u[np.isfinite(u)]
    if len(u) == 0:
        return sorted(set(fixed))
    qs = np.quantile(u, np.linspace(0.0, 1.0, n_quantiles + 1))
    return sorted({round(float(t), 6) for t in qs} | {float(t) for t in fixed})


def evaluate(sig: Signals, retrieve: np.ndarray, method: str, k: int | None, tau: float | None,
             tok_draft: np.ndarray | float = 0.0, dlat: float | None = None, used_ctx: np.ndarray | None = None) -> Point:
    """Score a retrieval decision per question: Always answer where it retrieves (and uses the
    context), Never answer elsewhere."""
    use = retrieve if used_ctx is None else used_ctx
    m = {x: float(np.mean(np.where(use, sig.always[x], sig.never[x]))) for x in METRICS}
    tok_ctx = float(np.mean(np.where(use, sig.ctx, 0.0)))
    tok_out = float(np.mean(np.where(use, sig.out_always, sig.out_never)))
    return Point(method, k, tau, float(np.mean(retrieve)), m["em"], m["f1"], m["acc"], float(np.mean(tok_draft)),
                 tok_ctx, tok_out, dlat, sig.n, None if used_ctx is None else float(np.mean(used_ctx)))


def _dlat(sig: Signals, cost_of) -> float | None:
    """Mean over the timed sample of cost_of(row_indices) minus the plain Never-RAG time."""
    if len(sig.lat_rows) == 0:
        return None
    return float(np.mean(cost_of(sig.lat_rows)) - np.mean(sig.lat("never")))


def gate_dlat(sig: Signals, gate: str, retrieve: np.ndarray) -> float | None:
    """Added seconds over Never: the draft, then reading (search + B(q)+C) or continuing the draft;
    a gate that looks at the search first pays the search on every question."""
    from targ_mlx import gates

    needs = gates.get(gate).needs
    suffix = "_var" if gates.SAMPLES in needs else ""
    search_first = gates.SEARCH in needs

    def cost(rows):
        r = retrieve[rows]
        read = sig.lat("draft" + suffix) + sig.lat("retrieval") + sig.lat("rag")
        skip = sig.lat("skip" + suffix) + (sig.lat("retrieval") if search_first else 0.0)
        return np.where(r, read, skip)

    return _dlat(sig, cost)


def never_point(sig: Signals) -> Point:
    p = evaluate(sig, np.zeros(sig.n, bool), "never", None, None)
    base = float(np.mean(sig.lat("never"))) if len(sig.lat_rows) else None
    return Point(**{**asdict(p), "dlat": base})  # the Never row carries the absolute latency


def always_point(sig: Signals) -> Point:
    dl = _dlat(sig, lambda rows: sig.lat("retrieval") + sig.lat("rag"))
    return evaluate(sig, np.ones(sig.n, bool), "always", None, None, dlat=dl)


def gate_point(sig: Signals, gate: str, k: int, tau: float) -> Point:
    r = sig.u[gate][k] > tau
    return evaluate(sig, r, gate, k, tau, np.minimum(sig.draft_len, k), gate_dlat(sig, gate, r))


def gate_points(sig: Signals, gates: Sequence[str] | None = None, ks: Sequence[int] | None = None) -> list[Point]:
    out = []
    for g in gates or scored_names():
        for k in ks or sig.ks:
            if not np.isfinite(sig.u[g][k]).all():
                continue
            out += [gate_point(sig, g, k, t) for t in thresholds(sig.u[g][k], FIXED_TAUS.get(g, ()))]
    return out


def best_at_budget(points: Sequence[Point], method: str, k: int | None, lo: float = 0.05, hi: float = 0.30,
                   metric: str = "em") -> Point | None:
    """The best point of a method (at one k) with retrieval rate in [lo, hi]; ties go to the cheaper."""
    cands = [p for p in points if p.method == method and (k is None or p.k == k) and lo <= p.rate <= hi]
    return max(cands, key=lambda p: (getattr(p, metric), -p.rate), default=None)


def best_overall(points: Sequence[Point], method: str, k: int | None, metric: str = "em") -> Point | None:
    cands = [p for p in points if p.method == method and (k is None or p.k == k)]
    return max(cands, key=lambda p: (getattr(p, metric), -p.rate), default=None)


def split(n: int, seed: int, dev_fraction: float = 0.5, pool: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Seeded disjoint dev/test row indices.

    With `pool`, the split is drawn over the first `pool` rows alone and every later row is test: a
    cell recorded at `--limit pool` and extended later (`--split-pool`) keeps the dev half its
    budgets and calibrations were chosen on, so the added questions are held out from all of them.
    """
    m = n if pool is None else min(pool, n)
    perm = np.random.default_rng(seed).permutation(m)
    cut = int(round(m * dev_fraction))
    return np.sort(perm[:cut]), np.concatenate([np.sort(perm[cut:]), np.arange(m, n)])


def split_pool(config: dict | None) -> int | None:
    """The `--split-pool` a cell's records were extended under (config.json), None for a plain cell."""
    return ((config or {}).get("args") or {}).get("split_pool")


def tau_for_budget(u_dev: np.ndarray, rho: float) -> float:
    """tau = F_U^{-1}(1 - rho) on dev: retrieve the top rho fraction (U > tau), by the same exact,
    tie-aware rule as `targ-calibrate` (calibration.budget_threshold), so a budget gives one tau."""
    from targ_mlx.calibration.thresholds import budget_threshold

    u = np.asarray(u_dev, float)
    return budget_threshold(u[np.isfinite(u)], rho)


@dataclass(frozen=True)
class Calibrated:
    rho: float
    tau: float
    dev_rate: float
    dev_em: float
    dev_acc: float
    test: Point


def calibrate(sig: Signals, gate: str, k: int, dev: np.ndarray, test: np.ndarray,
              budgets: Sequence[float] = BUDGETS) -> list[Calibrated]:
    """tau per budget from the dev split's CDF; realised rate and EM on the test split."""
    d, t = sig.subset(dev), sig.subset(test)
    out = []
    for rho in budgets:
        tau = tau_for_budget(d.u[gate][k], rho)
        dp = gate_point(d, gate, k, tau)
        out.append(Calibrated(rho, tau, dp.rate, dp.em, dp.acc, gate_point(t, gate, k, tau)))
    return out


def quadrants(u: np.ndarray, delta: np.ndarray, tau: float) -> dict[str, float]:
    """The paper's quadrants over (U, Delta) in % of queries: (a) low U, D>0; (b) high U, D<0;
    (c) high U, D>0; (d) low U, D<=0 (high U with D=0 is the remainder, reported as (e))."""
    hi = u > tau
    n = max(len(u), 1)
    pct = lambda m: 100.0 * float(np.sum(m)) / n  # noqa: E731
    return {"a": pct(~hi & (delta > 0)), "b": pct(hi & (delta < 0)), "c": pct(hi & (delta > 0)),
            "d": pct(~hi & (delta <= 0)), "e": pct(hi & (delta == 0))}


def deciles(u: np.ndarray, base: np.ndarray, bins: int = 10) -> list[tuple[float, float, float]]:
    """(low U, high U, mean base correctness) per U bin of equal count, low U first."""
    order = np.argsort(u, kind="stable")
    out = []
    for part in np.array_split(order, bins):
        if len(part):
            out.append((float(u[part].min()), float(u[part].max()), float(base[part].mean())))
    return out


def paired_ci(a: np.ndarray, b: np.ndarray, n: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Bootstrap 95% CI of mean(a - b) over questions (paired resampling)."""
    from targ_mlx.eval.metrics import bootstrap_ci

    return bootstrap_ci(np.asarray(a, float) - np.asarray(b, float), n=n, seed=seed)


def correct_vector(sig: Signals, retrieve: np.ndarray, metric: str = "em") -> np.ndarray:
    return np.where(retrieve, sig.always[metric], sig.never[metric])
