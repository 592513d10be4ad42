"""A user's label on a logged answer, from a face that holds no session (`targ label ID wrong`):
the log is opened, labelled and closed; `targ-calibrate refit` reads the labels."""

from __future__ import annotations

from targ_mlx.config import load_config
from targ_mlx.log.decisions import DecisionLog


def label_decision(decision_id: int, label: str, db: str | None = None, config: str | None = None) -> str:
    """Label decision `decision_id` in the log (`db`, else the configured one); returns the log's path.
    An unknown id or label raises the log's one-line errors."""
    path = load_config(config).merged(db=db).db
    with DecisionLog(path) as log:
        log.feedback(decision_id, label)
    return str(path)
