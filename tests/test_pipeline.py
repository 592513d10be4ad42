"""`targ ask` and an eval question go through the same pipeline: same prompt, context, answers."""

import pytest

from targ_mlx import pipeline
from targ_mlx.assistant import Assistant
from targ_mlx.eval.datasets import QAItem
from targ_mlx.eval.record import RecordSettings, record_batch
from targ_mlx.index import open_retriever
from targ_mlx.settings import Settings


def test_an_asked_and_an_evaluated_question_get_the_same_answers(backbone, small_index_dir, small_index_questions):
    retriever = open_retriever(small_index_dir)
    q = small_index_questions[0]
    item = QAItem(q["id"], q["question"], tuple(q["answers"]))
    s = RecordSettings(k_max=8, ks=(8,), max_tokens=12, baselines=False)
    [rec] = record_batch(backbone, retriever, [item], s)
    same = dict(k=8, max_tokens=12, top_k=s.top_k, context_tokens=s.context_tokens, prompt_style=s.prompt_style)
    a = Assistant(backbone, retriever, Settings(**same))
    always, never = a.answer(q["question"], gate="always"), a.answer(q["question"], gate="never")
    assert always.answer == rec.always["answer"] and always.tokens.context == rec.always["tok_ctx"]
    assert [[p.key, p.title] for p in always.passages] == [p[:2] for p in rec.always["passages"]]
    assert never.answer == rec.never["answer"] and never.tokens.output == rec.never["tok_out"]
    assert never.tokens.prompt == rec.tok_prompt
    # the gate scores the draft the same way: U at k from the record is U the assistant computes
    gated = a.answer(q["question"], gate="margin", tau=1.0)
    assert gated.scores["margin"] == rec.scores["margin"]["8"]
    assert gated.scores["entropy"] == rec.scores["entropy"]["8"]
    # the search-first gate sees the same passages and scores them the same way; declining, it is Never
    looked = a.answer(q["question"], gate="evidence", tau=1.0)
    assert [[p.key, p.title] for p in looked.found] == [p[:2] for p in rec.always["passages"]]
    assert looked.scores["evidence"] == pytest.approx(rec.scores["evidence"]["8"], abs=1e-4)  # record keeps 4 decimals of s_1
    assert looked.answer == never.answer and not looked.retrieved


def test_packing_is_clamped_at_zero(backbone, small_index_dir, small_index_questions):
    """A window with no room left for context packs nothing (the eval's latency pass used to
    pass a negative budget)."""
    retriever = open_retriever(small_index_dir)
    q = small_index_questions[0]["question"]
    hits = retriever.search(q, 3)
    s = Settings(max_tokens=backbone.context_length - 10)
    packed = pipeline.pack(backbone, q, hits, s)
    assert packed.tokens == 0 and packed.text == "" and packed.passages == ()
