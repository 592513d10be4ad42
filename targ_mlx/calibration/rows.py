"""What threshold calibration reads from the decision log: U per row and its labels.

`score_rows` fetches the rows that logged a U for one gate; `labelled_rows` turns them into
(U, correct_never, correct_always) for the accuracy objective. The maths is in `thresholds.py`;
`fit_tau` is the chat app's /recalibrate and /budget rule. `targ-calibrate` and the chat app both
read through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from targ_mlx import gates
from targ_mlx.calibration.thresholds import accuracy_threshold, budget_threshold, retrieval_rate
from targ_mlx.errors import TargError
from targ_mlx.log.decisions import POSITIVE_LABELS, SCORE_COLUMNS, DecisionLog
from targ_mlx.log.store import filters

MIN_ROWS = 30  # fewer rows give a tau that moves by whole bins with each new row
DEFAULT_BUDGET = 0.3  # /recalibrate's retrieval budget when no labelled rows exist


class NotEnoughRowsError(TargError):
    """Too few usable rows in the log to fit a threshold."""


@dataclass(frozen=True)
class ScoreRow:
    """What calibration needs from one logged decision."""

    id: int
    source: str
    model: str
    gate: str  # the gate that made this row's decision
    u: float  # U of the gate asked for in `score_rows()`, not necessarily the deciding one
    retrieved: bool
    em_never: float | None
    em_always: float | None
    f1_never: float | None
    f1_always: float | None
    label: str | None  # latest feedback label, if any


@dataclass(frozen=True)
class Labelled:
    u: list[float]
    correct_never: list[float]
    correct_always: list[float]
    from_branches: int  # rows with both branches scored
    from_feedback: int  # rows labelled by a user vote


def score_rows(log: DecisionLog, gate: str, k: int, model: str | None = None,
               since: datetime | str | None = None, source: str | None = None,
               beta: float | None = None) -> list[ScoreRow]:
    """Rows that logged a U for `gate` at prefix length k, oldest first.

    Any row carries every score its draft computed, so a margin calibration also uses
    rows decided by another gate. `beta` narrows to one margin link (U depends on it).
    """
    if gate not in gates.scored_names():
        raise ValueError(f"gate must be one of {', '.join(gates.scored_names())}; got {gate!r}")
    where, params = filters(since=since, source=source, model=model, k=k, beta=beta)
    # a registered name (an identifier, checked above), never free user text
    column = f"d.u_{gate}" if gate in SCORE_COLUMNS else f"json_extract(d.extra, '$.scores.{gate}')"
    where += f" AND {column} IS NOT NULL" if where else f"WHERE {column} IS NOT NULL"
    sql = f"""
        SELECT d.id, d.source, d.model, d.gate, {column} AS u, d.retrieved,
               d.em_never, d.em_always, d.f1_never, d.f1_always,
               (SELECT label FROM feedback f WHERE f.decision_id = d.id
                ORDER BY f.id DESC LIMIT 1) AS label
        FROM decisions d {where} ORDER BY d.id"""
    return [ScoreRow(**{**r, "retrieved": bool(r["retrieved"])}) for r in log._query(sql, params)]


def labelled_rows(rows: list[ScoreRow], metric: str = "em") -> Labelled:
    """Split rows into (U, correct_never, correct_always) for the accuracy objective.

    Rows with both counterfactual branches scored (eval runs) use them as they are. Other rows
    with user feedback tell us about the branch that ran only, so the label is a vote on the
    decision: a good answer after retrieving, or a bad one without, votes "retrieve"; the other
    two cases vote "do not retrieve". The unseen branch is taken to have gone the other way.
    """
    u, never, always = [], [], []
    n_branches = n_feedback = 0
    for row in rows:
        cn, ca = getattr(row, f"{metric}_never"), getattr(row, f"{metric}_always")
        if cn is not None and ca is not None:
            n_branches += 1
        elif row.label is not None:
            good = row.label in POSITIVE_LABELS
            retrieve_was_right = good == row.retrieved
            cn, ca = (0.0, 1.0) if retrieve_was_right else (1.0, 0.0)
            n_feedback += 1
        else:
            continue
        u.append(row.u)
        never.append(cn)
        always.append(ca)
    return Labelled(u, never, always, n_branches, n_feedback)


def budget_tau(scores: Sequence[float], rho: float, min_rows: int = MIN_ROWS) -> float:
    """tau = budget_threshold(scores, rho), refused below `min_rows` logged scores."""
    if len(scores) < min_rows:
        raise NotEnoughRowsError(f"only {len(scores)} logged answers with this gate, k and model (need {min_rows}); "
                                 "ask more questions first, or set tau directly")
    return budget_threshold(scores, rho)


def fit_tau(rows: Sequence[ScoreRow], rho: float | None = None, min_rows: int = MIN_ROWS) -> tuple[float, str]:
    """The accuracy objective over labelled rows when there are enough, else a retrieval budget.

    Args:
        rows: from `score_rows`.
        rho: force the budget objective with this rate (default: accuracy if labelled).
    Returns:
        (tau, a one-line description of how it was fitted).
    """
    u = [r.u for r in rows]
    labelled = labelled_rows(list(rows)) if rho is None else None
    if labelled is not None and len(labelled.u) >= min_rows:
        tau = accuracy_threshold(labelled.u, labelled.correct_never, labelled.correct_always)
        rate = retrieval_rate(labelled.u, tau)
        return tau, f"accuracy on {len(labelled.u)} labelled rows; retrieval rate {100 * rate:.0f}%"
    rho = DEFAULT_BUDGET if rho is None else rho
    tau = budget_tau(u, rho, min_rows)
    return tau, f"budget rho={rho:g} over {len(u)} logged rows; retrieval rate {100 * retrieval_rate(u, tau):.0f}%"
