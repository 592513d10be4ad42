"""Re-ordering what was found before it is read: a CrossEncoder built here (no weights ship in a
wheel: a tiny randomly initialised BERT with MiniLM's tokenizer, saved as sentence-transformers
saves one), and the loaded LLM as the judge, over the small real index."""

import math
import subprocess
import sys

import pytest

from targ_mlx import rerank
from targ_mlx.retrieval import Passage


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory):
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from targ_mlx.index.encoder import DEFAULT_ENCODER, resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_ENCODER))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, num_labels=1)
    folder = tmp_path_factory.mktemp("cross-encoder")
    BertForSequenceClassification(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def test_reorder_sorts_by_score_and_keeps_the_search_order_on_ties():
    ps = [Passage(i, f"t{i}", "x", 0.9 - i / 10) for i in range(5)]
    assert [p.key for p in rerank.reorder(ps, [0.1, 0.5, 0.1, 0.9, 0.5])] == [3, 1, 4, 0, 2]
    assert [p.key for p in rerank.rerank(None, "q", ps)] == [0, 1, 2, 3, 4]  # no reranker, no change
    with pytest.raises(ValueError, match="2 scores for 5 passages"):
        rerank.reorder(ps, [1, 2])


def test_a_cross_encoder_decides_what_is_read(cross_encoder_dir, assistant_factory, small_index_dir):
    """The passages an answer reads are the search's top 20 in the CrossEncoder's order (its own
    `predict` over the same pairs), not the search's: the top 5 differ from the unranked answer's."""
    from sentence_transformers import CrossEncoder

    from targ_mlx.index import open_retriever

    retriever = open_retriever(small_index_dir)
    q = "who painted the mona lisa"
    plain = assistant_factory(retriever=retriever, gate="always", max_tokens=1).answer(q)
    ranked = assistant_factory(retriever=retriever, gate="always", max_tokens=1, rerank=cross_encoder_dir).answer(q)
    top20 = retriever.search(q, rerank.RERANK_FROM)
    own = CrossEncoder(cross_encoder_dir).predict([(q, rerank.passage_text(p)) for p in top20])
    expected = [p.key for p in rerank.reorder(top20, [float(x) for x in own])][:5]
    assert [p.key for p in ranked.found] == expected
    assert [p.key for p in ranked.found] != [p.key for p in plain.found]


def test_llm_judge_scores_each_passage_as_if_alone(backbone, small_index_dir):
    """One batched prefill of the candidates (left-padded) gives each the P(yes) it gets alone."""
    from targ_mlx.index import open_retriever

    judge = rerank.load_reranker("llm", backbone)
    q = "who painted the mona lisa"
    found = open_retriever(small_index_dir).search(q, 4)
    together = judge.scores(q, found)
    alone = [judge.scores(q, [p])[0] for p in found]
    assert all(0.0 <= x <= 1.0 for x in together)
    assert together == pytest.approx(alone, abs=2e-3)


def test_a_reranker_that_cannot_load_is_one_line_before_the_model(tmp_path):
    missing = tmp_path / "no-such-cross-encoder"
    r = subprocess.run([sys.executable, "-m", "targ_mlx", "ask", "who painted the mona lisa", "--rerank", str(missing),
                        "--db", str(tmp_path / "d.db")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and str(missing) in lines[0] and "fix:" in lines[0], r.stderr
    assert "loading model" not in r.stdout + r.stderr


def test_query_likelihood_finds_the_question_likelier_after_its_own_passage(backbone, small_index_questions):
    """UPR: SmolLM2 finds each question likelier after the passage that answers it than after the
    passage that answers the next question (a real distractor from the same index), and the
    passages' order fuses the search's with that likelihood's."""
    judge = rerank.load_reranker("upr", backbone)
    assert judge.bb is backbone  # SmolLM2 answering: it judges too, nothing else loaded
    rows = small_index_questions[:12]
    wins = 0
    for i, x in enumerate(rows):
        other = rows[(i + 1) % len(rows)]
        own = Passage(1, x["gold_title"], x["gold_text"], 0.5)
        distractor = Passage(2, other["gold_title"], other["gold_text"], 0.5)
        ll = judge.likelihoods(x["question"], [distractor, own])
        wins += ll[1] > ll[0]
    assert wins >= 10, wins  # of 12
    # fused: a passage first in the search and last by likelihood ties one last and first
    assert rerank.fused_with_likelihood([-3.0, -1.0], 1.0) == pytest.approx([1 / 61 + 1 / 62, 1 / 62 + 1 / 61])
    assert rerank.reorder(["a", "b", "c"], rerank.fused_with_likelihood([-1.0, -2.0, -0.5], 2.0)) == ["c", "a", "b"]
    assert rerank.reorder(["a", "b", "c"], rerank.fused_with_likelihood([-1.0, -2.0, -0.5], 0.0)) == ["a", "b", "c"]
    assert rerank.reorder(["a", "b", "c"], rerank.fused_with_likelihood([-1.0, -2.0, -0.5], math.inf)) == ["c", "a", "b"]
