"""The stages of one answer that do not decode: prepare, prompt ids, search + pack, answer text.

`runner.stream_answer` composes them with the decoding generators for one question (targ ask,
the chat app, the server, the eval's latency pass); the eval's batched record pass
(`eval/record.py`) calls the same prompt, scoring, packing and answer-text functions, so an eval
question is priced on the path an asked question takes. Both pass a `settings.Settings` (the
eval's is its `EvalSettings.answer`).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import replace
from typing import Sequence

from targ_mlx import conversation, gates, prompts, reader, rerank, retrieval, selection
from targ_mlx.runtime.backbone import Backbone
from targ_mlx.conversation import Turn
from targ_mlx.runtime.draft import Draft
from targ_mlx.errors import QuestionError, check_text
from targ_mlx.matching import says
from targ_mlx.retrieval import Passage
from targ_mlx.settings import Settings

MAX_QUESTION_CHARS = 20_000  # refuse before tokenizing megabytes of pasted text
QUERY_SEPARATOR = " | "  # between the queries of a fused search, where the log and the panel show them


def prompt_ids(bb: Backbone, question: str, style: str, context: str | None = None,
               history: Sequence[Turn] = ()) -> list[int]:
    """Token ids of B(q) (context None) or B(q) + C under the model's chat template, after the
    earlier turns of a conversation (`history`, oldest first) if any."""
    return bb.tokenizer.chat_ids(prompts.messages(question, context, style, history))


def fit_history(bb: Backbone, history: Sequence, s: Settings) -> tuple[Turn, ...]:
    """The latest (question, answer) turns of `history` that fit `s.history_tokens`."""
    count = lambda text: len(bb.tokenizer.encode(text))  # noqa: E731
    return conversation.fit_history([Turn(*t) for t in history], s.history_tokens, count)


def prepare(bb: Backbone, question: str, s: Settings, history: Sequence[Turn] = ()) -> tuple[str, list[int]]:
    """The question stripped and checked, and the ids of B(q) (after `history`, the turns kept:
    the draft and a skipped answer see the same prompt); one-line errors name the fix."""
    q = (question or "").strip()
    if not q:
        raise QuestionError("empty question: type a question to answer")
    check_text(q)
    if len(q) > MAX_QUESTION_CHARS:
        raise QuestionError(f"question is {len(q):,} characters; the limit is {MAX_QUESTION_CHARS:,}: shorten it")
    ids = prompt_ids(bb, q, s.prompt_style, history=history)
    limit = bb.context_length - s.max_tokens
    if len(ids) > limit:
        raise QuestionError(f"question is {len(ids):,} tokens with its prompt; the model's context window "
                            f"({bb.context_length:,}) leaves room for {limit:,}: shorten it")
    return q, ids


def packed_budget(bb: Backbone, question: str, s: Settings, prefix_tokens: int = 0, history: Sequence[Turn] = ()) -> int:
    """Context tokens: L_ctx, cut to the room the window leaves (never below 0)."""
    base = len(prompt_ids(bb, question, s.prompt_style, context=" ", history=history))
    room = bb.context_length - base - s.max_tokens - prefix_tokens
    return max(0, min(s.context_tokens, room))


def pack(bb: Backbone, question: str, hits: Sequence[Passage], s: Settings, prefix_tokens: int = 0,
         history: Sequence[Turn] = ()) -> prompts.PackedContext:
    """Top-K passages cut to L_ctx and to the room the window leaves (never below 0 tokens)."""
    tok = bb.tokenizer
    return prompts.pack_context(hits, packed_budget(bb, question, s, prefix_tokens, history), tok.encode, tok.decode)


WIDE_READS = ("sentences", "distinct", "each")  # read modes that look past the top K


def search_depth(s: Settings) -> int:
    """Passages a search returns: the top K, or the 20 that a selection (reading sentences), the
    distinct topics' refill, the choice's evidence or a reranker looks at."""
    wide = s.read in WIDE_READS or s.rerank
    return max(s.top_k, selection.SELECT_FROM, rerank.RERANK_FROM, reader.SUPPORT_FROM) if wide else s.top_k


def pack_found(bb: Backbone, question: str, found: Sequence[Passage], s: Settings, prefix_tokens: int = 0,
               history: Sequence[Turn] = (), judged_query: str | None = None) -> prompts.PackedContext:
    """The top K of `found` packed as the gate sees them, with what reading reads (`s.read`): the
    same; the top K distinct topics ("distinct"); the first `s.each` distinct topics, each cut to
    the share of the budget a default read of reader.READ_EACH gives one (so the eval's records of
    more candidates price each one as `targ ask` does) and read on its own ("each"); or the selected sentences of all
    of `found` in the same budget ("sentences"). With a reranker (`s.rerank`) `found` is first
    re-ordered by it against `judged_query` (the question by default; in a chat, the search form
    that carries its context)."""
    judge = rerank.load_reranker(s.rerank, bb)
    found = rerank.rerank(judge, judged_query or question, found)
    packed = pack(bb, question, found[: s.top_k], s, prefix_tokens, history)
    mode = s.read
    tok = bb.tokenizer
    budget = packed_budget(bb, question, s, prefix_tokens, history)
    if mode == "each":
        each = budget // reader.READ_EACH
        parts = [prompts.pack_context([p], each, tok.encode, tok.decode)
                 for p in reader.distinct(found, s.each)]
        parts = [x for x in parts if x.passages]
        read = prompts.PackedContext(tuple(x.passages[0] for x in parts), "\n".join(x.text for x in parts),
                                     sum(x.tokens for x in parts))
        return replace(packed, read=read, found=tuple(found[: reader.SUPPORT_FROM]), query=judged_query or question)
    if mode == "distinct":
        return replace(packed, read=pack(bb, question, reader.distinct(found, s.top_k), s, prefix_tokens, history))
    if mode != "sentences":
        top = found[: s.top_k]
        keep = selection.read_among([p.score for p in top], s.depth_ratio)
        if len(keep) < len(top):  # the others scored below depth_ratio x the best one: not read
            packed = replace(packed, read=pack(bb, question, [top[i] for i in keep], s, prefix_tokens, history))
        return packed
    count = lambda text: len(tok.encode(text))  # noqa: E731
    chosen = selection.select(question, found, budget, count)
    return replace(packed, read=prompts.pack_context(chosen, budget, tok.encode, tok.decode))


def each_prompts(bb: Backbone, question: str, packed: prompts.PackedContext, style: str,
                 history: Sequence[Turn] = ()) -> list[list[int]]:
    """read="each": the prompt of every passage read, each B(q) + its one passage, then B(q) itself
    (the closed-book reading); decoded as one batch, they give `choose`'s candidates."""
    return ([prompt_ids(bb, question, style, p.format(), history) for p in packed.reading.passages]
            + [prompt_ids(bb, question, style, None, history)])


