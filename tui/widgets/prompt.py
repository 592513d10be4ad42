"""Multiline prompt: Enter sends, Ctrl+J / Alt+Enter add a line, Tab completes slash commands."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea

from tui import commands

NEWLINE_KEYS = ("ctrl+j", "alt+enter", "shift+enter")


class PromptArea(TextArea):
    class Submitted(Message):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text.strip()
            if text:
                self.post_message(self.Submitted(text))
        elif event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
        elif event.key == "tab" and commands.is_command(self.text):
            event.stop()
            event.prevent_default()
            self.complete()

    def complete(self) -> None:
        options = commands.complete(self.text)
        prefix = commands.common_prefix(options)
        if len(options) == 1:
            prefix = options[0] + " "
        if len(prefix) > len(self.text):
            self.text = prefix
            self.move_cursor(self.document.end)
