"""PNG figures (matplotlib, Agg): EM vs retrieval-rate frontier per gate, EM vs Δ latency, base EM
by U decile, and the margin gate's EM heatmap over (k, tau)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from targ_mlx.eval import sweep
from targ_mlx.eval.sweep import Point, Signals
from targ_mlx.gates import SCORED_GATES

HEAT_TAUS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _mark(ax, never: Point, always: Point, x_never: float, x_always: float) -> None:
    ax.scatter([x_never], [100 * never.em], marker="s", color="black", zorder=5, label="Never")
    ax.scatter([x_always], [100 * always.em], marker="^", color="red", zorder=5, label="Always")


def write_all(sig: Signals, points: Sequence[Point], never: Point, always: Point, out: Path, k: int) -> list[Path]:
    plt = _plt()
    out = Path(out)
    paths = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for g in SCORED_GATES:
        pts = sorted((p for p in points if p.method == g and p.k == k), key=lambda p: p.rate)
        ax.plot([p.rate for p in pts], [100 * p.em for p in pts], marker=".", label=f"{g} (k={k})")
    _mark(ax, never, always, 0.0, 1.0)
    ax.set(xlabel="retrieval rate", ylabel="EM (%)", title="EM vs retrieval rate")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "frontier_em_rate.png"))

    if never.dlat is not None:
        fig, ax = plt.subplots(figsize=(6, 4))
        for g in SCORED_GATES:
            pts = sorted((p for p in points if p.method == g and p.k == k and p.dlat is not None), key=lambda p: p.dlat)
            ax.plot([p.dlat for p in pts], [100 * p.em for p in pts], marker=".", label=g)
        _mark(ax, never, always, 0.0, always.dlat or 0.0)
        ax.set(xlabel="Δ latency vs Never (s/q, batch 1)", ylabel="EM (%)", title="EM vs Δ latency")
        ax.legend(fontsize=8)
        paths.append(_save(fig, out / "em_vs_latency.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for g in SCORED_GATES:
        dec = sweep.deciles(sig.u[g][k], sig.never["em"])
        ax.plot(range(1, len(dec) + 1), [100 * m for _, _, m in dec], marker="o", label=g)
    ax.set(xlabel="U decile (1 = most confident)", ylabel="Never-RAG EM (%)", title=f"Base EM by U decile (k={k})")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "em_by_u_decile.png"))

    grid = np.array([[sweep.gate_point(sig, "margin", kk, t).em * 100 for t in HEAT_TAUS] for kk in sig.ks])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", origin="lower")
    ax.set_xticks(range(len(HEAT_TAUS)), [f"{t:g}" for t in HEAT_TAUS])
    ax.set_yticks(range(len(sig.ks)), [str(x) for x in sig.ks])
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", fontsize=7, color="white")
    ax.set(xlabel="τ", ylabel="k", title="Margin gate EM (%) over (k, τ)")
    fig.colorbar(im, ax=ax)
    paths.append(_save(fig, out / "heatmap_margin_k_tau.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
