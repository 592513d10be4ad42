"""What is read of what was found: the sentences of the search's top passages most likely to carry
the answer, packed under their titles into the context budget.

The search returns whole chunks (~1,000 characters); a question's answer sits in one or two of
their sentences, and the rest of five chunks fills a small model's prompt with text it can be
distracted by. `select` cuts the top passages (20 by default: what a search's fusion looks at)
into windows of consecutive sentences, scores each window without training

    score = lexical(question, title + window) + RANK_WEIGHT / (1 + rank / RANK_SCALE)

(lexical: BM25 of the question's words over the windows, with the windows themselves as the
collection; rank: its passage's place in the search's order), and takes the best windows until
the budget is full. A passage's chosen sentences keep their order, joined by " … " where sentences
were left out between them; passages come in the order of their best window. Pure functions over
strings and a token counter: no model, no index.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from targ_mlx.matching import FUNCTION_WORDS, normalize
from targ_mlx.retrieval import Passage

SELECT_FROM = 20  # passages a selection looks at
WINDOW = 1  # sentences a window holds (1 scored best of 1-3 on held-out questions)
# The passage rank's share of a window's score: with it the search's order breaks ties between
# windows the question's words score alike and keeps a top passage's best sentences in. Chosen on
# held-out questions (scripts/bench/bench_selection.py --tune), not the ones it is reported on.
RANK_WEIGHT = 1.0
RANK_SCALE = 5.0
BM25_K1, BM25_B = 1.2, 0.75
MIN_RATIO = 0.0  # read windows down to this share of the best one's score (0: fill the budget)
GAP = " … "  # between two runs of a passage's sentences with sentences left out between them
MIN_SENTENCE_CHARS = 20  # a fragment shorter than this ("Ibid.", "e.g.") joins the sentence before it

# A sentence ends at . ! ? (optionally closed by a quote or bracket) before whitespace and a capital
# letter or an opening quote or bracket: "c. 1503" does not end one; "U.S. Army" does, and the short
# fragment it leaves joins the sentence after it (MIN_SENTENCE_CHARS).
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[A-Z\"'(\[])")


@dataclass(frozen=True)
class Window:
    """Consecutive sentences [start, end) of the passage at `rank` in the search's order."""

    rank: int
    start: int
    end: int
    score: float


def sentences(text: str) -> list[str]:
    """`text` cut into sentences; a fragment shorter than MIN_SENTENCE_CHARS joins the sentence
    after it ("The U.S." + "Army took it."), or the one before at the end ("... Ibid.")."""
    out: list[str] = []
    carry = ""
    for part in _SENTENCE_END.split(text.strip()):
        part = f"{carry} {part.strip()}".strip()
        carry = ""
        if len(part) < MIN_SENTENCE_CHARS:
            carry = part
        elif part:
            out.append(part)
    if carry:
        if out:
            out[-1] = f"{out[-1]} {carry}"
        else:
            out.append(carry)
    return out


def terms(text: str) -> list[str]:
    """The words a question and a window are matched on: normalised, function words dropped."""
    return [w for w in normalize(text).split() if w not in FUNCTION_WORDS]


def bm25_scores(query: Sequence[str], docs: Sequence[Sequence[str]], k1: float = BM25_K1,
                b: float = BM25_B) -> list[float]:
    """BM25 of `query` over `docs` (lists of terms), with `docs` as the collection for the IDF."""
    n = len(docs)
    if not n:
        return []
    df = Counter(t for d in docs for t in set(d))
    avg = sum(len(d) for d in docs) / n or 1.0
    idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in set(query) if df[t]}
    out = []
    for d in docs:
        tf = Counter(d)
        norm = k1 * (1 - b + b * len(d) / avg)
        out.append(sum(w * tf[t] * (k1 + 1) / (tf[t] + norm) for t, w in idf.items() if tf[t]))
    return out


def windows(question: str, split: Sequence[Sequence[str]], titles: Sequence[str], size: int = WINDOW,
            rank_weight: float = RANK_WEIGHT, rank_scale: float = RANK_SCALE) -> list[Window]:
    """Every window of `size` consecutive sentences (fewer where a passage has fewer) of each
    passage's sentences (`split`, in the search's order), scored, best first (ties: search order)."""
    spans = [(r, i, min(i + size, len(sents))) for r, sents in enumerate(split)
             for i in range(max(1, len(sents) - size + 1)) if sents]
    docs = [terms(titles[r]) + [t for s in split[r][i:j] for t in terms(s)] for r, i, j in spans]
    lexical = bm25_scores(terms(question), docs)
    scored = [Window(r, i, j, lex + rank_weight / (1 + r / rank_scale)) for (r, i, j), lex in zip(spans, lexical)]
    return sorted(scored, key=lambda w: -w.score)


