"""The decision panel: gate, U against tau as a gauge, read or not and why, latency, tokens.

`DecisionInfo` is built from a live `Answer` or from a logged decision row, so answers reloaded
from history show the same panel.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table
from rich.text import Text
from textual.widgets import Static


from targ_mlx.defaults import BIGGER_INDEX_HINT
from targ_mlx.records import Answer, PassageRef
from targ_mlx.gates import SCORED_GATES


@dataclass(frozen=True)
class DecisionInfo:
    decision_id: int | None
    model: str
    gate: str
    k: int | None
    tau: float | None  # None for never / always
    u: float | None
    retrieved: bool
    passages: tuple[PassageRef, ...]
    draft_s: float
    retrieval_s: float
    generation_s: float
    total_s: float
    tokens: dict  # prompt, draft, context, output
    finish: str
    searched: str = ""  # the standalone query retrieval searched, when it differs from the question
    history_turns: int = 0  # earlier turns in the prompt
    note: str = ""  # why a wanted retrieval did not happen, e.g. "index building 43%"
    reason: str = ""  # the gate's own why: "weak evidence (best 0.31) → answered from memory"
    no_source: bool = False  # unsure, and no passage good enough to read
    found: tuple[PassageRef, ...] = ()  # what a search-first gate looked at, read or not

    @classmethod
    def from_answer(cls, ans: Answer, decision_id: int | None = None) -> DecisionInfo:
        lat, t = ans.latency, ans.tokens
        return cls(decision_id, ans.model, ans.gate, ans.k, ans.tau if ans.gate in SCORED_GATES else None,
                   ans.score, ans.retrieved, tuple(ans.passages), lat.draft + lat.gate, lat.retrieval,
                   lat.prefill + lat.decode, lat.total,
                   dict(prompt=t.prompt, draft=t.draft, context=t.context, output=t.output), ans.finish_reason,
                   ans.search_query if ans.search_query != ans.question else "", ans.history_turns, ans.note,
                   ans.reason, ans.no_source, tuple(ans.found))

    @classmethod
    def from_row(cls, row: dict) -> DecisionInfo:
        """From `DecisionLog.get(id)`; passages carry no text (the log keeps key, title, score)."""
        passages = tuple(PassageRef(p["key"], p["title"], p["score"], bm25=p.get("bm25")) for p in row.get("passages") or [])
        f = lambda name: row.get(name) or 0.0  # noqa: E731
        extra = row.get("extra") or {}
        searched = extra.get("search_query") or ""
        return cls(row["id"], row["model"], row["gate"], row.get("k"),
                   row.get("tau") if row["gate"] in SCORED_GATES else None, row.get("u"),
                   bool(row["retrieved"]), passages, f("lat_draft") + f("lat_gate"), f("lat_retrieval"),
                   f("lat_prefill") + f("lat_decode"), f("lat_total"),
                   dict(prompt=row.get("tok_prompt") or 0, draft=row.get("tok_draft") or 0,
                        context=row.get("tok_context") or 0, output=row.get("tok_output") or 0),
                   row.get("finish_reason") or "", searched if searched != row["query"] else "",
                   extra.get("history_turns") or 0, extra.get("note", ""), extra.get("reason", ""),
                   bool(extra.get("no_source")), tuple(PassageRef(k, title, sim, bm25=rest[0] if rest else None)
                         for k, title, sim, *rest in extra.get("found") or []))


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

    def show(self, info: DecisionInfo | None) -> None:
        self.info = info
        self.update(self.render_info(info) if info else "no answer yet")

    @staticmethod
    def render_info(d: DecisionInfo) -> Table:
        t = Table.grid(padding=(0, 1))
        t.add_column(style="bold", no_wrap=True)
        t.add_column()
        fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        t.add_row("gate", f"{d.gate} (k={d.k})" if d.k else d.gate)
        op = ">" if d.retrieved or d.note else "≤"
        t.add_row("U vs τ", Text(f"{fmt(d.u)} {op} {fmt(d.tau)}") if d.tau is not None and d.u is not None
                  else Text(f"U {fmt(d.u)}" + (f" · τ {fmt(d.tau)}" if d.tau is not None else "")))
        t.add_row("", gauge(d.u, d.tau))
        verdict = (Text(f"read {len(d.passages)} passages", style="bold red") if d.retrieved
                   else Text(f"no retrieval: {d.note}", style="bold yellow") if d.note
                   else Text("answered from memory" + (" (searched)" if d.found else ""), style="bold green"))
        t.add_row("decision", verdict)
        if d.reason:
            t.add_row("why", Text(d.reason))
        if d.no_source:
            t.add_row("", Text("no good source found: answered from memory, unsure", style="bold yellow"))
            t.add_row("", Text(BIGGER_INDEX_HINT, style="dim"))
        if d.found and not d.retrieved:
            t.add_row("found", Text("; ".join(f"{p.title} {p.score:.2f}" for p in d.found[:3]), style="dim"))
        if d.searched:
            t.add_row("searched", Text(d.searched, style="italic"))
        if d.history_turns:
            t.add_row("history", f"{d.history_turns} earlier turn{'s' if d.history_turns > 1 else ''} in the prompt")
        t.add_row("latency", f"draft {d.draft_s:.2f}s · retrieval {d.retrieval_s:.2f}s · "
                             f"generation {d.generation_s:.2f}s · total {d.total_s:.2f}s")
        tk = d.tokens
        t.add_row("tokens", f"prompt {tk['prompt']} · draft {tk['draft']} · context {tk['context']} · "
                            f"output {tk['output']}")
        t.add_row("finish", d.finish + (f" · #{d.decision_id}" if d.decision_id else ""))
        return t
