"""The decision panel: gate, U against tau as a gauge, read or not and why, latency, tokens.

It renders a `targ_mlx.session.DecisionView`: live while an answer runs (what the draft, the
search and the gate have done so far), then the finished answer's, or a logged one's.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from targ_mlx.defaults import BIGGER_INDEX_CHAT_HINT
from targ_mlx.records import verdict
from targ_mlx.session import DecisionView

DecisionInfo = DecisionView  # the panel's name for what it shows


def gauge(u: float | None, tau: float | None, width: int = 24) -> Text:
    """A bar filled up to U with a marker at tau; red when U > tau (retrieve), green otherwise."""
    if u is None or tau is None:
        return Text("─" * width, style="dim")
    hi = max(1.0, 1.25 * tau, 1.05 * u)
    filled = max(0, min(width, round(width * u / hi)))
    mark = max(0, min(width - 1, round(width * tau / hi)))
    style = "bold red" if u > tau else "bold green"
    bar = Text()
    for i in range(width):
        if i == mark:
            bar.append("┃", style="bold yellow")
        else:
            bar.append("█" if i < filled else "░", style=style if i < filled else "dim")
    return bar


class DecisionPanel(Static):
    """Shows one `DecisionInfo` (the selected or latest answer)."""

    DEFAULT_CSS = "DecisionPanel { height: auto; }"

    def __init__(self, **kwargs):
        super().__init__("no answer yet", **kwargs)
        self.info: DecisionInfo | None = None
        self.hint = BIGGER_INDEX_CHAT_HINT  # under "no good source found" ("" once the bigger index is open)

    def show(self, info: DecisionView | None) -> None:
        self.info = info
        self.update(self.render_info(info, self.hint) if info else "no answer yet")

    @staticmethod
    def render_info(d: DecisionView, hint: str = BIGGER_INDEX_CHAT_HINT) -> Table:
        t = Table.grid(padding=(0, 1))
        t.add_column(style="bold", no_wrap=True)
        t.add_column()
        fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        t.add_row("gate", f"{d.gate} (k={d.k})" if d.k else d.gate)
        if d.live:
            t.add_row("now", Text(d.progress(), style="italic"))
            if d.stage != "decided":
                if d.found:
                    t.add_row("found", Text("; ".join(f"{p.title} {p.score:.2f}" for p in d.found[:3]), style="dim"))
                return t
        op = ">" if d.retrieved or d.note else "≤"
        t.add_row("U vs τ", Text(f"{fmt(d.u)} {op} {fmt(d.tau)}") if d.tau is not None and d.u is not None
                  else Text(f"U {fmt(d.u)}" + (f" · τ {fmt(d.tau)}" if d.tau is not None else "")))
        t.add_row("", gauge(d.u, d.tau))
        said = verdict(d.retrieved, len(d.passages))
        t.add_row("decision", Text(said, style="bold red") if d.retrieved
                  else Text(f"no retrieval: {d.note}", style="bold yellow") if d.note
                  else Text(said + (" (searched)" if d.found else ""), style="bold green"))
        if d.reason:
            t.add_row("why", Text(d.reason))
        if d.no_source:
            t.add_row("", Text("no good source found: answered from memory, unsure", style="bold yellow"))
            if hint:
                t.add_row("", Text(hint, style="dim"))
        if d.found and not d.retrieved:
            t.add_row("found", Text("; ".join(f"{p.title} {p.score:.2f}" for p in d.found[:3]), style="dim"))
        if d.searched:
            t.add_row("searched", Text(d.searched, style="italic"))
        if d.history_turns:
            t.add_row("history", f"{d.history_turns} earlier turn{'s' if d.history_turns > 1 else ''} in the prompt")
        if d.live:
            return t
        t.add_row("latency", f"draft {d.draft_s:.2f}s · retrieval {d.retrieval_s:.2f}s · "
                             f"generation {d.generation_s:.2f}s · total {d.total_s:.2f}s")
        tk = d.tokens
        t.add_row("tokens", f"prompt {tk['prompt']} · draft {tk['draft']} · context {tk['context']} · "
                            f"output {tk['output']}")
        t.add_row("finish", d.finish + (f" · #{d.decision_id}" if d.decision_id else ""))
        return t
