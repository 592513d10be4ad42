"""The chat log: one focusable `MessageView` per message; focusing an answer shows its decision."""

from __future__ import annotations

from typing import Sequence

from rich.text import Text
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Static

from targ_mlx.records import PassageRef


class MessageView(Static, can_focus=True):
    class Selected(Message):
        def __init__(self, view: MessageView):
            super().__init__()
            self.view = view

    def __init__(self, role: str, text: str = "", decision_id: int | None = None, **kwargs):
        super().__init__(classes=f"message {role}", **kwargs)
        self.role = role
        self.text = text
        self.decision_id = decision_id
        self.sources: tuple[PassageRef, ...] = ()
        self.note = ""

    def on_mount(self) -> None:
        self._refresh()

    def set_text(self, text: str, note: str = "") -> None:
        self.text, self.note = text, note
        self._refresh()

    def set_sources(self, sources: Sequence[PassageRef]) -> None:
        self.sources = tuple(sources)
        self._refresh()

    def _refresh(self) -> None:
        body = Text()
        body.append("You: " if self.role == "user" else "Assistant: " if self.role == "assistant" else "",
                    style="bold")
        body.append(self.text or ("…" if self.role == "assistant" else ""))
        if self.sources:
            refs = " · ".join(f"[{i}] {p.title}" for i, p in enumerate(self.sources, 1))
            body.append(f"\nfrom {refs}", style="dim cyan")
        if self.note:
            body.append(f"\n{self.note}", style="dim")
        self.update(body)

    def on_focus(self) -> None:
        self.post_message(self.Selected(self))


class ChatLog(VerticalScroll):
    def add(self, role: str, text: str = "", decision_id: int | None = None) -> MessageView:
        view = MessageView(role, text, decision_id)
        self.mount(view)
        self.scroll_end(animate=False)
        return view

    def answers(self) -> list[MessageView]:
        return [m for m in self.query(MessageView) if m.role == "assistant"]
