"""Reading each passage on its own, and choosing the answer by the evidence for it.

One prompt holding five passages asks a small model to find the answer among distractors, and it
often takes the distractor: over the large index the 1.5B answered "Ernest Shackleton" to "who was
the first person to reach the south pole" with Roald Amundsen's passage in its context (two other
passages were about Shackleton's expedition). Here instead (training-free, in the spirit of
evidence aggregation over per-passage readers):

1. `distinct`: the search's passages, one per topic (another chunk of the same article, or the
   same subject from another source, is not read twice), refilled from deeper ranks;
2. the first `READ_EACH` of them each in its own prompt with the question, and the question alone
   (closed book), decoded as one batch: each gives a short candidate and its mean log-probability;
3. `choose`: the candidate the evidence supports best. Counting votes is not enough (two passages
   of one expedition vote twice); what decides is above all the one sentence that holds the
   candidate *and* most of what the question asks (`Support.sentence`), then how many of the
   search's top passages hold it, weighted by rank (`Support.rank`), its own likelihood, and
   whether its form fits the question (a number for "when" or "how many": `Support.typed`).

The choice and the dedup are pure functions over strings. The readings are decoded by the runner
(one question, `targ ask` / chat / serve) and the eval's record (many at once), both through
`pipeline.each_prompts` and `pipeline.choose`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Sequence

from targ_mlx.defaults import READ_EACH  # noqa: F401  (m: the passages read one at a time)
from targ_mlx.matching import FUNCTION_WORDS, normalize
from targ_mlx.retrieval import Passage
from targ_mlx.selection import sentences, terms

# Tokens each reading decodes before the choice: enough for a short answer or a sentence; the
# chosen one, if longer, goes on alone to the answer cap (runner), so no row of the batch runs on
# to 256 tokens for an answer that is not shown
CANDIDATE_TOKENS = 48
SUPPORT_FROM = 20  # the search's passages whose sentences and ranks count as evidence
SHINGLE = 5  # words in a shingle; two passages sharing >= MIN_OVERLAP of them say the same thing
MIN_OVERLAP = 0.5
MIN_HOLD = 0.5  # the least share of an answer's claim words a sentence must have to count as evidence
CLOSED_BOOK = -1  # a candidate's source when it came from the question alone (the draft's prompt)


@dataclass(frozen=True)
class Weights:
    """How the evidence adds up (`score`): chosen on the dev halves of the large BM25 cells of both
    models pooled (580 questions, scripts/bench/bench_reader.py, results/reader.md); the answer-form
    check (`typed`) earned no weight there."""

    sentence: float = 1.0
    rank: float = 0.1
    likelihood: float = 0.5
    typed: float = 0.0
    votes: float = 0.25  # per reading beyond the first that gave the same answer


WEIGHTS = Weights()


@dataclass(frozen=True)
class Candidate:
    """One reading's answer: its text, mean log p of its tokens, and what it read (its passage's
    place among those read, or CLOSED_BOOK)."""

    text: str
    logprob: float
    source: int
    tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class Support:
    """The evidence for one candidate, each part in [0, 1]."""

    sentence: float  # the best (share of the question's words) x (share of the answer's) in one sentence with its title
    rank: float  # the search's top passages holding it, each weighted share held / (1 + rank), over the most possible
    likelihood: float  # exp(mean log p): the model's own confidence in the words it gave
    typed: float  # 1 if its form fits what the question asks (a number for when / what year / how many), else 0
    votes: int = 1  # readings that gave it (duplicates are not read, so one article does not vote twice)


@dataclass(frozen=True)
class Choice:
    """The chosen candidate, every distinct candidate with its support and score (best first), and
    which of the read passages hold the answer (the ones cited)."""

    answer: Candidate
    ranked: tuple[tuple[Candidate, Support, float], ...]
    cited: tuple[int, ...]  # indices into the passages read


# --- duplicates ------------------------------------------------------------------------------

def topic(title: str) -> str:
    """A passage's topic as its normalised title: "Leonardo da Vinci" from the English article, its
    Simple English twin and its Vital lead are one topic; "Mercury (planet)" and "Mercury
    (element)" are two."""
    return normalize(title)


def shingles(text: str, n: int = SHINGLE) -> set[tuple[str, ...]]:
    words = normalize(text).split()
    return {tuple(words[i:i + n]) for i in range(max(1, len(words) - n + 1))} if words else set()


def overlap(a: set, b: set) -> float:
    """Shared shingles over the smaller passage's: 1.0 when one passage is inside the other."""
    return len(a & b) / min(len(a), len(b)) if a and b else 0.0


