"""Conversations: which earlier turns go into the prompt, and what retrieval searches for.

`fit_history` keeps the latest turns that fit a token budget (oldest dropped first);
`search_forms` turns a follow-up ("when was he born?") into weighted retrieval queries: the
question as asked, and standalone forms built from the earlier turns, weighted by how much the
question leans on them (`dependence`), so a new topic finds what it finds alone.
The ways to do that are compared on TREC CAsT by `scripts/bench/bench_rewrite.py` (BENCHMARKS.md,
row "standalone retrieval queries"). Nothing here touches the index or the decision log.
"""

from __future__ import annotations

import re
import threading
from typing import Callable, NamedTuple, Sequence

from targ_mlx.defaults import DEFAULT_HISTORY_TOKENS, DEFAULT_REWRITE, REWRITE_METHODS  # noqa: F401
from targ_mlx.matching import claim_words

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


# Words by which a question points back at an earlier turn ("when was *he* born?", "is *it*
# treatable?"), and openers of an elliptical follow-up ("what about the oldest?").
REFERRING = frozenset("he him his himself she her hers herself it its itself they them their theirs themselves "
                      "this that these those there such".split())
# Words that can only stand for a person: after "who painted the mona lisa?" answered with a name,
# "when was *he* born?" means the name, not anything the earlier question said (`names_the_answer`).
PERSONAL = frozenset("he him his himself she her hers herself".split())
# An answer is taken for a name when what it says beyond its question is at most NAME_WORDS words,
# each capitalised where the answer says it or a name particle ("Leonardo da Vinci"), but for one
# word beside two capitalised ones (the sentence's verb: "The Dead was led by Jerry Garcia." to
# "who was the leader?"); a description ("an Irish pirate operating in the Caribbean") is about a
# subject the question named.
NAME_WORDS = 4
NAME_PARTICLES = frozenset("da de di del della der van von la le du dos das bin ibn al el y st".split())
ELLIPTIC_OPENERS = ("what about", "how about", "and ", "tell me more", "what else", "anything else", "why not",
                    "more about", "also ")
# Words that say nothing of a topic on their own: a question left with at most SHORT_CONTENT_WORDS
# others ("what are the main themes?") most likely continues the earlier topic.
_GENERIC = frozenset(
    "a an the and or of in on at to for from by with as is was were are be been being am do does did has have had "
    "what when where why how who whom whose which can could should would will may might must shall not no yes "
    "i you we me my your our us about some any many much more most other others than then so very just "
    "main best good important common popular different difference differences types kind kinds way ways "
    "tell know explain describe give get make use used".split())
SHORT_CONTENT_WORDS = 2
# The answer form keeps this many of the last answer's claim words: a long answer's tail would
# otherwise outweigh the question in the query's vector.
ANSWER_WORDS = 12
# The fused search's weights (`retrieval.fuse`) at dependence 0 and 1, linear between: the
# question as asked leads for a self-contained question and still counts a little for a
# follow-up; the forms built from the earlier turns lead for a follow-up and still count for a
# new topic (a question can name its topic and still lean on the earlier turns). Chosen on TREC
# CAsT's even-numbered conversations from a grid of 9 by the mean of the follow-ups' recall@20 and
# the topic switches' switch@5 (scripts/bench/bench_rewrite.py --tune), and reported on the odd
# ones (BENCHMARKS.md, row "standalone retrieval queries"): test recall@20 0.737, switch@5 0.692,
# where the earlier weights, (0.5, 1) for the context, picked with the test turns in view, gave
# 0.761 and 0.514.
ASKED_WEIGHT = (1.0, 0.25)
CONTEXT_WEIGHT = (0.1, 1.0)


class SearchForm(NamedTuple):
    """One query a question is searched with, and its weight in the fused ranking."""

    query: str
    weight: float = 1.0


def _words(question: str) -> list[str]:
    """The question's words, lowercased, as the pronoun rules read them."""
    return re.findall(r"[a-z0-9']+", question.lower())


def dependence(question: str) -> float:
    """How much `question` leans on the earlier turns: 1 with a referring word or an elliptical
    opener, 0.5 when it names too little to be a topic of its own, else 0."""
    q = " ".join(question.lower().split())
    words = _words(q)
    if any(w in REFERRING for w in words) or q.startswith(ELLIPTIC_OPENERS):
        return 1.0
    content = [w for w in words if w not in _GENERIC]
    return 0.5 if len(content) <= SHORT_CONTENT_WORDS else 0.0


def names_the_answer(question: str, history: Sequence[Turn]) -> bool:
    """Whether a personal pronoun in `question` stands for the previous answer: the previous question
    asked who (not "who was anne bonny?", answered with a description of the person it names) and
    was answered with a name read from or confirmed by a source. Then the earlier question's own
    words ("the mona lisa") name the wrong subject for the follow-up's search."""
    if not history or not history[-1].grounded:
        return False
    asked = history[-1].question.lower().strip()
    return not PERSONAL.isdisjoint(_words(question)) and re.match(r"(who|whom|whose)\b", asked) is not None and is_name(history[-1])


def is_name(turn: Turn) -> bool:
    """Whether what `turn`'s answer says beyond its question is a name (see NAME_WORDS)."""
    said = answer_words(turn, None).split()
    capital = {w.lower() for w in re.findall(r"\b[A-Z][\w'-]*", turn.answer)}
    lower = [w for w in said if w not in capital and w not in NAME_PARTICLES]
    return 0 < len(said) <= NAME_WORDS and (not lower or (len(lower) == 1 and len(said) - len(lower) >= 2))


