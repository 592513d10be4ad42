"""The sources panel: retrieved passages (title, score, snippet); the highlighted one expanded."""

from __future__ import annotations

from typing import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Label, ListItem, ListView, Static

from targ_mlx.records import PassageRef

SNIPPET_CHARS = 90


def snippet(text: str, n: int = SNIPPET_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= n else flat[: n - 1] + "…"


class SourcesPanel(Vertical):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.passages: tuple[PassageRef, ...] = ()

    def compose(self) -> ComposeResult:
        yield Label("no sources", id="sources-title")
        yield ListView(id="source-list")
        with VerticalScroll(id="source-detail-box"):
            yield Static("", id="source-detail")

    def show(self, passages: Sequence[PassageRef], retrieved: bool = True) -> None:
        self.passages = tuple(passages)
        title = (f"{len(self.passages)} sources" if self.passages
                 else "retrieval skipped: no sources" if not retrieved else "no sources")
        self.query_one("#sources-title", Label).update(title)
        items = self.query_one("#source-list", ListView)
        items.clear()
        for i, p in enumerate(self.passages, 1):
            line = Text()
            line.append(f"[{i}] ", style="bold")
            line.append(p.title, style="bold cyan")
            line.append(f"  {p.score:.3f}", style="dim")
            parts = [Static(line)] + ([Static(snippet(p.text), classes="snippet")] if p.text else [])
            items.append(ListItem(*parts))
        self._detail(0 if self.passages else None)
        if self.passages:
            items.index = 0

    def on_list_view_highlighted(self, event: ListView.Highlighted) -> None:
        event.stop()
        self._detail(event.list_view.index)

    def _detail(self, i: int | None) -> None:
        box = self.query_one("#source-detail", Static)
        if i is None or not 0 <= i < len(self.passages):
            box.update("")
            return
        p = self.passages[i]
        body = Text()
        body.append(f"[{i + 1}] {p.title}\n", style="bold")
        body.append(f"score {p.score:.4f} · key {p.key}\n\n", style="dim")
        body.append(p.text or "(passage text is not kept in the log; open the index to see it)")
        box.update(body)