def select(question: str, passages: Sequence[Passage], budget: int, count: Callable[[str], int], *,
           size: int = WINDOW, rank_weight: float = RANK_WEIGHT, rank_scale: float = RANK_SCALE,
           min_ratio: float = MIN_RATIO) -> list[Passage]:
    """The best windows of `passages` that fit `budget` tokens as `[title] text` lines, as passages
    whose text is their chosen sentences (each keeps its key, title and scores).

    Args:
        question: what the windows are scored against.
        passages: the search's top passages, best first.
        budget: tokens for all lines (as `count` counts them, a newline between lines included).
        count: tokens of a string (the tokenizer's `len(encode(s))`).
        min_ratio: windows scoring below this share of the best window's score are not read, even
            where the budget has room: as little as the evidence says is worth reading.
    """
    split = [sentences(p.text) for p in passages]
    ranked = windows(question, split, [p.title for p in passages], size, rank_weight, rank_scale)
    return pack(ranked, passages, split, budget, count, min_ratio)


def pack(ranked: Sequence[Window], passages: Sequence[Passage], split: Sequence[Sequence[str]], budget: int,
         count: Callable[[str], int], min_ratio: float = MIN_RATIO) -> list[Passage]:
    """The windows of `ranked` (best first; sentences of `split`, each passage's `sentences`) that
    fit `budget` tokens, taken in order, as passages whose text is their chosen sentences; windows
    below `min_ratio` x the best one's score are left (see `select`)."""
    floor = min_ratio * ranked[0].score if ranked else 0.0
    # token costs counted once per sentence and title line and added up: close to the packed line's
    # count (a few tokens apart at the joins), which `prompts.pack_context` then holds exactly
    sent_cost: dict[tuple[int, int], int] = {}
    gap_cost = count(GAP)
    chosen: dict[int, set[int]] = {}
    best: dict[int, float] = {}
    used = 0
    for w in ranked:
        if w.score < floor:
            break
        have = chosen.get(w.rank, set())
        new = set(range(w.start, w.end)) - have
        if not new:
            continue
        extra = 0 if have else count(f"[{passages[w.rank].title}]") + (1 if used else 0)
        for i in new:
            if (w.rank, i) not in sent_cost:
                sent_cost[w.rank, i] = count(" " + split[w.rank][i])
            extra += sent_cost[w.rank, i]
        extra += gap_cost * (_runs(have | new) - _runs(have))
        if used + extra > budget:
            continue  # a shorter window further down may still fit
        chosen[w.rank] = have | new
        best.setdefault(w.rank, w.score)
        used += extra
    order = sorted(chosen, key=lambda r: -best[r])
    return [replace(passages[r], text=_text(split[r], chosen[r])) for r in order]


def support(question: str, passages: Sequence[tuple[str, str]]) -> float:
    """The selection's score as a gate reads it: the largest share of the question's distinct words
    (function words dropped) that one sentence of `passages` ((title, text) pairs), with its
    passage's title, holds. 1.0: some sentence names everything the question asks about; 0.0: none
    of it, or a question with no content words. Unlike the window score it does not depend on the
    question's length or the passages' vocabulary, so one calibration reads it for every question."""
    asked = set(terms(question))
    if not asked:
        return 0.0
    best = 0
    for title, text in passages:
        named = asked & set(terms(title))
        for s in sentences(text) or [text]:
            best = max(best, len(named | (asked & set(terms(s)))))
            if best == len(asked):
                return 1.0
    return best / len(asked)


def read_among(scores: Sequence[float], ratio: float) -> list[int]:
    """Which of the passages to read (their places in `scores`' order, kept): those scoring at
    least `ratio` x the best score among them, wherever it ranks, since a hybrid or BM25 ranking is
    not sorted by similarity. All of them for ratio 0 or a best score <= 0, where a share means
    nothing; otherwise at least the best one."""
    if not scores:
        return []
    best = max(scores)
    if ratio <= 0 or best <= 0:
        return list(range(len(scores)))
    return [i for i, s in enumerate(scores) if s >= ratio * best]


def _runs(keep: set[int]) -> int:
    """Runs of consecutive sentences in `keep`, less one: the gaps marked between them."""
    return max(0, sum(1 for i in keep if i - 1 not in keep) - 1)


def _text(sents: Sequence[str], keep: set[int]) -> str:
    parts: list[str] = []
    for i in sorted(keep):
        if parts and i - 1 not in keep:
            parts.append(GAP.strip())
        parts.append(sents[i])
    return " ".join(parts)
