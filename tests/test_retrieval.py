"""ExactRetriever: brute-force search over real passages; agrees with the on-disk index."""

import json

import pytest

from targ_mlx.index import open_retriever
from targ_mlx.index.exact import ExactRetriever
from targ_mlx.retrieval import Passage, Retriever


@pytest.fixture(scope="module")
def exact(small_index_corpus):
    rows = [json.loads(line) for line in small_index_corpus.read_text().splitlines()]
    return ExactRetriever([(r["title"], r["text"]) for r in rows])


def test_passage_format():
    assert Passage(1, "Ada Lovelace", "She wrote notes.", 0.5).format() == "[Ada Lovelace] She wrote notes."


def test_exact_retriever_finds_gold(exact, small_index_questions):
    assert isinstance(exact, Retriever)
    results = exact.search_batch([q["question"] for q in small_index_questions], k=5)
    hits = sum(any(p.text == q["gold_text"] for p in ps) for q, ps in zip(small_index_questions, results))
    assert hits / len(small_index_questions) >= 0.8
    ps = exact.search(small_index_questions[0]["question"], k=3)
    assert len(ps) == 3 and ps[0].score >= ps[1].score >= ps[2].score
    assert exact.search_batch([], k=3) == []
    with pytest.raises(ValueError, match="k must be"):
        exact.search("x", k=0)


def test_exact_and_index_agree_on_top1(exact, small_index_dir, small_index_questions):
    index = open_retriever(small_index_dir)
    questions = [q["question"] for q in small_index_questions[:20]]
    # the index holds chunks of these passages (whitespace normalised, f16): its top-1 should be
    # a chunk of the exact top-1 passage
    pairs = zip(exact.search_batch(questions, 1), index.search_batch(questions, 1))
    agree = sum(_norm(b[0].text) in _norm(a[0].text) for a, b in pairs)
    assert agree >= 18


def _norm(text: str) -> str:
    return " ".join(text.split())
