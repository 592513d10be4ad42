"""The cross-dataset tables: tau transfer between datasets, and the overview of every gate's verdict."""

from __future__ import annotations

from targ_mlx.eval import analysis as an
from targ_mlx.eval import sweep
from targ_mlx.eval.formats import auc as _auc
from targ_mlx.eval.formats import ci as _ci
from targ_mlx.eval.formats import pct as _pct


def transfer_table(summaries: dict[str, dict], k: int = 20) -> str:
    """Cross-dataset tau transfer (margin gate), per metric: each source's best tau applied to each target."""
    lines = [f"# Cross-dataset τ transfer (margin, k = {k}; the source's best τ applied zero-shot)", ""]
    for m in an.METRICS:
        lab = an.LABEL[m]
        lines += [f"## {lab}", "", f"| Source → target | τ | Transferred {lab} (%) | Re-tuned {lab} (%) | Δ |",
                  "|---|---|---|---|---|"]
        for src, s in summaries.items():
            tau = (s.get("best_margin_tau") or {}).get(m)
            if tau is None:
                continue
            for dst, d in summaries.items():
                if dst == src or "signals" not in d or d["signals"].n == 0:
                    continue
                sig, kk = d["signals"], d.get("k", k)
                moved = sweep.gate_point(sig, "margin", kk, tau)
                best = sweep.best_overall(sweep.gate_points(sig, ("margin",), (kk,)), "margin", kk, metric=m)
                lines.append(f"| {src} → {dst} | {tau:.3g} | {_pct(getattr(moved, m))} | {_pct(getattr(best, m))} | "
                             f"{100 * (getattr(moved, m) - getattr(best, m)):+.1f} |")
        lines += [""]
    return "\n".join(lines)


def overview_table(summaries: dict[str, dict]) -> str:
    """One row per dataset, gate and metric (the headline, and accuracy): each budget-calibrated gate's verdict
    (the paper's margin gate, and the search-first evidence gate) beside the random gate and the oracle at the
    same rate, its AUROCs and the index's hit@K; the evidence gate's rate is its reading rate."""
    lines = ["# Overview: budget-calibrated gates (k = 20) per dataset, headline metric (and accuracy), test split", "",
             "The margin gate is the paper's; the evidence gate searches first and decides whether to read "
             "(its rate is the reading rate; it searches every question). gate − margin: paired, each at its own τ.", "",
             "| dataset | gate | metric | n test | Never | Always | gate @ rate | random @ rate [95% band] | oracle @ rate | "
             "gate − Never [95% CI] | gate − Always | gate − random | P(random ≥ gate) | gate − margin | "
             "AUROC never wrong | AUROC helps | hit@5 |", "|---" * 17 + "|"]
    for name, s in summaries.items():
        a = s.get("analysis")
        if a is None:
            continue
        by_gate = a.gate_verdicts or {"margin": a.verdicts}
        for g, verdicts in by_gate.items():
            # accuracy too where EM leads: the row that compares across models (EM is ~0 for small ones)
            for m in dict.fromkeys([a.headline, "acc"]):
                v = verdicts[m]
                row = next((r for r in a.aurocs[m] if r.name == f"{g} k={a.k}"), None)
                vs_m = _ci(a.vs_margin[g][m]) if g in a.vs_margin else "–"
                lines.append(f"| {name} | {g} | {an.LABEL[m]} | {v.n} | {_pct(v.never)} | {_pct(v.always)} | {_pct(v.gate)} @ "
                             f"{v.rate:.2f} | {_pct(v.random.expected)} [{_pct(v.random.lo)}, {_pct(v.random.hi)}] | "
                             f"{_pct(v.oracle)} | {_ci(v.vs_never)} | {_ci(v.vs_always)} | {_ci(v.vs_random)} | "
                             f"{v.random.p_at_least:.2f} | {vs_m} | {_auc(row.never_wrong) if row else '-'} | "
                             f"{_auc(row.helps) if row else '-'} | {_pct(a.hit_at_k)} |")
    return "\n".join(lines) + "\n"