def _weight(pair: tuple[float, float], d: float) -> float:
    return pair[0] + (pair[1] - pair[0]) * d


class Turn(NamedTuple):
    """One earlier exchange: the user's question and the assistant's answer."""

    question: str
    answer: str
    # whether the answer was read from a source (a passage cited for it) or confirmed by one;
    # an answer from memory alone is not searched with (`fused_forms`): a wrong one ("Tommaso di
    # Ser Giovanni di Simone" for "when was he born?") would pull the next search to its subject
    grounded: bool = True


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


def turns_from_messages(messages: Sequence, grounded: Callable[[int], bool] | None = None) -> list[Turn]:
    """Turns from a transcript (`DecisionLog.messages`): each user message with the answer after it.

    A question left without an answer (the app closed mid-answer) is skipped. `grounded` says of an
    answer's decision id whether it was read from or confirmed by a source (`Turn.grounded`).
    """
    turns: list[Turn] = []
    pending: str | None = None
    for m in messages:
        if m.role == "user":
            pending = m.text
        elif m.role == "assistant" and pending is not None:
            ok = grounded(m.decision_id) if grounded is not None and m.decision_id is not None else True
            turns.append(Turn(pending, m.text, ok))
            pending = None
    return turns


def questions_query(question: str, history: Sequence[Turn], kept: int | None = QUESTIONS_KEPT) -> str:
    """The cheap standalone form: the last `kept` earlier questions (None: all), then the current one."""
    chosen = history if kept is None else history[-kept:] if kept > 0 else ()
    earlier = [t.question.strip() for t in chosen]
    return " ".join(earlier + [question.strip()])


def answer_words(turn: Turn, limit: int | None = ANSWER_WORDS) -> str:
    """What an answer says beyond its question (`matching.claim_words`: "Leonardo da Vinci painted
    the Mona Lisa." asked "who painted the mona lisa" gives "leonardo da vinci"), its first `limit`
    words (None: all)."""
    return " ".join(claim_words(turn.answer, turn.question)[:limit])


def answer_query(question: str, history: Sequence[Turn], kept: int | None = 0, whole: bool = False) -> str:
    """The cheap form with the previous turn's answer: the last `kept` earlier questions (default
    none; None: all), what the last answer says beyond its question (`answer_words`; `whole`: the
    answer as given), then the current question. A pronoun that stands for what was answered ("he"
    after "who painted the mona lisa?") then has its name in the query, without the rest of the
    answer pulling the search back to the earlier topic; an empty answer adds nothing."""
    last = "" if not history else history[-1].answer.strip() if whole else answer_words(history[-1])
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


def fused_forms(question: str, history: Sequence[Turn], asked: tuple[float, float] = ASKED_WEIGHT,
                context: tuple[float, float] = CONTEXT_WEIGHT) -> list[SearchForm]:
    """The default way: the question as asked, the questions form and (after an answer read from or
    confirmed by a source) the answer form, weighted at `dependence(question)` between each pair's
    (independent, dependent) values; where a personal pronoun stands for the name answered
    (`names_the_answer`), the answer form alone."""
    if names_the_answer(question, history):
        # the name answered is what the pronoun stands for: the answer form is the standalone
        # question, and the earlier question's words (the Mona Lisa, painters beside it) or the
        # bare "when was he born?" only pull other subjects up the fused ranking
        return [SearchForm(answer_query(question, history))]
    d = dependence(question)
    w = _weight(context, d)
    forms = [SearchForm(question, _weight(asked, d)), SearchForm(questions_query(question, history), w)]
    if history and history[-1].answer.strip() and history[-1].grounded:
        forms.append(SearchForm(answer_query(question, history), w))
    return forms


def search_forms(question: str, history: Sequence[Turn], method: str = DEFAULT_REWRITE, backbone=None,
                 cancel: threading.Event | None = None) -> list[SearchForm]:
    """What retrieval searches for: `question` itself without history, else weighted forms.

    Args:
        method: "fused" (the question as asked, the questions form and the answer form, each searched
            and their rankings fused with weights by `dependence`: `retrieval.fuse`), "questions"
            (earlier questions + this one), "answer" (the last answer + this one), "model" (the
            backbone rewrites it) or "none" (the question as asked); the last four are one form each.
        backbone: needed for "model".
    Returns:
        one form, or for "fused" the question as asked first, then the questions form and the
        answer form (left out when there is no earlier answer to add).
    """
    if method not in REWRITE_METHODS:
        raise ValueError(f"rewrite method {method!r} unknown; choose one of {', '.join(REWRITE_METHODS)}")
    if not history or method == "none":
        return [SearchForm(question)]
    has_answer = bool(history[-1].answer.strip()) and history[-1].grounded  # not after a cancelled or unsourced answer
    if method == "questions" or (method == "answer" and not has_answer):
        return [SearchForm(questions_query(question, history))]
    if method == "answer":
        return [SearchForm(answer_query(question, history))]
    if method == "fused":
        return fused_forms(question, history)
    if backbone is None:
        raise ValueError("rewrite method 'model' needs the backbone")
    return [SearchForm(model_rewrite(backbone, question, history, cancel=cancel))]


def search_queries(question: str, history: Sequence[Turn], method: str = DEFAULT_REWRITE, backbone=None,
                   cancel: threading.Event | None = None) -> list[str]:
    """The query strings of `search_forms`, in its order."""
    return [f.query for f in search_forms(question, history, method, backbone, cancel)]
