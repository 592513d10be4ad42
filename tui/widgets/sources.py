"""The sources panel: the passages read (title, score, snippet), then those the search found and
the answer did not read; the highlighted one expanded."""

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
        self.passages: tuple[PassageRef, ...] = ()  # read
        self.not_read: tuple[PassageRef, ...] = ()  # found by the search, not read
        self._shown: tuple[PassageRef, ...] = ()

    def compose(self) -> ComposeResult:
        yield Label("no sources", id="sources-title")
        yield ListView(id="source-list")
        with VerticalScroll(id="source-detail-box"):
            yield Static("", id="source-detail")

    def show(self, passages: Sequence[PassageRef], retrieved: bool = True, found: Sequence[PassageRef] = (),
             searched: bool = False) -> None:
        """`passages`: what the answer read; `found`: what the search found (read or not)."""
        self.passages = tuple(passages)
        read = {p.key for p in self.passages}
        self.not_read = tuple(p for p in found if p.key not in read)
        shown = self.passages + self.not_read
        title = (f"{len(self.passages)} sources read" if self.passages else
                 "nothing read" if searched or self.not_read else
                 "retrieval skipped: no search" if not retrieved else "no sources")
        if self.not_read:
            title += f" · {len(self.not_read)} searched, not read"
        self.query_one("#sources-title", Label).update(title)
        items = self.query_one("#source-list", ListView)
        items.clear()
        for i, p in enumerate(shown, 1):
            line = Text()
            unread = i > len(self.passages)
            line.append("  · " if unread else f"[{i}] ", style="dim" if unread else "bold")
            line.append(p.title, style="dim cyan" if unread else "bold cyan")
            line.append(f"  {p.score:.3f}" + ("  not read" if unread else ""), style="dim")
            parts = [Static(line)] + ([Static(snippet(p.text), classes="snippet")] if p.text else [])
            items.append(ListItem(*parts))
        self._shown = shown
        self._detail(0 if shown else None)
        if shown:
            items.index = 0

    def show_view(self, view) -> None:
        """The sources of a `DecisionView` (live or finished)."""
        self.show(view.passages if view.retrieved else (), view.retrieved, view.found, bool(view.found))

    def on_list_view_highlighted(self, event: ListView.Highlighted) -> None:
        event.stop()
        self._detail(event.list_view.index)

    def _detail(self, i: int | None) -> None:
        box = self.query_one("#source-detail", Static)
        if i is None or not 0 <= i < len(self._shown):
            box.update("")
            return
        p = self._shown[i]
        body = Text()
        body.append(f"[{i + 1}] {p.title}\n", style="bold")
        body.append(f"score {p.score:.4f} · key {p.key}\n\n", style="dim")
        body.append(p.text or "(passage text is not kept in the log; open the index to see it)")
        box.update(body)
