"""Conversations: which earlier turns go into the prompt, and what retrieval searches for.

`fit_history` keeps the latest turns that fit a token budget (oldest dropped first);
`search_queries` turns a follow-up ("when was he born?") into standalone retrieval queries.
The ways to do that are compared on TREC CAsT by `scripts/bench/bench_rewrite.py` (BENCHMARKS.md,
row "standalone retrieval queries"). Nothing here touches the index or the decision log.
"""

from __future__ import annotations

import threading
from typing import Callable, NamedTuple, Sequence

from targ_mlx.defaults import DEFAULT_HISTORY_TOKENS, DEFAULT_REWRITE, REWRITE_METHODS  # noqa: F401

TURN_OVERHEAD_TOKENS = 10  # chat-template markers around one user + one assistant message
REWRITE_MAX_TOKENS = 32
# The questions form keeps every earlier question of the history the prompt keeps (already cut to
# the history budget, so bounded): on TREC CAsT it found more of what the manual rewrites find than
# the last 1 or 2 questions and more than SmolLM2's own rewrite. Alone it misses what a pronoun
# stands for when that was the previous *answer* ("he" = Leonardo after "who painted the mona
# lisa"), which `answer_query` carries; the default searches both and fuses the rankings
# (defaults.DEFAULT_REWRITE; BENCHMARKS.md, row "standalone retrieval queries").
QUESTIONS_KEPT: int | None = None

REWRITE_SYSTEM = ("Rewrite the user's last question so that it can be understood without the conversation: "
                  "replace pronouns with the names they refer to. Reply with the rewritten question only.")
# One worked example: SmolLM2-135M otherwise answers the question instead of rewriting it.
REWRITE_EXAMPLE = ((("what is throat cancer?", ""),), "is it treatable?", "is throat cancer treatable?")


class Turn(NamedTuple):
    """One earlier exchange: the user's question and the assistant's answer."""

    question: str
    answer: str


def fit_history(turns: Sequence[Turn], budget: int, count: Callable[[str], int]) -> tuple[Turn, ...]:
    """The latest turns whose tokens fit `budget`, in order (the oldest are dropped first).

    Args:
        turns: earlier turns, oldest first.
        budget: tokens for all kept turns (0 keeps none).
        count: tokens of a string (the tokenizer's `len(encode(s))`).
    """
    kept: list[Turn] = []
    used = 0
    for t in reversed(turns):
        used += count(t.question) + count(t.answer) + TURN_OVERHEAD_TOKENS
        if used > budget:
            break
        kept.append(t)
    return tuple(reversed(kept))


def turns_from_messages(messages: Sequence) -> list[Turn]:
    """Turns from a transcript (`DecisionLog.messages`): each user message with the answer after it.

    A question left without an answer (the app closed mid-answer) is skipped.
    """
    turns: list[Turn] = []
    pending: str | None = None
    for m in messages:
        if m.role == "user":
            pending = m.text
        elif m.role == "assistant" and pending is not None:
            turns.append(Turn(pending, m.text))
            pending = None
    return turns


def questions_query(question: str, history: Sequence[Turn], kept: int | None = QUESTIONS_KEPT) -> str:
    """The cheap standalone form: the last `kept` earlier questions (None: all), then the current one."""
    chosen = history if kept is None else history[-kept:] if kept > 0 else ()
    earlier = [t.question.strip() for t in chosen]
    return " ".join(earlier + [question.strip()])


def answer_query(question: str, history: Sequence[Turn], kept: int | None = 0) -> str:
    """The cheap form with the previous turn's answer: the last `kept` earlier questions (default
    none; None: all), the last answer, then the current question. A pronoun that stands for what was
    answered ("he" after "who painted the mona lisa?") then has its name in the query; an empty answer
    adds nothing."""
    last = history[-1].answer.strip() if history else ""
    head = questions_query("", history, kept).strip()
    return " ".join(part for part in (head, last, question.strip()) if part)


def rewrite_messages(question: str, history: Sequence[Turn]) -> list[dict]:
    """Chat messages asking the model for a standalone form of `question`."""

    def conversation(turns, q):
        lines = []
        for t in turns:
            lines.append(f"User: {t[0]}")
            if t[1]:
                lines.append(f"Assistant: {t[1]}")
        return "Conversation:\n" + "\n".join(lines) + f"\n\nLast question: {q}"

    ex_turns, ex_q, ex_a = REWRITE_EXAMPLE
    return [{"role": "system", "content": REWRITE_SYSTEM},
            {"role": "user", "content": conversation(ex_turns, ex_q)}, {"role": "assistant", "content": ex_a},
            {"role": "user", "content": conversation(history, question)}]


def clean_rewrite(text: str, question: str) -> str:
    """The first line of the model's reply without a label or quotes; the question if it is empty."""
    line = text.strip().split("\n", 1)[0].strip()
    for label in ("rewritten question:", "last question:", "question:"):
        if line.lower().startswith(label):
            line = line[len(label):].strip()
    line = line.strip("\"'` ")
    return line or question


def model_rewrite(backbone, question: str, history: Sequence[Turn], max_tokens: int = REWRITE_MAX_TOKENS,
                  cancel: threading.Event | None = None) -> str:
    """One short greedy generation: the model's standalone form of `question`."""
    from targ_mlx.runtime.draft import generate

    tok = backbone.tokenizer
    ids = tok.chat_ids(rewrite_messages(question, history))
    out, _, _ = generate(backbone, ids, max_tokens, cancel)
    return clean_rewrite(tok.decode([t for t in out if t not in tok.eos_ids]), question)


def search_queries(question: str, history: Sequence[Turn], method: str = DEFAULT_REWRITE, backbone=None,
                   cancel: threading.Event | None = None) -> list[str]:
    """What retrieval searches for: `question` itself without history, else its standalone form(s).

    Args:
        method: "fused" (the questions form and the answer form, both searched and their rankings
            fused: `retrieval.fuse`), "questions" (earlier questions + this one), "answer" (the last
            answer + this one), "model" (the backbone rewrites it) or "none" (the question as asked).
        backbone: needed for "model".
    Returns:
        one query, or two for "fused" (one when there is no earlier answer to add).
    """
    if method not in REWRITE_METHODS:
        raise ValueError(f"rewrite method {method!r} unknown; choose one of {', '.join(REWRITE_METHODS)}")
    if not history or method == "none":
        return [question]
    has_answer = bool(history[-1].answer.strip())  # not after a cancelled answer
    if method == "questions" or (method in ("answer", "fused") and not has_answer):
        return [questions_query(question, history)]
    if method == "answer":
        return [answer_query(question, history)]
    if method == "fused":
        return [questions_query(question, history), answer_query(question, history)]
    if backbone is None:
        raise ValueError("rewrite method 'model' needs the backbone")
    return [model_rewrite(backbone, question, history, cancel=cancel)]
