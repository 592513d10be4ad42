"""PNG figures (matplotlib, Agg) from an `Analysis`, on its headline metric: the frontier of each
gate against retrieval rate with the random diagonal and the oracle curve, score against Δ latency,
Never-RAG score by U decile, the margin gate over (k, budget) and its 1-D slices (Fig. S3)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from targ_mlx.eval import analysis as an
from targ_mlx.eval import controls as ctl
from targ_mlx.eval import sweep
from targ_mlx.eval.sweep import Point, Signals
from targ_mlx.gates import scored_names

HEAT_RATES = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _mark(ax, never: Point, always: Point, m: str, x_never: float, x_always: float) -> None:
    ax.scatter([x_never], [100 * getattr(never, m)], marker="s", color="black", zorder=5, label="Never")
    ax.scatter([x_always], [100 * getattr(always, m)], marker="^", color="red", zorder=5, label="Always")


def write_all(sig: Signals, a: an.Analysis, points: Sequence[Point], never: Point, always: Point, out: Path) -> list[Path]:
    plt = _plt()
    out, k, m = Path(out), a.k, a.headline
    lab = an.LABEL[m]
    paths = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for g in scored_names():
        pts = sorted((p for p in points if p.method == g and p.k == k), key=lambda p: p.rate)
        ax.plot([p.rate for p in pts], [100 * getattr(p, m) for p in pts], marker=".", label=f"{g} (k={k})")
    rates = np.linspace(0, 1, 41)
    ax.plot([0, 1], [100 * getattr(never, m), 100 * getattr(always, m)], "k--", lw=1, label="random gate (expected)")
    ax.plot(rates, [100 * ctl.oracle_score(sig.never[m], sig.always[m], r) for r in rates], ":", color="grey",
            label="oracle (ceiling)")
    _mark(ax, never, always, m, 0.0, 1.0)
    ax.set(xlabel="retrieval rate", ylabel=f"{lab} (%)", title=f"{lab} vs retrieval rate")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / f"frontier_{m}_rate.png"))

    if never.dlat is not None:
        fig, ax = plt.subplots(figsize=(6, 4))
        for g in scored_names():
            pts = sorted((p for p in points if p.method == g and p.k == k and p.dlat is not None), key=lambda p: p.dlat)
            ax.plot([p.dlat for p in pts], [100 * getattr(p, m) for p in pts], marker=".", label=g)
        _mark(ax, never, always, m, 0.0, always.dlat or 0.0)
        ax.set(xlabel="Δ latency vs Never (s/q, batch 1)", ylabel=f"{lab} (%)", title=f"{lab} vs Δ latency")
        ax.legend(fontsize=8)
        paths.append(_save(fig, out / f"{m}_vs_latency.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for g, dec in a.deciles[m].items():
        ax.plot(range(1, len(dec) + 1), [100 * x for _, _, x in dec], marker="o", label=g)
    ax.set(xlabel="U decile (1 = most confident)", ylabel=f"Never-RAG {lab} (%)", title=f"Base {lab} by U decile (k={k})")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / f"{m}_by_u_decile.png"))

    grid = np.array([[100 * float(ctl.gated(sig.u["margin"][kk] > sweep.tau_for_budget(sig.u["margin"][kk], r),
                                            sig.never[m], sig.always[m]).mean()) for r in HEAT_RATES] for kk in sig.ks])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", origin="lower")
    ax.set_xticks(range(len(HEAT_RATES)), [f"{r:g}" for r in HEAT_RATES])
    ax.set_yticks(range(len(sig.ks)), [str(x) for x in sig.ks])
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", fontsize=7, color="white")
    ax.set(xlabel="retrieval budget ρ (τ = F_U⁻¹(1 − ρ) per k)", ylabel="k", title=f"Margin gate {lab} (%) over (k, τ)")
    fig.colorbar(im, ax=ax)
    paths.append(_save(fig, out / f"heatmap_margin_k_tau_{m}.png"))

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    sl = a.tau_slice[m]
    left.plot([t for t, _ in sl], [100 * c.score for _, c in sl], marker=".")
    left.set(xlabel="τ", ylabel=f"{lab} (%)", title=f"margin, k = {k}: {lab} vs τ")
    for j, r in enumerate(an.MATCHED_RATES):
        right.plot(sig.ks, [100 * a.k_at_budget[m][kk][j].score for kk in sig.ks], marker="o", label=f"ρ = {r:g}")
    right.set(xlabel="k", ylabel=f"{lab} (%)", title=f"margin: {lab} vs k at a fixed budget")
    right.legend(fontsize=8)
    paths.append(_save(fig, out / f"slices_margin_{m}.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
