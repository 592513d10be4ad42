"""The status bar: model, index, gate, tau (and whether it is calibrated), history budget, retrieval rate."""

from __future__ import annotations

from textual.widgets import Static


class StatusBar(Static):
    DEFAULT_CSS = "StatusBar { height: 1; background: $panel; color: $text; padding: 0 1; }"

    def set_status(self, *, model: str, index: str, gate: str, tau: float | None, k: int,
                   retrieved: int, answered: int, state: str = "", tau_note: str = "",
                   history_tokens: int | None = None) -> None:
        tau_s = "-" if tau is None else f"{tau:.3f}"
        if tau_note:
            tau_s += f" {tau_note}"
        rate = f"{100 * retrieved / answered:.0f}% ({retrieved}/{answered})" if answered else "-"
        parts = [f"model {model}", f"index {index}", f"gate {gate}", f"τ {tau_s}", f"k {k}"]
        if history_tokens is not None:
            parts.append(f"history {history_tokens} tok")
        parts.append(f"retrieval {rate}")
        if state:
            parts.append(state)
        self.update(" │ ".join(parts))
