"""Does one text contain an answer? SQuAD's normalisation and word-bounded containment.

The eval scores answers with these (accuracy = a gold answer contained in the output, as in
PopQA/Self-RAG), and the evidence gate asks a like question of the search: does the context it
would read already say what the model's draft says (`says`)? Both here in the core, so the runner
needs nothing from the eval.
"""

from __future__ import annotations

import re
import string
from typing import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize(text: str) -> str:
    """SQuAD's normalize_answer: lower, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def contains(text: str, answers: Sequence[str]) -> float:
    """1.0 iff some normalised answer occurs in the normalised text as whole words.

    For ASQA this is STR-EM (a gold short answer contained in the output).
    """
    p = f" {normalize(text)} "
    return float(any(normalize(a) and f" {normalize(a)} " in p for a in answers))


# Words that carry no claim: a draft's answer is what remains once these and the question's own
# words are gone ("Leonardo da Vinci painted the Mona Lisa." asked "who painted the mona lisa"
# leaves leonardo, da, vinci).
FUNCTION_WORDS = frozenset(
    "a an the and or of in on at to for from by with as is was were are be been being it its he she they "
    "his her their this that these those which who whom whose what when where why how not no yes did "
    "does do has have had also than then there here i you we".split())


def claim_words(answer: str, question: str) -> list[str]:
    """The words of `answer` that say something the question does not: normalised, minus the
    question's words and function words, in order."""
    asked = set(normalize(question).split())
    return [w for w in normalize(answer).split() if w not in asked and w not in FUNCTION_WORDS]


def says(context: str, answer: str, question: str) -> bool:
    """Whether `context` says what `answer` says: every claim word of the answer occurs in it as a
    word. An answer with no claim words (empty, or only restating the question) says nothing."""
    words = claim_words(answer, question)
    if not words:
        return False
    have = set(normalize(context).split())
    return all(w in have for w in words)
