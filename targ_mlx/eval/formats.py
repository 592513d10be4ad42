"""How the eval's reports name gates and print numbers, shared by the per-dataset report and the
cross-dataset tables."""

from __future__ import annotations

import numpy as np

from targ_mlx.eval import baselines as bl

_NAMES = {"never": "Never", "always": "Always", "entropy": "Entropy", "margin": "Margin", "variance": "Variance",
         "evidence": "Evidence (search first)", **bl.LABELS}


def label(method: str) -> str:
    """A gate's or baseline's name in a table; a gate registered later shows under its own name."""
    return _NAMES.get(method) or method.replace("_", " ").capitalize()


def pct(x: float | None) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{100 * x:.1f}"


def ci(ci) -> str:
    est, lo, hi = ci
    return f"{100 * est:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def auc(ci) -> str:
    est, lo, hi = ci
    return "-" if not np.isfinite(est) else f"{est:.2f} [{lo:.2f}, {hi:.2f}]"
