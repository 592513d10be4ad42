"""The one answer runner: Algorithm 1 as a stream of events, for every front end.

    for event in stream_answer(bb, retriever, "who painted the mona lisa", settings):
        ...  # Drafted, Searched, Decided, Text (cumulative answer), Done(answer)
    answer = run(bb, retriever, question, settings)  # the last event's Answer

The layering is mlx-lm's `generate_step` -> `stream_generate` -> `generate`: the decoding
generators live in `runtime.draft`, this module composes them with the gate, and `run` drains it.
`targ ask`, the chat app, the eval's batch-1 latency pass and `targ serve` all call it, so one
question takes one path everywhere.

The chosen gate says what it needs: a draft (k greedy tokens from B(q), with N samples for the
variance gate), a search (the evidence gate looks at the passages before it decides to read).
A gate that declines to read continues the draft's KV cache: the answer is token for token the
Never-RAG answer, and a search made for the gate adds only its milliseconds.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence, Union

from targ_mlx import gates, pipeline, reader, rerank
from targ_mlx.gates import DRAFT, SAMPLES, SEARCH, GateDecision, GateParams, Signals
from targ_mlx.errors import NoRetrieverError
from targ_mlx.records import Answer, Latency, PassageRef, TokenCounts
from targ_mlx.retrieval import Retriever
from targ_mlx.runtime.backbone import Backbone
from targ_mlx.settings import Settings
from targ_mlx.runtime import batch
from targ_mlx.runtime.draft import Draft, continue_tokens, continue_with_stats, copies, draft, generate_tokens


@dataclass(frozen=True)
class Drafted:
    """The k-token draft from B(q) the gate scores (absent for never/always)."""

    tokens: tuple[int, ...]
    seconds: float


@dataclass(frozen=True)
class Searched:
    """What the search found (before the gate decides, for a search-first gate)."""

    passages: tuple[PassageRef, ...]  # as packed for the prompt: what reading would read
    seconds: float  # query encoding + index search + packing (a follow-up's rewrite included)
    query: str


@dataclass(frozen=True)
class Decided:
    decision: GateDecision
    scores: dict  # every score the signals allowed, by gate name


@dataclass(frozen=True)
class Text:
    text: str  # the answer so far (cumulative, so a consumer may drop any but the last)


@dataclass(frozen=True)
class Done:
    answer: Answer
    prompt_ids: tuple[int, ...] = ()  # the prompt the answer's tokens continue (with context when read)
    answer_ids: tuple[int, ...] = ()  # the answer's tokens, EOS dropped (what `answer` decodes)


Event = Union[Drafted, Searched, Decided, Text, Done]

# A search-first gate's search needs only the question, so it can run while the draft decodes:
# where the model runs on a GPU the CPU is free and the search's encoder and BM25 time hide behind
# the draft. On the CPU the kernels already keep every core busy: on 2 Zen 4 cores beside the draft
# the 1.5B's draft took 1.19 s and the search 0.74 (0.89 and 0.22 one after the other), no faster
# in all (BENCHMARKS.md, row "the search beside the draft"), so there it runs first, and the
# draft's guesses (prompt lookup) may copy the passages it found. None: beside the draft on a GPU,
# before it on the CPU; True / False force either (scripts/bench/bench_overlap.py times both). The
# answer is the same either way.
OVERLAP_SEARCH: bool | None = None
_SEARCHER = ThreadPoolExecutor(1, thread_name_prefix="targ-search")  # one search at a time, reused


@dataclass
class _Run:
    """Mutable state of one answer while its events stream."""

    lat: dict = field(default_factory=lambda: dict(draft=0.0, gate=0.0, retrieval=0.0, prefill=0.0, decode=0.0,
                                                   overlap=0.0))
    out: list = field(default_factory=list)
    shown: list = field(default_factory=list)


def _texts(bb: Backbone, st: _Run, tok_id: int) -> Text | None:
    """The cumulative answer text after one more token, holding back split UTF-8 bytes."""
    if tok_id in bb.tokenizer.eos_ids:
        return None
    st.shown.append(tok_id)
    text = bb.tokenizer.decode(st.shown)
    return None if text.endswith("\ufffd") else Text(text.strip())


def evidence_of(packed) -> tuple[gates.Evidence, ...]:
    return tuple(gates.Evidence(p.title, float(p.score), p.bm25) for p in packed.passages)


def _refs(packed, with_text: bool, only: Sequence[int] | None = None) -> tuple[PassageRef, ...]:
    """The packed passages as an answer keeps them (`only`: those at these places, the cited)."""
    return tuple(PassageRef(p.key, p.title, round(p.score, 6), p.text if with_text else "", p.bm25)
                 for i, p in enumerate(packed.passages) if only is None or i in only)


def _read_each(bb: Backbone, q: str, packed, s: Settings, turns, st: _Run, cancel: threading.Event | None = None):
    """read="each": every passage read in its own prompt and the question alone, decoded as one
    batch to reader.CANDIDATE_TOKENS; the answer is the candidate the evidence supports
    (`reader.choose`), shown whole, then, if it had not ended, continued from its own prompt and
    streamed to the answer cap. Returns (the prompt the chosen answer continues, the choice)."""
    rows = pipeline.each_prompts(bb, q, packed, s.prompt_style, turns)
    cap = min(s.max_tokens, reader.CANDIDATE_TOKENS)
    t0 = time.perf_counter()
    logits, cache = batch.prefill_batch(bb, rows)
    st.lat["prefill"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    dec = batch.decode_batch(bb, cache, logits, cap)
    st.lat["decode"] += time.perf_counter() - t0
    choice = pipeline.choose(q, packed, pipeline.candidates(bb, dec.tokens, dec.logprobs, cap))
    src = choice.answer.source  # CLOSED_BOOK (-1) is the last row: the question alone
    if (ev := _texts_of(bb, st, dec.tokens[src])) is not None:
        yield ev
    eos = bb.tokenizer.eos_ids
    if st.out and st.out[-1] not in eos and len(st.out) < s.max_tokens:  # a long answer: go on with it alone
        for tok in generate_tokens(bb, rows[src] + st.out, s.max_tokens - len(st.out), cancel, timing := {}):
            st.out.append(tok)
            if (ev := _texts(bb, st, tok)) is not None:
                yield ev
        st.lat["prefill"] += timing["prefill"]
        st.lat["decode"] += timing["decode"]
    return rows[src], choice


def _texts_of(bb: Backbone, st: _Run, tokens: Sequence[int]) -> Text | None:
    """`tokens` as the answer so far, shown at once (a draft kept, a chosen candidate): the last
    Text `_texts` gives over them."""
    st.out, st.shown, shown = list(tokens), [], None
    for tok in tokens:
        shown = _texts(bb, st, tok) or shown
    return shown


def _choice_why(choice) -> str:
    """What the choice saw: the candidates, their votes and scores, the chosen first."""
    def name(c):
        return "memory" if c.source < 0 else f"passage {c.source + 1}"
    parts = [f"{c.text or '(empty)'!r} from {name(c)} ({score:.2f}{f', {sup.votes} readings' if sup.votes > 1 else ''})"
             for c, sup, score in choice.ranked[:4]]
    n = sum(sup.votes for _, sup, _ in choice.ranked) - 1  # every reading but the closed-book one
    return f"; read {n} distinct passages one at a time, chose " + ", over ".join(parts)


def _depth_why(packed, s: Settings) -> str:
    """Why fewer than the top K passages were read (the reading-depth rule), else ""."""
    if s.read != "passages" or packed.read is None:
        return ""
    n, of = len(packed.read.passages), len(packed.passages)
    return f"; read {n} of {of} passages (the rest below {s.depth_ratio:g} x the best one's similarity)" if n < of else ""


def stream_answer(bb: Backbone, retriever: Retriever | Callable[[], Retriever] | None, question: str, s: Settings, *,
                  history: Sequence = (), cancel: threading.Event | None = None,
                  unavailable: str = "") -> Iterator[Event]:
    """Answer one question, yielding each stage's event as it happens.

    Args:
        bb: the loaded model.
        retriever: a `Retriever`, or a zero-argument callable returning one (called on the first
            search, so a question answered from memory never loads the encoder), or None.
        s: `Settings` (gate, tau, k, beta, N, T, top_k, context_tokens, max_tokens, ...).
        history: earlier (question, answer) turns, oldest first; those that fit go in every prompt.
        unavailable: why the index cannot be searched now (e.g. "index building 43%"); the gate
            then answers from memory and the answer's note says why.
    Yields:
        Drafted, Searched, Decided, Text..., Done(Answer) — Searched before Decided for a gate
        that needs the search, after it for one that reads only when it decides to.
    """
    g = gates.get(s.gate)
    p = GateParams(s.k, s.beta, s.calibration)
    t_start = time.perf_counter()
    st = _Run()
    turns = pipeline.fit_history(bb, history, s)
    q, base_ids = pipeline.prepare(bb, question, s, turns)

    def search():
        r = retriever() if callable(retriever) and not isinstance(retriever, Retriever) else retriever
        if r is None:
            raise NoRetrieverError()
        routed = d is not None and s.draft_route > 0  # the draft as a search route: its text
        said = pipeline.answer_text(bb, d.tokens, len(d.tokens))[0] if routed else ""
        packed, secs, searched = pipeline.retrieve(bb, r, q, s, len(prefix), turns, cancel, said)
        st.lat["retrieval"] += secs
        return packed, searched

    d: Draft | None = None
    prefix: list[int] = []  # answer tokens given before reading (a re-check's)
    early: Future | None = None  # the search, started before the draft where it can run beside it

    def search_beside():  # the search and when it ran (for the seconds it overlapped the draft)
        t0 = time.perf_counter()
        return search(), (t0, time.perf_counter())

    packed, searched = None, ""
    if SEARCH in g.needs and DRAFT in g.needs and not unavailable and _searches_first(s, turns):
        if _searches_beside(bb):
            early = _SEARCHER.submit(search_beside)
        else:  # on the CPU: before the draft, whose guesses may then copy what it found
            packed, searched = search()
    if DRAFT in g.needs:
        n = s.n_samples if SAMPLES in g.needs else 0
        a0 = time.perf_counter()
        found = bb.tokenizer.encode(packed.reading.text) if packed is not None and copies(bb) else ()
        d = draft(bb, base_ids, s.k, n, s.temperature, s.seed, found)
        a1 = time.perf_counter()
        st.lat["draft"] = d.prefill_s + d.decode_s
        yield Drafted(tuple(d.tokens), st.lat["draft"])

    if SEARCH in g.needs and not unavailable:
        if early is not None:
            (packed, searched), (b0, b1) = early.result()
            st.lat["overlap"] = max(0.0, min(a1, b1) - max(a0, b0))
        elif packed is None:
            packed, searched = search()
        yield Searched(_refs(packed, False), st.lat["retrieval"], searched)

    t_gate = time.perf_counter()
    looked = d is not None and packed is not None  # a draft, and the search's passages to ask about it
    sig = Signals(d.entropies if d else (), d.gaps if d else (), d.samples if d else (),
                  evidence_of(packed) if packed is not None else None, bb.model_id,
                  pipeline.confirms(bb.tokenizer, d.tokens, packed.text, q) if looked else None,
                  pipeline.support_of(q, packed) if packed is not None else None)
    scores = gates.score_all(sig, p)
    if SEARCH in g.needs and packed is None:  # the index is not ready: nothing to look at, nothing to read
        decision = GateDecision(False, None, s.tau, g.name, f"{unavailable} → answered from memory")
    else:
        decision = g.decide(sig, s.tau, p, scores.get(g.name))
    st.lat["gate"] = time.perf_counter() - t_gate
    yield Decided(decision, scores)

    read = decision.retrieve and not unavailable
    rechecked_at = None
    final_ids = base_ids  # the prompt the answer continues
    choice = None  # read="each": the candidates and the one chosen
    if not read and d is None:
        for tok in generate_tokens(bb, base_ids, s.max_tokens, cancel, timing := {}):
            st.out.append(tok)
            if (ev := _texts(bb, st, tok)) is not None:
                yield ev
        st.lat["prefill"], st.lat["decode"] = timing["prefill"], timing["decode"]
    elif not read:
        if (shown := _texts_of(bb, st, d.tokens)) is not None:  # the draft is already decoded: one Text
            yield shown
        t0 = time.perf_counter()
        if pipeline.rechecks(s, d) and not unavailable:
            for tok, triggered in _recheck(bb, d, s, cancel):
                st.out.append(tok)
                if (ev := _texts(bb, st, tok)) is not None:
                    yield ev
                if triggered:
                    read, rechecked_at, prefix = True, len(st.out), list(st.out)
                    break
        else:
            for tok in continue_tokens(bb, d, s.max_tokens - len(st.out), cancel):
                st.out.append(tok)
                if (ev := _texts(bb, st, tok)) is not None:
                    yield ev
        st.lat["decode"] += time.perf_counter() - t0
    if read:
        if packed is None:
            packed, searched = search()
            yield Searched(_refs(packed, False), st.lat["retrieval"], searched)
        if s.read == "each" and packed.reading.passages and not prefix:
            final_ids, choice = yield from _read_each(bb, q, packed, s, turns, st, cancel)
        else:
            final_ids = pipeline.prompt_ids(bb, q, s.prompt_style, packed.reading.text or None, turns)
            ids = final_ids + prefix
            st.out = list(prefix)
            st.shown = [t for t in prefix if t not in bb.tokenizer.eos_ids]
            for tok in generate_tokens(bb, ids, s.max_tokens - len(prefix), cancel, timing := {}):
                st.out.append(tok)
                if (ev := _texts(bb, st, tok)) is not None:
                    yield ev
            st.lat["prefill"] += timing["prefill"]
            st.lat["decode"] += timing["decode"]

    kept = None  # the draft kept over a read answer of the wrong form
    stopped = cancel is not None and cancel.is_set()  # a cancelled answer stays as far as it got
    text, n_out = pipeline.answer_text(bb, st.out, s.max_tokens)
    if read and d is not None and not prefix and not stopped and (kept := _kept_draft(bb, q, d, s, st, text, cancel)):
        final_ids, choice = base_ids, None
        yield kept[1]
        text, n_out = pipeline.answer_text(bb, st.out, s.max_tokens)  # the draft's, now the answer
    out = st.out[: s.max_tokens]
    eos = bb.tokenizer.eos_ids
    finish = ("cancelled" if cancel is not None and cancel.is_set() else
              "stop" if out and out[-1] in eos else "length")
    yield Done(Answer(
        question=q, answer=text, model=bb.model_id, gate=s.gate, tau=s.tau, score=decision.signal,
        retrieved=read, note=unavailable if (decision.retrieve or SEARCH in g.needs) and unavailable else "",
        k=s.k, beta=s.beta, n_samples=s.n_samples if SAMPLES in g.needs else 0, temperature=s.temperature,
        scores=scores, passages=(_refs(packed.reading, True, () if kept else choice.cited if choice else None)
                                 if read and packed is not None else ()),
        found=_refs(packed, False) if packed is not None else (), searched=packed is not None,
        reason=(decision.reason if not (rechecked_at and read) else f"re-check at token {rechecked_at} → read")
        + (_depth_why(packed, s) if read and packed is not None else "") + (_choice_why(choice) if choice else "")
        + (kept[0] if kept else ""),
        no_source=decision.no_source, confirmed=sig.confirmed, support=sig.support,
        tokens=TokenCounts(prompt=len(base_ids), draft=len(d.tokens) if d else 0,
                           context=packed.reading.tokens if read and packed is not None else 0, output=n_out,
                           samples=sum(len(x) for x in d.samples) if d else 0),
        latency=Latency(total=time.perf_counter() - t_start, **st.lat), finish_reason=finish,
        rechecked_at=rechecked_at, search_query=searched, history_turns=len(turns),
        calibration=s.calibration_label if g.name == "evidence" else "",
    ), tuple(final_ids), tuple(t for t in out if t not in eos))


def _kept_draft(bb: Backbone, q: str, d: Draft, s: Settings, st: _Run, read_text: str,
                cancel: threading.Event | None) -> tuple[str, Text] | None:
    """Reading must not turn an answer of the asked form into one of another: where the question
    asks when or how many (`reader.fits_form`), the read answer gives no time or number and the
    draft does ("1452" for "when was he born?" against a passage's "born in the Republic of
    Florence"), the draft is the answer, continued from its own cache where it had not ended, and
    nothing read is cited. `read_text`: the read answer as decoded. Returns (why, the draft's Text)
    after setting it as the answer, or None."""
    said, _ = pipeline.answer_text(bb, d.tokens, len(d.tokens))
    if reader.fits_form(q, read_text) or not reader.fits_form(q, said):
        return None
    t0 = time.perf_counter()
    tokens = list(d.tokens) + list(continue_tokens(bb, d, s.max_tokens - len(d.tokens), cancel))
    st.lat["decode"] += time.perf_counter() - t0
    shown = _texts_of(bb, st, tokens)
    said, _ = pipeline.answer_text(bb, tokens, s.max_tokens)
    why = f"; the read answer {read_text!r} gives no time or number for what the question asks, kept the draft {said!r}"
    return why, shown or Text(said)


def _searches_first(s: Settings, turns: Sequence) -> bool:
    """Whether the search can start before the draft ends: it must not need the draft (its search
    route) nor the model itself (a follow-up's rewrite, the LLM reranker), which the draft is
    using."""
    return s.draft_route <= 0 and not turns and s.rerank not in rerank.MODEL_RERANKERS


def _searches_beside(bb: Backbone) -> bool:
    """Whether a search that can start first runs beside the draft (`OVERLAP_SEARCH`), else before it."""
    return bb.on_gpu if OVERLAP_SEARCH is None else OVERLAP_SEARCH


def _recheck(bb: Backbone, d: Draft, s: Settings, cancel: threading.Event | None) -> Iterator[tuple[int, bool]]:
    """Paper §3.2 option: continue the draft, re-scoring the running prefix every m tokens;
    yields (token, whether U > tau now triggers reading)."""
    ents, gaps_ = list(d.entropies), list(d.gaps)
    g = gates.get(s.gate)
    n = 0
    for tok_id, e, gap in continue_with_stats(bb, d, s.max_tokens - len(d.tokens), cancel):
        n += 1
        ents.append(e)
        gaps_.append(gap)
        due = n % s.recheck_every == 0 and tok_id not in bb.tokenizer.eos_ids
        yield tok_id, bool(due and g.score(Signals(ents, gaps_), GateParams(None, s.beta)) > s.tau)


def run(bb: Backbone, retriever, question: str, s: Settings, *, on_event: Callable[[Event], None] | None = None,
        **kwargs) -> Answer:
    """Drain `stream_answer` and return its Answer; `on_event` sees every event on the way."""
    for ev in stream_answer(bb, retriever, question, s, **kwargs):
        if on_event is not None:
            on_event(ev)
        if isinstance(ev, Done):
            return ev.answer
    raise AssertionError("stream_answer ended without Done")  # internal invariant
