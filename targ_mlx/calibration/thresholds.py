"""Threshold fitting for the retrieval gate: numbers in, numbers out.

The paper's rule (Sec. "Threshold calibration and budget control") is to retrieve iff U > tau,
with tau = F_U^-1(1 - rho) for a retrieval budget rho, or the tau that maximises dev accuracy.
Nothing here knows about SQLite, config files or the model; `cli.py` feeds it logged rows.

Candidate thresholds are the distinct observed U values (rows equal to tau do not retrieve),
plus one just below the smallest value (everything retrieves). Every tau between two adjacent
observed values gives the same decisions on the data, so these candidates cover all of them.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# Two objective values closer than this are a tie (floating sums of 0/1 and F1 values).
_TIE = 1e-12


def _as_scores(scores: Sequence[float]) -> np.ndarray:
    u = np.asarray(scores, dtype=np.float64).reshape(-1)
    if u.size == 0:
        raise ValueError("scores is empty; need at least one logged U value")
    if not np.all(np.isfinite(u)):
        bad = u[~np.isfinite(u)][0]
        raise ValueError(
            f"scores must be finite; got {bad} (drop rows whose gate failed)"
        )
    return u


def _candidates(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidate taus in increasing order and the number of rows with U > tau for each."""
    values = np.unique(u)  # sorted ascending
    below_min = np.nextafter(values[0], -np.inf)
    taus = np.concatenate([[below_min], values])
    # For tau = values[i], rows above are those strictly greater: n - (rows <= values[i]).
    above = u.size - np.searchsorted(np.sort(u), taus, side="right")
    return taus, above


def retrieval_rate(scores: Sequence[float], tau: float) -> float:
    """Fraction of rows that retrieve at threshold tau (U > tau, strict)."""
    u = _as_scores(scores)
    return float(np.mean(u > tau))


def budget_threshold(scores: Sequence[float], rho: float) -> float:
    """The tau whose retrieval rate on `scores` is closest to the budget rho.

    This is the empirical F_U^-1(1 - rho), made exact in the presence of ties: with many equal
    U values no tau hits rho exactly, so we take the achievable rate nearest to rho, and on a
    tie between two rates the lower one (a budget is a ceiling).

    Args:
        scores: logged U values of one gate (same k, beta / N as the run they gate).
        rho: target retrieval rate in [0, 1].

    Returns:
        tau, either an observed U value or just below the smallest one (rho near 1).
    """
    if not 0.0 <= float(rho) <= 1.0:  # also False for NaN
        raise ValueError(f"rho must be a retrieval rate in [0, 1]; got {rho!r}")
    u = _as_scores(scores)
    taus, above = _candidates(u)
    gap = np.abs(above / u.size - rho)
    # Candidates run from rate 1 down to rate 0; the last minimum is the lowest rate on a tie.
    best = np.flatnonzero(gap <= gap.min() + _TIE)[-1]
    return float(taus[best])


def gated_accuracy(
    scores: Sequence[float],
    tau: float,
    correct_never: Sequence[float],
    correct_always: Sequence[float],
) -> float:
    """Mean correctness of the gated policy: correct_always where U > tau, else correct_never."""
    u = _as_scores(scores)
    never, always = _branches(u, correct_never, correct_always)
    return float(np.mean(np.where(u > tau, always, never)))


def _branches(
    u: np.ndarray, correct_never, correct_always
) -> tuple[np.ndarray, np.ndarray]:
    never = np.asarray(correct_never, dtype=np.float64).reshape(-1)
    always = np.asarray(correct_always, dtype=np.float64).reshape(-1)
    if never.size != u.size or always.size != u.size:
        raise ValueError(
            f"scores, correct_never and correct_always must have one value per row; got "
            f"{u.size}, {never.size} and {always.size}"
        )
    if not (np.all(np.isfinite(never)) and np.all(np.isfinite(always))):
        raise ValueError(
            "correct_never and correct_always must be finite (drop unscored rows)"
        )
    return never, always