def distinct(passages: Sequence[Passage], k: int, min_overlap: float = MIN_OVERLAP) -> list[Passage]:
    """The first `k` of `passages` (in their order) that are not the topic of one taken before:
    not the same normalised title, and not sharing `min_overlap` of their word shingles. A
    duplicate's place goes to the next distinct passage further down."""
    out: list[Passage] = []
    seen_topics: set[str] = set()
    seen_shingles: list[set] = []
    for p in passages:
        if len(out) >= k:
            break
        t, sh = topic(p.title), shingles(p.text)
        if (t and t in seen_topics) or any(overlap(sh, s) >= min_overlap for s in seen_shingles):
            continue
        out.append(p)
        seen_topics.add(t)
        seen_shingles.append(sh)
    return out


def duplicate_share(passages: Sequence[Passage]) -> float:
    """The share of `passages` (as read) whose topic one before them already had."""
    if not passages:
        return 0.0
    return 1.0 - len(distinct(passages, len(passages))) / len(passages)


# --- the choice ------------------------------------------------------------------------------

_WHEN_QUESTION = re.compile(r"^\s*(when|what year|which year|in what year|in which year|what date|on what date)\b",
                            re.I)
# ("how long" is not here: "life imprisonment" answers it)
_COUNT_QUESTION = re.compile(r"^\s*(how many|how much|how old|how far|how tall|how high|how big)\b", re.I)
# What a time looks like: a year (3-4 digits, or any with BC / AD), a month, a century, a season or
# a part of the day, or how often ("held annually", "every two to six years", "late-night").
_TIME_WORDS = ("january february march april may june july august september october november december "
               "spring summer autumn fall winter morning afternoon evening night midnight noon "
               "every annually yearly monthly weekly daily")
_TIME = re.compile(r"\b(\d{3,4}s?|\d+\s*(bc|bce|ad|ce)|\d+(st|nd|rd|th)\s+century|"
                   + "|".join(_TIME_WORDS.split()) + r")\b", re.I)
_COUNT = re.compile(r"\d|\b(one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|forty|fifty|"
                    r"hundred|thousand|million|billion|dozen|none|zero|once|twice)\b", re.I)


def fits_form(question: str, answer: str) -> bool:
    """Whether `answer`'s form fits what `question` asks: a time (a year, a month, a century, a
    season, how often) where it asks when, a number where it asks how many or how much; any answer
    otherwise. "his 30s" says no year."""
    if _WHEN_QUESTION.match(question):
        return bool(_TIME.search(answer))
    return not _COUNT_QUESTION.match(question) or bool(_COUNT.search(answer))


def options(question: str) -> set[str]:
    """The words of the alternatives a question offers ("who sold the most records elvis or the
    beatles": elvis, beatles): the words after its last "or" and as many before it, function words
    dropped."""
    words = normalize(question).split()
    if "or" not in words:
        return set()
    i = len(words) - 1 - words[::-1].index("or")
    after = words[i + 1:]
    return {w for w in words[max(0, i - len(after)):i] + after if w not in FUNCTION_WORDS}


def claim(answer: str, question: str) -> set[str]:
    """The words an answer claims with: normalised, function words and the question's own words
    dropped. An answer that only restates the question ("San Jose" to "where do the sharks play
    in san jose") claims nothing, so no sentence can support it; one that picks an alternative the
    question offers ("The Beatles" to "... elvis or the beatles") claims that alternative."""
    asked = set(normalize(question).split()) - options(question)
    return {w for w in normalize(answer).split() if w not in FUNCTION_WORDS and w not in asked}


def _units(passages: Sequence[Passage]) -> list[tuple[int, set[str], set[str], set[str]]]:
    """(rank, the sentence's words, its title's words, its terms with its title's) for every
    sentence."""
    out = []
    for r, p in enumerate(passages):
        head, head_terms = set(normalize(p.title).split()), set(terms(p.title))
        for s in sentences(p.text) or [p.text]:
            out.append((r, set(normalize(s).split()), head, head_terms | set(terms(s))))
    return out


def held(said: set[str], words: set[str], title: set[str]) -> float:
    """The share of an answer's claim words a sentence says. The sentence must name some of it
    itself, and its title may complete the name ("Amundsen ... became the first man to reach the
    South Pole" under "Roald Amundsen" holds all of Roald Amundsen); a sentence that does not
    mention it holds none, whatever its title (under "Ernest Shackleton", "Amundsen led the first
    group to reach the pole" does not say Shackleton)."""
    if not said or not said & words:
        return 0.0
    return len(said & (words | title)) / len(said)


