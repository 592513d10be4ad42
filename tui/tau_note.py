"""The status bar's warning while tau is only the gate's placeholder for the loaded model."""

from __future__ import annotations

from targ_mlx.assistant import Assistant
from targ_mlx.log.calibration_rows import MIN_ROWS, score_rows
from targ_mlx.log.decisions import DecisionLog


def tau_note(assistant: Assistant | None, log: DecisionLog | None) -> str:
    """'' when tau was calibrated for this model key (by the user or shipped) or chosen by the user
    (/tau, /budget, --tau); else a warning that says when `/recalibrate` can fit one."""
    if assistant is None or not assistant.settings.scored:
        return ""
    s, cfg, model = assistant.settings, assistant.config, assistant.backbone.model_id
    if cfg.tau_calibrated(model, s.gate) or s.tau != cfg.tau_for(model, s.gate):
        return ""
    n = len(score_rows(log, s.gate, s.k, model=model)) if isinstance(log, DecisionLog) else 0
    when = "now" if n >= MIN_ROWS else f"after {MIN_ROWS} answers ({n}/{MIN_ROWS})"
    return f"⚠ not calibrated for this model: /recalibrate {when}"