def candidate(bb: Backbone, tokens: Sequence[int], logprobs: Sequence[float], source: int, cap: int) -> reader.Candidate:
    """One reading's tokens as a candidate: its answer text and the mean log p of its tokens."""
    text, n = answer_text(bb, tokens, cap)
    kept = tuple(t for t in tokens[:cap] if t not in bb.tokenizer.eos_ids)
    return reader.Candidate(text, sum(logprobs[:n]) / n if n else -math.inf, source, kept)


def candidates(bb: Backbone, rows: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float]],
               cap: int) -> list[reader.Candidate]:
    """read="each": what each prompt of `each_prompts` gave (its tokens and their log-probabilities;
    the question alone last) as candidates."""
    last = len(rows) - 1
    return [candidate(bb, t, lp, i if i < last else reader.CLOSED_BOOK, cap)
            for i, (t, lp) in enumerate(zip(rows, logprobs))]


def choose(question: str, packed: prompts.PackedContext, cands: Sequence[reader.Candidate]) -> reader.Choice:
    """The answer of read="each": the candidate the evidence in what the search found supports,
    judged against the search form that carries a chat's context."""
    return reader.choose(packed.query or question, cands, packed.found or packed.passages, packed.reading.passages)


def retrieve(bb: Backbone, retriever, question: str, s: Settings, prefix_tokens: int = 0,
             history: Sequence[Turn] = (), cancel: threading.Event | None = None, draft: str = ""
             ) -> tuple[prompts.PackedContext, float, str]:
    """Search and pack for one question; returns the context, the seconds it took (rewriting a
    follow-up into its standalone form included) and what was searched (a fused search's
    queries joined by QUERY_SEPARATOR). With `draft` (what the model said before the search) and
    `s.draft_route` > 0, question + draft is one more ranking in the fusion, beside the
    question's own, whose top DRAFT_KEEP lead (`retrieval.draft_query`); not in a follow-up."""
    t0 = time.perf_counter()
    forms = conversation.search_forms(question, history, s.rewrite, bb, cancel) if history else [
        conversation.SearchForm(question)]
    route = routes_draft(s, draft, history)
    found = search_forms(retriever, forms, s, draft if route else "")
    # the form a reranker and the choice judge the passages against (the question's, not the draft's)
    judged = max(forms, key=lambda f: f.weight).query
    packed = pack_found(bb, question, found, s, prefix_tokens, history, judged)
    queries = [f.query for f in forms] + ([retrieval.draft_query(question, draft)] if route else [])
    return packed, time.perf_counter() - t0, QUERY_SEPARATOR.join(queries)


