"""The one module that wires backbone, gate, retriever, settings and log for the front ends.

`Assistant.answer(question)` runs the one answer runner (`runner.stream_answer`: draft, search
if the gate looks at it, decide, read or continue the draft) and logs the decision. It holds
what a session changes: the model, the index, the gate and its threshold.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable, Protocol

from targ_mlx import runner
from targ_mlx.config import Config, load_config, save_tau
from targ_mlx.errors import NoRetrieverError, TargError  # noqa: F401  (re-exported)
from targ_mlx.log.calibration_rows import budget_tau, fit_tau, score_rows
from targ_mlx.log.decisions import DecisionLog
from targ_mlx.records import Answer
from targ_mlx.retrieval import Retriever
from targ_mlx.runtime.backbone import Backbone
from targ_mlx.settings import Settings  # noqa: F401  (re-exported: Assistant(bb, r, Settings(...)))


class NotScoredError(TargError):
    """A threshold operation on a gate that has none (never, always)."""


class DecisionSink(Protocol):
    def record(self, answer: Answer, **kwargs) -> int: ...


class Assistant:
    """Answers questions with TARG gating.

    Args:
        backbone: the loaded model.
        retriever: a `Retriever`, or a zero-argument callable that returns one (loaded on first
            retrieval, so Never-RAG answers never load the encoder), or None.
        settings: gate, tau, k and generation settings; per-call overrides via `answer(**kw)`.
        log: optional decision log; every answer is recorded with `source`/`session`.
        config, config_path: where thresholds per (model key, gate) come from and `recalibrate`
            writes them (default: the user config file).

    Front ends change it only through its methods (`attach`, `configure`, `set_gate`,
    `reload_model`, `open_index`, `budget`, `recalibrate`), never by assigning its fields.
    """

    def __init__(self, backbone: Backbone, retriever: Retriever | Callable[[], Retriever] | None = None,
                 settings: Settings = Settings(), log: DecisionSink | None = None, source: str = "ask",
                 session: str | None = None, index_id: str | None = None, config: Config | None = None,
                 config_path: str | None = None):
        self.backbone = backbone
        self._retriever = retriever
        self.settings = settings
        self.log = log
        self.source = source
        self.session = session
        self.index_id = index_id
        self.config = config if config is not None else Config()
        self.config_path = config_path
        self.last_decision_id: int | None = None

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

        bb = load_backbone(spec, huge_pages="collapse")  # the chat's model switch: it runs as long as the chat
        self.backbone = bb
        self.settings = self.settings.with_gate(self.settings.gate, self.config, bb.model_id)
        return bb

    def open_index(self, folder: str | Path, add: bool = False):
        """Answer from the index in `folder` from now on (with `add`, beside the indexes already
        open: results merged by score); returns the opened retriever."""
        from targ_mlx.index import open_indexes

        current = self._retriever if add and not callable(self._retriever) else None
        # an index opened by `open_indexes` knows its folders; one from `open_retriever`, its path
        opened = getattr(current, "paths", None) or [p for p in [getattr(current, "path", None)] if p]
        paths = [*opened, Path(folder).expanduser()]
        retriever = open_indexes(paths)
        self._retriever, self.index_id = retriever, retriever.manifest_id
        return retriever

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

    @property
    def retriever(self) -> Retriever:
        if self._retriever is None:
            raise NoRetrieverError()
        if not isinstance(self._retriever, Retriever) and callable(self._retriever):
            self._retriever = self._retriever()
            self.index_id = self.index_id or getattr(self._retriever, "manifest_id", None)
        return self._retriever

    def answer(self, question: str, *, history=(), on_text: Callable[[str], None] | None = None,
               on_event: Callable[[runner.Event], None] | None = None, cancel: threading.Event | None = None,
               log_extra: dict | None = None, **overrides) -> Answer:
        """Answer one question through the one runner (`runner.stream_answer`) and log it.

        `on_text` receives the cumulative answer text as it streams; `on_event` every event
        (drafted, searched, decided, text, done). `history`: earlier (question, answer) turns,
        oldest first; the latest that fit `history_tokens` go into every prompt (the draft's
        too, so a skip is still Never-RAG).
        """
        s = replace(self.settings, **overrides) if overrides else self.settings
        # while the index is still building (index.background), the gate answers from memory
        # and the answer says why
        unavailable = getattr(self._retriever, "status", "") if not getattr(self._retriever, "ready", True) else ""

        def on(ev: runner.Event) -> None:
            if on_text is not None and isinstance(ev, runner.Text):
                on_text(ev.text)
            if on_event is not None:
                on_event(ev)

        ans = runner.run(self.backbone, lambda: self.retriever, question, s, on_event=on, history=history,
                         cancel=cancel, unavailable=unavailable)
        if self.log is not None:
            index_id = self.index_id or getattr(self._retriever, "manifest_id", None)  # e.g. built meanwhile
            self.last_decision_id = self.log.record(ans, source=self.source, session=self.session,
                                                    index_id=index_id, **(log_extra or {}))
        return ans
