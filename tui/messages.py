"""Messages the worker threads post to the app (thread-safe via `post_message`)."""

from __future__ import annotations

from textual.message import Message

from targ_mlx.records import Answer


class AnswerText(Message):
    """The cumulative answer so far; a newer one supersedes any still queued."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, AnswerText)


class AnswerEvent(Message):
    """A runner event before the answer's text: drafted, searched, decided."""

    def __init__(self, event):
        super().__init__()
        self.event = event


class AnswerDone(Message):
    def __init__(self, answer: Answer | None, decision_id: int | None, error: Exception | None = None):
        super().__init__()
        self.answer = answer
        self.decision_id = decision_id
        self.error = error


class LoadProgress(Message):
    """Loading stage; `total` 0 means an unknown amount of work."""

    def __init__(self, stage: str, done: int = 0, total: int = 0):
        super().__init__()
        self.stage, self.done, self.total = stage, done, total

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LoadProgress) and message.stage == self.stage


class Loaded(Message):
    """The loader finished: a Session, or the error that stopped it (`notice`: a non-fatal one)."""

    def __init__(self, assistant=None, error: Exception | None = None, notice: str = "", label: str = ""):
        super().__init__()
        self.assistant, self.error, self.notice, self.label = assistant, error, notice, label