def routes_draft(s: Settings, draft: str, history: Sequence = ()) -> bool:
    """Whether the draft is searched as one more route: `s.draft_route` > 0, a draft that says
    something, and a new question (a follow-up's forms already carry the conversation)."""
    return s.draft_route > 0 and bool(draft.strip()) and not history


def search_forms(retriever, forms: Sequence[conversation.SearchForm], s: Settings, draft: str = "") -> list:
    """The search's top `search_depth(s)` for a question's forms (one: the question), with question +
    `draft` fused beside them at `s.draft_route` when a draft is given (`routes_draft`), the
    question's own top DRAFT_KEEP leading whatever the draft's ranking says (`retrieval.fuse`):
    the runner's and the eval's one search."""
    forms = list(forms)
    if draft:
        forms.append(conversation.SearchForm(retrieval.draft_query(forms[0].query, draft), s.draft_route))
    return retrieval.search_fused(retriever, [f.query for f in forms], search_depth(s), [f.weight for f in forms],
                                  keep=retrieval.DRAFT_KEEP if draft else 0)


def rechecks(s: Settings, d: Draft | None) -> bool:
    """Whether the optional re-check applies: m > 0, a gate it can recompute, a draft that goes on."""
    return d is not None and s.recheck_every > 0 and gates.get(s.gate).recheck and not d.ended


def answer_text(bb: Backbone, tokens: Sequence[int], cap: int) -> tuple[str, int]:
    """The answer string of the first `cap` tokens (EOS dropped) and its token count."""
    ids = [t for t in tokens[:cap] if t not in bb.tokenizer.eos_ids]
    return bb.tokenizer.decode(ids).strip(), len(ids)


def support_of(question: str, packed: prompts.PackedContext) -> float:
    """The selection's support over the passages the gate sees (`selection.support`): the runner's
    and the eval's one computation of it."""
    return selection.support(question, [(p.title, p.text) for p in packed.passages])


def confirms(tokenizer, draft_tokens: Sequence[int], context: str, question: str) -> bool:
    """Whether `context` (what reading would read) already says what the draft says: every claim
    word of the draft's text up to its first EOS (`matching.says`: the words left after the
    question's and function words go) occurs in it. A short answer ("Leonardo da Vinci") and a
    sentence ("Leonardo da Vinci painted the Mona Lisa.") are confirmed alike; an empty draft
    confirms nothing."""
    ids = []
    for t in draft_tokens:
        if t in tokenizer.eos_ids:
            break
        ids.append(t)
    return says(context, tokenizer.decode(ids), question)
