"""The one module that wires backbone, gate, retriever and log: Algorithm 1 of the paper.

`Assistant.answer(question)` drafts k tokens from B(q), scores them, retrieves iff U > tau,
and generates. A skipped answer continues the draft's KV cache, so it is token-for-token the
Never-RAG answer and costs only the gate arithmetic.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Protocol

from targ_mlx import conversation, gates, prompts
from targ_mlx.backbone import Backbone
from targ_mlx.config import DEFAULT_TAU
from targ_mlx.conversation import Turn
from targ_mlx.draft import DEFAULT_K, DEFAULT_N, DEFAULT_TEMPERATURE, continue_greedy, draft, generate
from targ_mlx.errors import QuestionError, TargError
from targ_mlx.records import Answer, Latency, PassageRef, TokenCounts
from targ_mlx.retrieval import Passage, Retriever

DEFAULT_MAX_TOKENS = 32  # the paper's short-answer cap; 50 for multi-hop
DEFAULT_TOP_K = 5
MAX_QUESTION_CHARS = 20_000  # refuse before tokenizing megabytes of pasted text


class NoRetrieverError(TargError):
    pass


@dataclass(frozen=True)
class Settings:
    gate: str = "margin"
    tau: float | None = None  # None -> config.DEFAULT_TAU[gate] (placeholders until calibrated)
    k: int = DEFAULT_K
    beta: float = gates.DEFAULT_BETA
    n_samples: int = DEFAULT_N
    temperature: float = DEFAULT_TEMPERATURE
    seed: int = 0
    top_k: int = DEFAULT_TOP_K
    context_tokens: int = prompts.DEFAULT_CONTEXT_TOKENS
    max_tokens: int = DEFAULT_MAX_TOKENS
    recheck_every: int = 0  # m: re-check the running score every m tokens (0 = single-shot)
    prompt_style: str = "paper"
    history_tokens: int = conversation.DEFAULT_HISTORY_TOKENS  # earlier turns kept in the prompt
    rewrite: str = conversation.DEFAULT_REWRITE  # how a follow-up becomes a standalone search query

    def __post_init__(self):
        if self.history_tokens < 0:
            raise ValueError(f"history_tokens must be >= 0, got {self.history_tokens}")
        if self.rewrite not in conversation.REWRITE_METHODS:
            raise ValueError(f"rewrite {self.rewrite!r} unknown; choose one of "
                             f"{', '.join(conversation.REWRITE_METHODS)}")
        if self.gate not in gates.GATES:
            raise ValueError(f"gate {self.gate!r} unknown; choose one of {', '.join(gates.GATES)}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")

    @property
    def threshold(self) -> float:
        if self.tau is not None:
            return float(self.tau)
        return DEFAULT_TAU.get(self.gate, 0.0)  # never/always ignore tau


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
    """

    def __init__(self, backbone: Backbone, retriever: Retriever | Callable[[], Retriever] | None = None,
                 settings: Settings = Settings(), log: DecisionSink | None = None, source: str = "ask",
                 session: str | None = None, index_id: str | None = None):
        self.backbone = backbone
        self._retriever = retriever
        self.settings = settings
        self.log = log
        self.source = source
        self.session = session
        self.index_id = index_id
        self.last_decision_id: int | None = None

    @property
    def retriever(self) -> Retriever:
        if self._retriever is None:
            raise NoRetrieverError("this question needs retrieval but no index is open; pass --index DIR "
                                   "(or build one: python -m targ_mlx.index build)")
        if not isinstance(self._retriever, Retriever) and callable(self._retriever):
            self._retriever = self._retriever()
            self.index_id = self.index_id or getattr(self._retriever, "manifest_id", None)
        return self._retriever

    def question_ids(self, question: str, style: str, context: str | None = None,
                     history: tuple[Turn, ...] = ()) -> list[int]:
        return self.backbone.tokenizer.chat_ids(prompts.messages(question, context, style, history))

    def fit_history(self, history, s: Settings) -> tuple[Turn, ...]:
        """The latest turns of `history` that fit `s.history_tokens`."""
        count = lambda text: len(self.backbone.tokenizer.encode(text))  # noqa: E731
        return conversation.fit_history([Turn(*t) for t in history], s.history_tokens, count)

    def _check(self, question: str, s: Settings, history: tuple[Turn, ...] = ()) -> tuple[str, list[int]]:
        q = (question or "").strip()
        if not q:
            raise QuestionError("empty question: type a question to answer")
        if len(q) > MAX_QUESTION_CHARS:
            raise QuestionError(f"question is {len(q):,} characters; the limit is {MAX_QUESTION_CHARS:,}: shorten it")
        ids = self.question_ids(q, s.prompt_style, history=history)
        limit = self.backbone.context_length - s.max_tokens
        if len(ids) > limit:
            raise QuestionError(f"question is {len(ids):,} tokens with its prompt; the model's context window "
                                f"({self.backbone.context_length:,}) leaves room for {limit:,}: shorten it")
        return q, ids

    def answer(self, question: str, *, history=(), on_text: Callable[[str], None] | None = None,
               cancel: threading.Event | None = None, log_extra: dict | None = None, **overrides) -> Answer:
        """Answer one question; `on_text` receives the cumulative answer text as it streams.

        `history`: earlier (question, answer) turns, oldest first; the latest that fit
        `history_tokens` go into every prompt (the draft's too, so a skip is still Never-RAG).
        """
        s = replace(self.settings, **overrides) if overrides else self.settings
        t_start = time.perf_counter()
        turns = self.fit_history(history, s)
        q, base_ids = self._check(question, s, turns)
        tok = self.backbone.tokenizer
        stream = _Streamer(tok, on_text)
        lat = dict(draft=0.0, gate=0.0, retrieval=0.0, prefill=0.0, decode=0.0)
        scores: dict[str, float] = {}
        d = None
        if s.gate not in ("always", "never"):  # Never-RAG is plain greedy decoding, no draft statistics
            d = draft(self.backbone, base_ids, s.k, s.n_samples if s.gate == "variance" else 0,
                      s.temperature, s.seed)
            lat["draft"] = d.prefill_s + d.decode_s
        t_gate = time.perf_counter()
        if d is not None:
            scores["entropy"] = gates.entropy_score(d.entropies)
            scores["margin"] = gates.margin_score(d.gaps, s.beta)
            if d.samples:
                scores["variance"] = gates.variance_score(d.samples, s.k)
        decision = gates.decide(s.gate, scores.get(s.gate), s.threshold)
        lat["gate"] = time.perf_counter() - t_gate

        passages: tuple[Passage, ...] = ()
        ctx_tokens = 0
        rechecked_at = None
        searched = ""
        if decision.retrieve:
            out, passages, ctx_tokens, searched = self._rag(q, s, turns, [], stream, cancel, lat)
        elif d is None:
            out, lat["prefill"], lat["decode"] = generate(self.backbone, base_ids, s.max_tokens, cancel, stream.push)
        else:
            out = list(d.tokens)
            stream.extend(out)
            budget = s.max_tokens - len(out)
            if s.recheck_every > 0 and s.gate in ("entropy", "margin") and not d.ended:
                more, rechecked_at, passages, ctx_tokens, searched = self._continue_with_recheck(
                    q, s, turns, d, stream, cancel, lat)
                out += more
            else:
                more, dt = continue_greedy(self.backbone, d, budget, cancel, stream.push)
                out += more
                lat["decode"] += dt
        out = out[: s.max_tokens]
        text_ids = [t for t in out if t not in tok.eos_ids]
        finish = ("cancelled" if cancel is not None and cancel.is_set() else
                  "stop" if out and out[-1] in tok.eos_ids else "length")
        total = time.perf_counter() - t_start
        ans = Answer(
            question=q, answer=tok.decode(text_ids).strip(), model=self.backbone.model_id, gate=s.gate,
            tau=s.threshold, score=decision.signal, retrieved=decision.retrieve or rechecked_at is not None,
            k=s.k, beta=s.beta, n_samples=s.n_samples if s.gate == "variance" else 0, temperature=s.temperature,
            scores=scores,
            passages=tuple(PassageRef(p.key, p.title, round(p.score, 6), p.text) for p in passages),
            tokens=TokenCounts(prompt=len(base_ids), draft=len(d.tokens) if d else 0, context=ctx_tokens,
                               output=len(text_ids), samples=sum(len(x) for x in d.samples) if d else 0),
            latency=Latency(total=total, **lat), finish_reason=finish, rechecked_at=rechecked_at,
            search_query=searched, history_turns=len(turns),
        )
        if self.log is not None:
            self.last_decision_id = self.log.record(ans, source=self.source, session=self.session,
                                                    index_id=self.index_id, **(log_extra or {}))
        return ans

    def retrieve_context(self, question: str, s: Settings, prefix_tokens: int = 0, history: tuple[Turn, ...] = (),
                         query: str | None = None) -> tuple[prompts.PackedContext, float]:
        """Top-K passages for `query` (default: `question`), packed into the budget the window allows."""
        t0 = time.perf_counter()
        found = self.retriever.search(query or question, s.top_k)
        base = len(self.question_ids(question, s.prompt_style, context=" ", history=history))
        room = self.backbone.context_length - base - s.max_tokens - prefix_tokens
        tok = self.backbone.tokenizer
        packed = prompts.pack_context(found, max(0, min(s.context_tokens, room)), tok.encode, tok.decode)
        return packed, time.perf_counter() - t0

    def _rag(self, q: str, s: Settings, turns: tuple[Turn, ...], prefix: list[int], stream: "_Streamer",
             cancel, lat: dict):
        # Retrieval latency includes rewriting a follow-up into its standalone form.
        t0 = time.perf_counter()
        query = conversation.search_query(q, turns, s.rewrite, self.backbone, cancel)
        packed, _ = self.retrieve_context(q, s, len(prefix), turns, query)
        lat["retrieval"] = time.perf_counter() - t0
        ids = self.question_ids(q, s.prompt_style, packed.text or None, turns) + prefix
        out, pre, dec = generate(self.backbone, ids, s.max_tokens - len(prefix), cancel, stream.push)
        lat["prefill"] += pre
        lat["decode"] += dec
        return out, packed.passages, packed.tokens, query

    def _continue_with_recheck(self, q: str, s: Settings, turns: tuple[Turn, ...], d, stream: "_Streamer",
                               cancel, lat: dict):
        """Paper §3.2 option: every m tokens re-score the running prefix; retrieve once if U > tau."""
        import mlx.core as mx

        from targ_mlx.draft import _greedy

        bb = self.backbone
        ents, gaps = list(d.entropies), list(d.gaps)
        out: list[int] = []
        t0 = time.perf_counter()
        logits = bb.step(mx.array([d.tokens[-1]], dtype=mx.int32), d.cache)
        budget = s.max_tokens - len(d.tokens)
        for tok_id, e, g in _greedy(bb, d.cache, logits, budget, stats=True, cancel=cancel):
            out.append(tok_id)
            stream.push(tok_id)
            ents.append(e.item())
            gaps.append(g.item())
            if len(out) % s.recheck_every == 0 and tok_id not in bb.tokenizer.eos_ids:
                u = gates.score(s.gate, gates.DraftSignals(ents, gaps), None, s.beta)
                if u > s.threshold:
                    lat["decode"] += time.perf_counter() - t0
                    at = len(d.tokens) + len(out)
                    prefix = list(d.tokens) + out
                    more, passages, ctx, searched = self._rag(q, s, turns, prefix, stream, cancel, lat)
                    return out + more, at, passages, ctx, searched
        lat["decode"] += time.perf_counter() - t0
        return out, None, (), 0, ""


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
