"""The chat app: streaming answers, a decision panel and sources for each, slash commands.

`make_app(session)` wraps a ready `targ_mlx.session.Session` (tests); `make_app(loader)` opens one
in a worker while the screen shows progress (`python -m tui`). Generation runs in a thread worker
that loops over the session's events: the decision panel and the sources fill as the draft, the
search and the gate's decision happen, then the answer streams; Esc sets the cancel event the
runner checks per token. The session logs every decision and keeps the transcript; a new chat
opens by default, and Ctrl+R reopens the latest one.
"""

from __future__ import annotations

import os
import threading
import uuid
from typing import Callable, Iterable

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Label, ProgressBar, Static, TextArea

from targ_mlx.session import DecisionView, Done, Session, Text
from tui import commands
from tui.index_get import IndexGet
from tui.messages import AnswerDone, AnswerEvent, AnswerText, Loaded, LoadProgress
from tui.slash import SlashCommands
from tui.widgets import ChatLog, DecisionPanel, MessageView, PromptArea, SourcesPanel, StatusBar

# loader(progress) -> Session (`targ_mlx.session.open_session`); progress(stage, done, total)
Loader = Callable[[Callable[..., None]], Session]

class ChatApp(SlashCommands, IndexGet, App):
    CSS_PATH = "app.tcss"
    TITLE = "targ-chat"
    BINDINGS = [
        Binding("escape", "cancel", "Stop"),
        Binding("f2", "feedback('correct')", "Correct"),
        Binding("f3", "feedback('wrong')", "Wrong"),
        Binding("f4", "copy_answer", "Copy"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+r", "last_chat", "Last chat"),
    ]

    def __init__(self, assistant: Session | None = None, *, loader: Loader | None = None,
                 log=None, config=None, config_path: str | None = None,
                 index_label: str = "", resume: bool = False):
        super().__init__()
        if (assistant is None) == (loader is None):
            raise ValueError("pass either a ready Session or a loader, not both or neither")
        self.assistant = assistant  # the Session, once loaded
        self._loader = loader
        self.decisions = log if log is not None else assistant.log if assistant is not None else None
        self.config_path = config_path
        self.config = config
        self.index_label = index_label
        self.resume = resume
        self.session = uuid.uuid4().hex[:12]
        self._tty_fd: int | None = None
        self.cancel_event: threading.Event | None = None
        self.generating = False
        self._view: MessageView | None = None  # the answer being streamed
        self._infos: dict[int, DecisionView] = {}  # live answers keep passage text; rows do not
        self._live: DecisionView | None = None  # the answer being decided and streamed
        self.answered = self.retrieved = 0
        self.stream_updates = 0  # AnswerText messages shown (coalesced ones count once)

    # -- layout --------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="chat-pane"):
                with Vertical(id="loading"):
                    yield Label("loading…", id="loading-label")
                    yield ProgressBar(id="loading-bar", show_eta=False)
                yield ChatLog(id="chat")
                yield Static("", id="hint", classes="-empty")
                yield PromptArea(id="prompt")
            with Vertical(id="side"):
                yield DecisionPanel(id="decision")
                yield SourcesPanel(id="sources")
        yield StatusBar(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#decision").border_title = "decision"
        self.query_one("#sources").border_title = "sources"
        self.query_one("#prompt").border_title = "ask (Enter sends, Ctrl+J new line, /help)"
        if self.assistant is not None:
            self._use_assistant(self.assistant)
        else:
            self.load_assistant()
        self.query_one(PromptArea).focus()
        if self._tty_fd is not None:
            self.set_interval(1.0, self._exit_if_terminal_gone)

    def exit_when_terminal_closes(self, fd: int) -> None:
        """Exit once the terminal on `fd` is gone (`python -m tui` passes stdin's)."""
        self._tty_fd = fd

    def _exit_if_terminal_gone(self) -> None:
        # A terminal closed without a SIGHUP (a dropped pty, a killed multiplexer) leaves stdin
        # at end-of-file, and Textual's input thread then polls it in a busy loop: the app used
        # ~80% of a core until killed. Every decision is already committed to the log.
        if os.isatty(self._tty_fd):
            return
        self.action_cancel()
        backstop = threading.Timer(5.0, os._exit, (1,))  # should restoring the dead terminal block
        backstop.daemon = True
        backstop.start()
        self.exit(return_code=1)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for name, (usage, text) in commands.COMMANDS.items():
            yield SystemCommand(usage, text, lambda n=name: self._fill_prompt(f"/{n} "))

    def _fill_prompt(self, text: str) -> None:
        prompt = self.query_one(PromptArea)
        prompt.text = text
        prompt.move_cursor(prompt.document.end)
        prompt.focus()

    # -- loading -------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="load")
    def load_assistant(self) -> None:
        def progress(stage: str, done: int = 0, total: int = 0) -> None:
            self.post_message(LoadProgress(stage, done, total))

        try:
            session = self._loader(progress)
            self.post_message(Loaded(session, notice=session.notice, label=session.index_label))
        except Exception as e:  # shown on screen; the app stays open for /model or /index
            self.post_message(Loaded(None, e))

    def on_load_progress(self, event: LoadProgress) -> None:
        label = event.stage
        if event.total:
            label += f": {event.done:,}/{event.total:,} ({100 * event.done / event.total:.0f}%)"
        self.query_one("#loading-label", Label).update(label)
        self.query_one("#loading-bar", ProgressBar).update(total=event.total or None, progress=event.done)
        self._status(state=event.stage)

    def on_loaded(self, event: Loaded) -> None:
        if event.label:
            self.index_label = event.label
        if event.error is not None:
            self.query_one("#loading-label", Label).update(f"[b red]could not load:[/] {event.error}")
            self._status(state="load failed")
            return
        if event.notice:
            self.notify(event.notice, severity="warning", timeout=10)
        self._use_assistant(event.assistant)

    def _use_assistant(self, session: Session) -> None:
        self.assistant = session
        session.attach(source="chat", session=self.session, log=self.decisions if not session.logs else None,
                       config=self.config, config_path=self.config_path)
        self.decisions = session.log
        self.config = session.config
        self.query_one("#loading").add_class("-hidden")
        if self.resume:
            self.action_last_chat()
        self._status()

    # -- status --------------------------------------------------------------------------

    def _status(self, state: str = "") -> None:
        a = self.assistant
        s = a.settings if a else None
        index = self.index_label or (a.index_id if a and a.index_id else "-")
        self.query_one(StatusBar).set_status(
            model=a.model_id if a else "loading", index=index,
            gate=(f"{s.gate} ({s.calibration_label})" if s.calibration_label and s.gate == "evidence" else s.gate)
            if s else "-",
            tau=s.tau if s and s.scored else None, k=s.k if s else 0,
            retrieved=self.retrieved, answered=self.answered,
            state=state or ("generating…" if self.generating else ""), tau_note=a.tau_note() if a else "",
            history_tokens=s.history_tokens if s else None)

    # -- history -------------------------------------------------------------------------

    def _load_session(self, session: str) -> None:
        messages = self.assistant.resume_chat(session)
        self.session = session
        chat = self.query_one(ChatLog)
        chat.remove_children()
        last = None
        for m in messages:
            view = chat.add(m.role, m.text, m.decision_id)
            if m.decision_id is not None:
                info = self._infos[m.decision_id] = DecisionView.from_row(self.decisions.get(m.decision_id))
                view.sources = info.passages if info.retrieved else ()
                view.note = "(stopped)" if info.finish == "cancelled" else ""
                last = view
        rows = self.decisions.rows(session=session)
        self.answered, self.retrieved = len(rows), sum(bool(r["retrieved"]) for r in rows)
        if last is not None:
            self._show_decision(last.decision_id)

    def action_new_chat(self) -> None:
        if self.generating:
            self.notify("an answer is still streaming: press Esc first", severity="warning")
            return
        self.session = uuid.uuid4().hex[:12]
        if self.assistant is not None:
            self.assistant.attach(session=self.session)
        self.query_one(ChatLog).remove_children()
        self.answered = self.retrieved = 0
        self.query_one(DecisionPanel).show(None)
        self.query_one(SourcesPanel).show((), retrieved=False)
        self._status()
        self.query_one(PromptArea).focus()

    def action_last_chat(self) -> None:
        """Reopen the latest chat (of this app, not a `targ ask`) other than the current one."""
        if self.generating or self.assistant is None or self.decisions is None:
            return
        found = [c.session for c in self.decisions.sessions(source="chat") if c.session != self.session]
        if not found:
            self.notify("no earlier chat in the log", severity="warning")
            return
        self._load_session(found[0])
        self._status()

    # -- asking --------------------------------------------------------------------------

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        hint = self.query_one("#hint", Static)
        text = commands.hint(event.text_area.text)
        hint.update(text)
        hint.set_class(not text, "-empty")

    def on_prompt_area_submitted(self, event: PromptArea.Submitted) -> None:
        if commands.is_command(event.text):
            self.query_one(PromptArea).clear()
            self.run_command(event.text)
            return
        if self.assistant is None:
            self.notify("the model is still loading; your question stays in the box", severity="warning")
            return
        if self.generating:
            self.notify("an answer is still streaming: wait, or press Esc to stop it", severity="warning")
            return
        self.query_one(PromptArea).clear()
        chat = self.query_one(ChatLog)
        chat.add("user", event.text)
        self._view = chat.add("assistant")
        self.cancel_event = threading.Event()
        self.generating = True
        s = self.assistant.settings
        self._live = DecisionView.start(s.gate, s.k, self.assistant.model_id)
        self._show(self._live)
        self._status()
        self.generate(event.text, self.cancel_event)

    @work(thread=True, exclusive=True, group="generate")
    def generate(self, question: str, cancel: threading.Event) -> None:
        session = self.assistant
        try:
            for ev in session.ask(question, cancel=cancel):  # the transcript and the log: the session's
                if isinstance(ev, Text):
                    self.post_message(AnswerText(ev.text))
                elif isinstance(ev, Done):
                    self.post_message(AnswerDone(ev.answer, session.last_decision_id if session.logs else None))
                else:
                    self.post_message(AnswerEvent(ev))
        except Exception as e:  # e.g. a QuestionError or a missing index: shown in the chat
            self.post_message(AnswerDone(None, None, e))

    def on_answer_event(self, event: AnswerEvent) -> None:
        if self._live is not None and self.generating:
            self._live = self._live.after(event.event)
            self._show(self._live)

    def on_answer_text(self, event: AnswerText) -> None:
        if self._view is not None and self.generating:
            self.stream_updates += 1
            self._view.set_text(event.text)
            self.query_one(ChatLog).scroll_end(animate=False)

    def on_answer_done(self, event: AnswerDone) -> None:
        view, self._view, self.generating = self._view, None, False
        if event.error is not None:
            self._live = None
            view.set_text("", note=f"error: {event.error}")
            self._status()
            return
        ans, did = event.answer, event.decision_id
        note = "(stopped)" if ans.finish_reason == "cancelled" else ""
        view.set_text(ans.answer, note=note)
        view.decision_id = did
        view.set_sources(ans.passages if ans.retrieved else ())
        self._live = None
        info = DecisionView.from_answer(ans, did)
        if did is not None:
            self._infos[did] = info
        self.answered += 1
        self.retrieved += int(ans.retrieved)
        self._show(info)
        self._status()
        if ans.no_source:
            self.offer_bigger_index()
        self.query_one(ChatLog).scroll_end(animate=False)

    def action_cancel(self) -> None:
        if self.generating and self.cancel_event is not None:
            self.cancel_event.set()
            self._status(state="stopping…")

    # -- decision and sources ------------------------------------------------------------

    def _show(self, info: DecisionView | None) -> None:
        self.query_one(DecisionPanel).show(info)
        sources = self.query_one(SourcesPanel)
        if info is None:
            sources.show((), retrieved=False)
        else:
            sources.show_view(info)

    def _show_decision(self, decision_id: int | None) -> None:
        if decision_id is None or self.decisions is None:
            return
        info = self._infos.get(decision_id)
        if info is None:
            info = self._infos[decision_id] = DecisionView.from_row(self.decisions.get(decision_id))
        self._show(info)

    def on_message_view_selected(self, event: MessageView.Selected) -> None:
        self._show_decision(event.view.decision_id)

    def _target(self) -> MessageView | None:
        """The focused answer, else the latest one that has a decision."""
        focused = self.focused
        if isinstance(focused, MessageView) and focused.decision_id is not None:
            return focused
        answers = [v for v in self.query_one(ChatLog).answers() if v.decision_id is not None]
        return answers[-1] if answers else None

    def action_feedback(self, label: str) -> None:
        view = self._target()
        if view is None or self.decisions is None:
            self.notify("no logged answer to mark yet", severity="warning")
            return
        self.decisions.feedback(view.decision_id, label)
        view.set_text(view.text, note=f"marked {label}")
        self.notify(f"marked answer #{view.decision_id} {label}")

    def action_copy_answer(self) -> None:
        view = self._target()
        if view is None:
            self.notify("no answer to copy yet", severity="warning")
            return
        self.copy_to_clipboard(view.text)
        self.notify("answer copied")


def make_app(session_or_loader: Session | Loader, *, log=None, config=None, config_path: str | None = None,
             index_label: str = "", resume: bool = False) -> ChatApp:
    """The chat app around a ready `Session`, or around a loader run in a worker at start.

    Args:
        session_or_loader: a `Session` (its `log` is used when `log` is None), or a callable
            `loader(progress) -> Session` (`open_session`), where `progress(stage, done=0, total=0)`
            reports loading; the session's non-empty `notice` is shown as a warning.
        log: the decision log; its `messages` table holds the chat history.
        config / config_path: thresholds per model and gate (`/gate`, `/model`); `/recalibrate`
            writes tau to `config_path` (default: the user config file).
        index_label: how the status bar names the index.
        resume: reopen the latest chat from the log (default False: a new chat; Ctrl+R reopens it).
    The app sets the session's chat id and `source="chat"`.
    """
    if isinstance(session_or_loader, Session):
        return ChatApp(session_or_loader, log=log, config=config, config_path=config_path,
                       index_label=index_label, resume=resume)
    return ChatApp(loader=session_or_loader, log=log, config=config, config_path=config_path,
                   index_label=index_label, resume=resume)
