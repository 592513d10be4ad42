"""The one module that wires backbone, gate, retriever and log: Algorithm 1 of the paper.

`Assistant.answer(question)` drafts k tokens from B(q), scores them, retrieves iff U > tau,
and generates, running the stages in `pipeline.py`. A skipped answer continues the draft's KV cache, so it is token-for-token the
Never-RAG answer and costs only the gate arithmetic.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Protocol

from targ_mlx import pipeline
from targ_mlx.runtime.backbone import Backbone
from targ_mlx.calibration_rows import budget_tau, fit_tau, score_rows
from targ_mlx.config import Config, load_config, save_tau
from targ_mlx.decision_log import DecisionLog
from targ_mlx.runtime.draft import continue_greedy, generate
from targ_mlx.errors import TargError
from targ_mlx.records import Answer, Latency, PassageRef, TokenCounts
from targ_mlx.retrieval import Retriever
from targ_mlx.settings import Settings  # noqa: F401  (re-exported: Assistant(bb, r, Settings(...)))


class NoRetrieverError(TargError):
    pass


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

        bb = load_backbone(spec)
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
            raise NotScoredError("this gate has no threshold; choose the entropy, margin or variance gate first")
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
            raise NoRetrieverError("this question needs retrieval but no index is open; pass --index DIR "
                                   "(or build one: python -m targ_mlx.index build)")
        if not isinstance(self._retriever, Retriever) and callable(self._retriever):
            self._retriever = self._retriever()
            self.index_id = self.index_id or getattr(self._retriever, "manifest_id", None)
        return self._retriever

    def answer(self, question: str, *, history=(), on_text: Callable[[str], None] | None = None,
               cancel: threading.Event | None = None, log_extra: dict | None = None, **overrides) -> Answer:
        """Answer one question; `on_text` receives the cumulative answer text as it streams.

        `history`: earlier (question, answer) turns, oldest first; the latest that fit
        `history_tokens` go into every prompt (the draft's too, so a skip is still Never-RAG).
        """
        s = replace(self.settings, **overrides) if overrides else self.settings
        bb = self.backbone
        t_start = time.perf_counter()
        turns = pipeline.fit_history(bb, history, s)
        q, base_ids = pipeline.prepare(bb, question, s, turns)
        stream = _Streamer(bb.tokenizer, on_text)
        lat = dict(draft=0.0, gate=0.0, retrieval=0.0, prefill=0.0, decode=0.0)
        d = pipeline.draft_for(bb, base_ids, s)
        if d is not None:
            lat["draft"] = d.prefill_s + d.decode_s
        t_gate = time.perf_counter()
        scores = pipeline.score_draft(d.entropies, d.gaps, d.samples, s.k, s.beta) if d is not None else {}
        decision = pipeline.gate(s, scores)
        lat["gate"] = time.perf_counter() - t_gate
        # while the index is still building (index.background), a question the gate would
        # retrieve for is answered without retrieval, and the answer says why
        unavailable = getattr(self._retriever, "status", "") if not getattr(self._retriever, "ready", True) else ""

        prefix: list[int] = []  # answer tokens given before retrieving (a re-check's)
        rechecked_at = None
        retrieve = decision.retrieve and not unavailable
        if not retrieve and d is None:
            out, lat["prefill"], lat["decode"] = generate(bb, base_ids, s.max_tokens, cancel, stream.push)
        elif not retrieve:
            out = list(d.tokens)
            stream.extend(out)
            if pipeline.rechecks(s, d) and not unavailable:
                more, retrieve, dt = pipeline.recheck(bb, d, s, cancel, stream.push)
                if retrieve:
                    rechecked_at, prefix = len(d.tokens) + len(more), list(d.tokens) + more
            else:
                more, dt = continue_greedy(bb, d, s.max_tokens - len(out), cancel, stream.push)
            out += more
            lat["decode"] += dt
        packed, searched = None, ""
        if retrieve:
            packed, lat["retrieval"], searched = pipeline.retrieve(bb, self.retriever, q, s, len(prefix), turns, cancel)
            more, pre, dec = pipeline.generate_with_context(bb, q, packed, s, prefix, cancel, stream.push, turns)
            out = (out if prefix else []) + more
            lat["prefill"] += pre
            lat["decode"] += dec
        text, n_out = pipeline.answer_text(bb, out, s.max_tokens)
        out = out[: s.max_tokens]
        eos = bb.tokenizer.eos_ids
        finish = ("cancelled" if cancel is not None and cancel.is_set() else
                  "stop" if out and out[-1] in eos else "length")
        passages = packed.passages if packed is not None else ()
        ans = Answer(
            question=q, answer=text, model=bb.model_id, gate=s.gate, tau=s.tau, score=decision.signal,
            retrieved=retrieve, note=unavailable if decision.retrieve else "", k=s.k, beta=s.beta, n_samples=s.n_samples if s.gate == "variance" else 0,
            temperature=s.temperature, scores=scores,
            passages=tuple(PassageRef(p.key, p.title, round(p.score, 6), p.text) for p in passages),
            tokens=TokenCounts(prompt=len(base_ids), draft=len(d.tokens) if d else 0,
                               context=packed.tokens if packed is not None else 0, output=n_out,
                               samples=sum(len(x) for x in d.samples) if d else 0),
            latency=Latency(total=time.perf_counter() - t_start, **lat), finish_reason=finish,
            rechecked_at=rechecked_at, search_query=searched, history_turns=len(turns),
        )
        if self.log is not None:
            index_id = self.index_id or getattr(self._retriever, "manifest_id", None)  # e.g. built meanwhile
            self.last_decision_id = self.log.record(ans, source=self.source, session=self.session,
                                                    index_id=index_id, **(log_extra or {}))
        return ans


class _Streamer:
    """Turns token ids into cumulative text for `on_text`, holding back split UTF-8 bytes."""

    def __init__(self, tokenizer, on_text: Callable[[str], None] | None):
        self.tok = tokenizer
        self.on_text = on_text
        self.ids: list[int] = []

    def extend(self, ids: list[int]) -> None:
        for i in ids:
            self.push(i)

    def push(self, tok_id: int) -> None:
        if tok_id in self.tok.eos_ids:
            return
        self.ids.append(tok_id)
        if self.on_text is not None:
            text = self.tok.decode(self.ids)
            if not text.endswith("\ufffd"):
                self.on_text(text.strip())