def holders(question: str, answer: str, passages: Sequence[Passage]) -> set[int]:
    """The places in `passages` of those with a sentence holding `answer` (`held`, at least
    MIN_HOLD of its claim words): the passages that back it, the ones `choose` cites."""
    said = claim(answer, question)
    return {r for r, words, title, _ in _units(passages) if held(said, words, title) >= MIN_HOLD}


def support(question: str, answer: str, passages: Sequence[Passage], logprob: float,
            units: Sequence[tuple] | None = None) -> Support:
    """The evidence in `passages` (the search's top ones, best first) for `answer` to `question`.

    A sentence holds an answer by the share of its claim words it says (`held`), at least
    MIN_HOLD: a long answer's every word need not be in one sentence."""
    units = _units(passages) if units is None else units
    said = claim(answer, question)
    asked = set(terms(question))
    best, by_rank = 0.0, {}
    if said:
        for r, words, title, ts in units:
            h = held(said, words, title)
            if h < MIN_HOLD:
                continue
            by_rank[r] = max(by_rank.get(r, 0.0), h)
            best = max(best, h * (len(asked & ts) / len(asked) if asked else 0.0))
    most = sum(1.0 / (1 + r) for r in range(len(passages))) or 1.0
    typed = 1.0 if fits_form(question, answer) else 0.0
    return Support(best, sum(h / (1 + r) for r, h in by_rank.items()) / most,
                   math.exp(max(logprob, -20.0)) if said else 0.0, typed)


def score(s: Support, w: Weights = WEIGHTS) -> float:
    return (w.sentence * s.sentence + w.rank * s.rank + w.likelihood * s.likelihood + w.typed * s.typed
            + w.votes * (s.votes - 1))


def supports(question: str, candidates: Sequence[Candidate], passages: Sequence[Passage]
             ) -> list[tuple[Candidate, Support]]:
    """Every distinct candidate (equal answers, normalised, are one: its best likelihood, its first
    source, its votes counted) with the evidence for it, in reading order. The part of `choose`
    that does not depend on the weights."""
    groups: dict[str, list[Candidate]] = {}
    for c in candidates:
        groups.setdefault(normalize(c.text), []).append(c)
    claims = {key: claim(cs[0].text, question) for key, cs in groups.items()}
    # a partial answer ("Freud") counts for the fuller one that contains it ("Sigmund Freud"): its
    # readings vote there, and it does not compete with it
    for key in list(groups):
        fuller = [k for k in groups if k != key and claims[key] and claims[key] < claims[k]]
        if fuller:
            groups[fuller[0]] += groups.pop(key)
    units = _units(passages)
    out = []
    for cs in groups.values():
        first = replace(cs[0], logprob=max(c.logprob for c in cs))
        out.append((first, replace(support(question, first.text, passages, first.logprob, units), votes=len(cs))))
    return sorted(out, key=lambda x: min(c.source if c.source >= 0 else 10**6 for c in groups[normalize(x[0].text)]))


def rank(supported: Sequence[tuple[Candidate, Support]], w: Weights = WEIGHTS) -> list[tuple[Candidate, Support, float]]:
    """`supports`' candidates scored, best first; ties keep reading order; an empty answer scores
    nothing."""
    scored = [(c, sup, score(sup, w) if normalize(c.text) else -math.inf) for c, sup in supported]
    return sorted(scored, key=lambda x: -x[2])  # stable


def choose(question: str, candidates: Sequence[Candidate], passages: Sequence[Passage],
           read: Sequence[Passage] = (), w: Weights = WEIGHTS) -> Choice:
    """The candidate the evidence supports best.

    Args:
        question: what the sentences are matched on (in a chat, the search form that carries the
            conversation: "when was leonardo da vinci born", not "when was he born?").
        candidates: the readings' answers (per passage, and closed book), in the order read.
        passages: the search's top passages (SUPPORT_FROM), best first: the evidence.
        read: the passages that were read, for `Choice.cited`.
    Ties go to the earlier candidate (a better-ranked passage).
    """
    if not candidates:
        raise ValueError("choose needs at least one candidate")
    ranked = rank(supports(question, candidates, passages), w)
    chosen = ranked[0][0]
    holding = holders(question, chosen.text, read)
    cited = tuple(i for i in range(len(read)) if i in holding or i == chosen.source)
    return Choice(chosen, tuple(ranked), cited)
