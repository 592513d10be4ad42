"""A `Session`: one loaded model, index, gate and log, and the chat it is having.

`Session.ask(question)` runs the one answer runner (`runner.stream_answer`: draft, search if the
gate looks at it, decide, read or continue the draft), yields its events as they happen, logs
the decision and appends the turn to the chat's transcript; a face loops over the events and
renders them. `Session.answer` drains the same stream for callers that want only the Answer
(the server, which keeps its history in the request, and scripts).

Front ends change a session only through its methods (`attach`, `configure`, `set_gate`,
`reload_model`, `open_index`, `get_index`, `budget`, `recalibrate`, `new_chat`, `resume_chat`),
never by assigning its fields.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Protocol

from targ_mlx import runner
from targ_mlx.config import Config, load_config, save_tau
from targ_mlx.conversation import turns_from_messages
from targ_mlx.errors import NoRetrieverError, QuestionError, TargError, check_text
from targ_mlx.index.opened import OpenedIndex, describe
from targ_mlx.calibration.rows import MIN_ROWS, budget_tau, fit_tau, score_rows
from targ_mlx.log.decisions import DecisionLog
from targ_mlx.records import Answer
from targ_mlx.retrieval import Retriever
from targ_mlx.runtime.backbone import Backbone
from targ_mlx.settings import Settings, resolve_tau, tau_calibrated


class NotScoredError(TargError):
    """A threshold operation on a gate that has none (never, always)."""


class DecisionSink(Protocol):
    def record(self, answer: Answer, **kwargs) -> int: ...


def new_chat_id() -> str:
    return uuid.uuid4().hex[:12]


class Session:
    """Answers questions with TARG gating, and keeps the chat's transcript.

    Args:
        backbone: the loaded model.
        retriever: a `Retriever`, or a zero-argument callable that returns one (loaded on first
            search, so Never-RAG answers never load the encoder), or None.
        settings: gate, tau, k and generation settings; per-call overrides via `answer(**kw)`.
        log: optional decision log; every answer is recorded with `source`/`session`, and `ask`
            writes the transcript to its `messages` table.
        config, config_path: where thresholds per (model key, gate) come from and `recalibrate`
            writes them (default: the user config file).
        retriever_mode: dense, bm25 or hybrid for indexes opened later (`open_index`); None: each
            index's own default.
        huge_pages: the page policy of a model loaded later (`reload_model`).
    """

    def __init__(self, backbone: Backbone, retriever: Retriever | Callable[[], Retriever] | None = None,
                 settings: Settings = Settings(), log: DecisionSink | None = None, source: str = "ask",
                 session: str | None = None, index_id: str | None = None, config: Config | None = None,
                 config_path: str | None = None, retriever_mode: str | None = None, huge_pages: str | None = None):
        self.backbone = backbone
        self._retriever = retriever
        self.settings = settings
        self.log = log
        self.source = source
        self.session = session
        self.index_id = index_id
        self.config = config if config is not None else Config()
        self.config_path = config_path
        self.retriever_mode = retriever_mode
        self.huge_pages = huge_pages
        self.last_decision_id: int | None = None
        self.index_label = ""  # how a status line names the index (open_session sets it)
        self.notice = ""  # what did not open as asked, for the face to show once

    def attach_index(self, retriever: Retriever | Callable[[], Retriever] | None) -> None:
        """Answer from `retriever` (or the loader of one, called on the first search) from now on."""
        self._retriever = retriever
        self.index_id = None if retriever is None or self._lazy else describe(retriever).manifest_id

    # -- set up by a front end ------------------------------------------------------------

    def attach(self, *, source: str | None = None, session: str | None = None, log: DecisionSink | None = None,
               config: Config | None = None, config_path: str | None = None) -> None:
        """Where answers are logged (`source`, `session`, `log`) and thresholds read (`config`)."""
        self.source = source or self.source
        self.session = session or self.session
        self.log = log if log is not None else self.log
        self.config = config if config is not None else self.config
        self.config_path = config_path or self.config_path

    def configure(self, **changes) -> Settings:
        """New settings with `changes` (validated as `Settings` is); returns them."""
        self.settings = replace(self.settings, **changes)
        return self.settings

    def set_gate(self, gate: str) -> Settings:
        """Switch gate; tau resolves for (this model's key, the gate) as at start-up."""
        self.settings = self.settings.with_gate(gate, self.config, self.backbone.model_id)
        return self.settings

    def reload_model(self, spec: str) -> Backbone:
        """Load another model (slow: call it from a worker) and re-resolve tau under its key."""
        from targ_mlx.runtime.backbone import load_backbone

        bb = load_backbone(spec, huge_pages=self.huge_pages)
        self.backbone = bb
        self.settings = self.settings.with_gate(self.settings.gate, self.config, bb.model_id)
        return bb

    def open_index(self, folder: str | Path, add: bool = False, progress: Callable[[int, int], None] | None = None):
        """Answer from the index in `folder` from now on (with `add`, beside the indexes already
        open: results merged by score), searched the way this session searches (`retriever_mode`);
        an unfinished build of it is resumed first (slow: call it from a worker). Returns the
        opened retriever."""
        from targ_mlx import index

        check_text(str(folder), f"index folder {str(folder)!r}")
        opened = list(self.index.paths) if add and not self._lazy else []
        paths = list(dict.fromkeys([*opened, index.ensure_index(Path(folder).expanduser(), progress)]))
        retriever = index.load_encoders(index.open_indexes(paths, retriever=self.retriever_mode))
        self._retriever, self.index_id = retriever, retriever.manifest_id
        return retriever

    def get_index(self, name: str, progress: Callable[[int, int], None] | None = None, folder: Path | None = None):
        """Build a bigger index (`index.named`: `simplewiki` online, or a local corpus path) BM25-only
        into the user's indexes folder, resuming an unfinished build of it, then search it beside
        the indexes already open (slow: call it from a worker; `progress` may raise
        `index.named.BuildStopped` to stop after the last commit). Returns the opened retriever."""
        from targ_mlx.index.named import get_index, target

        return self.open_index(get_index(target(name, folder), progress), add=True)

    @property
    def _lazy(self) -> bool:
        return self._retriever is not None and callable(self._retriever) and not isinstance(self._retriever, Retriever)

    @property
    def index(self) -> OpenedIndex:
        """What is open: folders, id, ready or building, mode (nothing is loaded to say it)."""
        if self._retriever is None or self._lazy:
            return OpenedIndex((), self.index_id, True, "", "", (), 0)
        return describe(self._retriever)

    # -- thresholds ------------------------------------------------------------------------

    def _score_rows(self) -> list:
        if not self.settings.scored:
            raise NotScoredError("this gate has no threshold; choose a scored gate first (evidence, entropy, margin, variance)")
        if not isinstance(self.log, DecisionLog):
            return []
        return score_rows(self.log, self.settings.gate, self.settings.k, model=self.backbone.model_id)

    def budget(self, rho: float) -> float:
        """Set tau so that a fraction rho of this model's logged questions (gate, k) would retrieve."""
        tau = budget_tau([r.u for r in self._score_rows()], rho)
        self.configure(tau=tau)
        return tau

    def recalibrate(self, rho: float | None = None) -> tuple[float, str, Path]:
        """Fit tau from the log (accuracy if labelled, else a budget), use it and save it to the
        config under this model's key; returns (tau, how it was fitted, the config file)."""
        tau, how = fit_tau(self._score_rows(), rho)
        self.configure(tau=tau)
        path = save_tau(self.backbone.model_id, self.settings.gate, tau, self.config_path)
        self.config = load_config(path)
        return tau, how, path

    def tau_note(self) -> str:
        """'' when tau was calibrated for this model key (by the user or shipped) or chosen by the
        user (/tau, /budget, --tau); else a warning that says when `/recalibrate` can fit one."""
        s, cfg, model = self.settings, self.config, self.backbone.model_id
        if not s.scored or tau_calibrated(s.gate, model, cfg) or s.tau != resolve_tau(s.gate, None, model, cfg):
            return ""
        n = len(self._score_rows())
        when = "now" if n >= MIN_ROWS else f"after {MIN_ROWS} answers ({n}/{MIN_ROWS})"
        return f"⚠ not calibrated for this model: /recalibrate {when}"

    # -- the chat ----------------------------------------------------------------------------

    def new_chat(self) -> str:
        """Start a new chat (its transcript begins empty); returns its id."""
        self.session = new_chat_id()
        return self.session

    def last_chat(self, source: str | None = "chat") -> str | None:
        """The id of the latest chat with answers logged from `source` (None: any), if any."""
        if not isinstance(self.log, DecisionLog):
            return None
        found = self.log.sessions(source=source)
        return found[0].session if found else None

    def resume_chat(self, chat: str) -> list:
        """Continue the saved chat `chat`; returns its messages. A clear error when there is none."""
        messages = self.log.messages(chat) if isinstance(self.log, DecisionLog) else []
        if not messages:
            where = self.log.path if isinstance(self.log, DecisionLog) else "no decision log"
            raise QuestionError(f"no chat {chat!r} in {where}; use the id `targ ask --json` printed as \"chat\" "
                                "(and the same --db)")
        self.session = chat
        return messages

    def transcript(self) -> list:
        """This chat's messages so far (empty without a log)."""
        return self.log.messages(self.session) if isinstance(self.log, DecisionLog) else []

    def history(self) -> list:
        """This chat's earlier (question, answer) turns, oldest first, each marked grounded where its
        answer was read from a source it cites or confirmed by the search (`Turn.grounded`)."""
        return turns_from_messages(self.transcript(), self.log.grounded if isinstance(self.log, DecisionLog) else None)

    def ask(self, question: str, *, cancel: threading.Event | None = None, **overrides) -> Iterator[runner.Event]:
        """One turn of this chat: yields the runner's events (Drafted, Searched, Decided, Text...,
        Done) as they happen; the question and the answer join the transcript, the decision the log."""
        if self.session is None:
            self.new_chat()
        history = self.history()
        logged = isinstance(self.log, DecisionLog)
        if logged:
            self.log.add_message(self.session, "user", question)
        for ev in self.stream(question, history=history, cancel=cancel, **overrides):
            if isinstance(ev, runner.Done) and logged:
                self.log.add_message(self.session, "assistant", ev.answer.answer, self.last_decision_id)
            yield ev

    # -- what a face may ask (it shows these; it does not reach into the backbone or the log) --

    @property
    def model_id(self) -> str:
        """The answering model's id, as the log keys its decisions."""
        return self.backbone.model_id

    @property
    def logs(self) -> bool:
        """Whether answers are logged (no log: `--no-log`, or a face that keeps none)."""
        return self.log is not None

    @property
    def takes_feedback(self) -> bool:
        """Whether a user's label on a logged answer can be kept (`feedback`)."""
        return self.log is not None and hasattr(self.log, "feedback")

    def feedback(self, decision_id: int, label: str) -> int:
        """Keep a user's label on logged decision `decision_id` (for `targ-calibrate refit`); the
        label's row id. Raises UnknownDecisionError for a decision the log does not hold."""
        return self.log.feedback(decision_id, label)

    # -- answering ------------------------------------------------------------------------

    @property
    def retriever(self) -> Retriever:
        if self._retriever is None:
            raise NoRetrieverError()
        if self._lazy:
            self._retriever = self._retriever()
            self.index_id = self.index_id or describe(self._retriever).manifest_id
        return self._retriever

    def stream(self, question: str, *, history=(), cancel: threading.Event | None = None,
               log_extra: dict | None = None, **overrides) -> Iterator[runner.Event]:
        """The runner's events for one question, its decision logged before Done is yielded.

        `history`: earlier (question, answer) turns, oldest first; the latest that fit
        `history_tokens` go into every prompt (the draft's too, so a skip is still Never-RAG).
        """
        s = replace(self.settings, **overrides) if overrides else self.settings
        # while the index is still building (index.background), the gate answers from memory
        # and the answer says why
        unavailable = self.index.status
        for ev in runner.stream_answer(self.backbone, lambda: self.retriever, question, s, history=history,
                                       cancel=cancel, unavailable=unavailable):
            if isinstance(ev, runner.Done) and self.log is not None:
                index_id = self.index_id or self.index.manifest_id  # e.g. built meanwhile
                self.last_decision_id = self.log.record(ev.answer, source=self.source, session=self.session,
                                                        index_id=index_id, **(log_extra or {}))
            yield ev

    def answer(self, question: str, *, history=(), on_text: Callable[[str], None] | None = None,
               on_event: Callable[[runner.Event], None] | None = None, cancel: threading.Event | None = None,
               log_extra: dict | None = None, **overrides) -> Answer:
        """Drain `stream` and return the Answer; `on_text` receives the cumulative answer text as
        it streams, `on_event` every event."""
        for ev in self.stream(question, history=history, cancel=cancel, log_extra=log_extra, **overrides):
            if on_text is not None and isinstance(ev, runner.Text):
                on_text(ev.text)
            if on_event is not None:
                on_event(ev)
            if isinstance(ev, runner.Done):
                return ev.answer
        raise AssertionError("stream_answer ended without Done")  # internal invariant

    def logprobs(self, done: runner.Done, top: int) -> list[tuple[int, float, list[tuple[int, float]]]]:
        """The answer's tokens scored again under the prompt they continue (one more pass):
        (token id, log p, [(alternative id, log p)]) per token."""
        from targ_mlx.runtime.draft import token_logprobs

        scored = token_logprobs(self.backbone, list(done.prompt_ids), list(done.answer_ids), top)
        return [(t, lp, alts) for t, (lp, alts) in zip(done.answer_ids, scored)]

    def decode(self, ids) -> str:
        return self.backbone.tokenizer.decode(list(ids))