def accuracy_threshold(
    scores: Sequence[float],
    correct_never: Sequence[float],
    correct_always: Sequence[float],
) -> float:
    """The tau maximising mean gated correctness, preferring fewer retrievals on a tie.

    Args:
        scores: U of each row.
        correct_never: correctness (EM 0/1, or F1 in [0, 1]) of each row's no-retrieval answer.
        correct_always: correctness of each row's answer with retrieved context.

    Returns:
        tau, an observed U value or just below the smallest one (retrieve everything).
    """
    u = _as_scores(scores)
    never, always = _branches(u, correct_never, correct_always)
    order = np.argsort(u, kind="stable")
    u_sorted, never_s, always_s = u[order], never[order], always[order]
    taus, _ = _candidates(u)
    # Rows with U <= tau keep the no-retrieval answer, rows above switch to the retrieved one.
    kept = np.searchsorted(u_sorted, taus, side="right")
    never_cum = np.concatenate([[0.0], np.cumsum(never_s)])
    always_cum = np.concatenate([[0.0], np.cumsum(always_s)])
    total = never_cum[kept] + (always_cum[-1] - always_cum[kept])
    # Larger tau retrieves less: on a tie take the last (largest) tau.
    best = np.flatnonzero(total >= total.max() - _TIE * u.size)[-1]
    return float(taus[best])


def text_histogram(
    scores: Sequence[float], tau: float, width: int = 40, bins: int = 20
) -> str:
    """A text histogram of U with the bin holding tau marked.

    Rows that would retrieve (U > tau) are drawn with '#', the rest with '.'; a bin that
    tau splits shows both.

    Args:
        scores: U values.
        tau: threshold to mark.
        width: characters of the longest bar (default 40).
        bins: number of equal-width bins over [min(U, tau), max(U, tau)] (default 20).
    """
    if width < 1 or bins < 1:
        raise ValueError(f"width and bins must be >= 1; got width={width}, bins={bins}")
    u = _as_scores(scores)
    lo = float(min(u.min(), tau)) if math.isfinite(tau) else float(u.min())
    hi = float(max(u.max(), tau)) if math.isfinite(tau) else float(u.max())
    if hi == lo:
        hi = lo + 1.0  # all values equal: one visible bin is enough
    edges = np.linspace(lo, hi, bins + 1)
    counts, _ = np.histogram(u, bins=edges)
    above_counts, _ = np.histogram(u[u > tau], bins=edges)
    peak = max(int(counts.max()), 1)
    lines = []
    for i in range(bins):
        n, n_above = int(counts[i]), int(above_counts[i])
        bar_len = round(width * n / peak)
        hashes = round(bar_len * n_above / n) if n else 0
        bar = "." * (bar_len - hashes) + "#" * hashes
        last = i == bins - 1
        holds_tau = edges[i] <= tau < edges[i + 1] or (last and tau == edges[-1])
        mark = f"  <- tau = {tau:.4g}" if holds_tau else ""
        lines.append(
            f"{edges[i]:9.4f} {edges[i + 1]:9.4f} |{bar:<{width}}| {n:6d}{mark}"
        )
    lines.append(f"{'':19} '#' retrieves (U > tau), '.' does not")
    return "\n".join(lines)


def isotonic(x: Sequence[float], y: Sequence[float], increasing: bool = True,
             weights: Sequence[float] | None = None) -> tuple[list[float], list[float]]:
    """Monotone (weighted) least-squares fit of y on x by pool-adjacent-violators.

    Returns knots (weighted mean x, weighted mean y) of the pooled blocks, x ascending: with linear
    interpolation between them (`gates.evidence.interp`) a continuous monotone map, e.g.
    P(right | score). `weights` (default 1 each) lets a point stand for several questions.
    """
    xs = np.asarray(x, dtype=np.float64).reshape(-1)
    ys = np.asarray(y, dtype=np.float64).reshape(-1)
    ws = np.ones_like(xs) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if xs.size == 0 or xs.size != ys.size or ws.size != xs.size:
        raise ValueError(f"isotonic needs x, y (and weights) of one non-zero length, got {xs.size}, {ys.size}, {ws.size}")
    if not np.all(ws > 0):
        raise ValueError("isotonic weights must be > 0")
    # tied x values are one point (their weighted mean y): a fit must give equal x one value, and
    # PAV over ties in input order would leave a tie's last y as a block of its own (on a discrete
    # signal such as the support, a knot (1.0, 1.0) from the last question at 1.0 being right)
    xs, inv = np.unique(xs, return_inverse=True)
    wy = np.bincount(inv, weights=ws * ys)
    ws = np.bincount(inv, weights=ws)
    ys = wy / ws if increasing else -wy / ws
    # blocks as [sum w*y, sum w, sum w*x]; merge while a block's mean exceeds the next one's
    blocks: list[list[float]] = []
    for xi, yi, wi in zip(xs, ys, ws):
        blocks.append([wi * yi, wi, wi * xi])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1] - _TIE:
            s, n, sx = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
            blocks[-1][2] += sx
    kx = [b[2] / b[1] for b in blocks]
    ky = [(b[0] / b[1]) * (1 if increasing else -1) for b in blocks]
    return kx, ky
