"""`targ ask` and an eval question go through the same pipeline: same prompt, context, answers."""

import pytest

from targ_mlx import pipeline
from targ_mlx.assistant import Assistant
from targ_mlx.eval.datasets import QAItem
from targ_mlx.eval.record import EvalSettings, eval_answer, record_batch
from targ_mlx.index import open_indexes, open_retriever
from targ_mlx.settings import Settings


def test_an_asked_and_an_evaluated_question_get_the_same_answers(backbone, small_index_dir, small_index_questions):
    retriever = open_retriever(small_index_dir)
    q = small_index_questions[0]
    item = QAItem(q["id"], q["question"], tuple(q["answers"]))
    s = EvalSettings(eval_answer(max_tokens=12), k_max=8, ks=(8,), baselines=False)
    [rec] = record_batch(backbone, retriever, [item], s)
    same = dict(k=8, max_tokens=12, top_k=s.answer.top_k, context_tokens=s.answer.context_tokens, prompt_style=s.answer.prompt_style)
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
    # and asks the passages the same question: do they say what the draft says?
    assert looked.confirmed is not None and int(looked.confirmed) == rec.always["confirms"]["8"]


def test_the_eval_searches_with_the_draft_route_as_the_app_does(backbone, small_index_dir, small_index_questions):
    """--draft-route in the eval: the Always branch reads what question + the k-token draft finds
    (fused beside the question's own ranking), the passages `targ ask`'s evidence gate finds with
    the same draft; off, the question's own. On these questions the route changes what is read."""
    retriever = open_retriever(small_index_dir)
    rows = small_index_questions[:8]
    items = [QAItem(q["id"], q["question"], tuple(q["answers"])) for q in rows]
    routed = record_batch(backbone, retriever, items, EvalSettings(eval_answer(max_tokens=12, k=8, draft_route=1.0),
                                                                   k_max=8, ks=(8,), baselines=False))
    plain = record_batch(backbone, retriever, items, EvalSettings(eval_answer(max_tokens=12, k=8), k_max=8, ks=(8,),
                                                                  baselines=False))
    s = routed[0]
    a = Assistant(backbone, retriever, Settings(k=8, max_tokens=12, top_k=5, context_tokens=eval_answer().context_tokens,
                                                prompt_style=eval_answer().prompt_style, draft_route=1.0))
    moved = 0
    for q, r, p in zip(rows, routed, plain):
        looked = a.answer(q["question"], gate="evidence", tau=1.0)
        assert [[x.key, x.title] for x in looked.found] == [x[:2] for x in r.always["passages"]]
        assert r.draft == p.draft and r.never == p.never  # the route changes only what is read
        moved += [x[0] for x in r.always["passages"]] != [x[0] for x in p.always["passages"]]
    assert moved >= 1
    assert s.always["passages"]


def test_packing_is_clamped_at_zero(backbone, small_index_dir, small_index_questions):
    """A window with no room left for context packs nothing (the eval's latency pass used to
    pass a negative budget)."""
    retriever = open_retriever(small_index_dir)
    q = small_index_questions[0]["question"]
    hits = retriever.search(q, 3)
    s = Settings(max_tokens=backbone.context_length - 10)
    packed = pipeline.pack(backbone, q, hits, s)
    assert packed.tokens == 0 and packed.text == "" and packed.passages == ()


def test_a_draft_is_confirmed_where_the_context_says_its_claim_words_before_eos(backbone):
    """`confirms`: every word of the draft's text up to its first EOS that the question does not
    already say (nor a function word) occurs in the context as a word; a short answer and a
    sentence answer are confirmed alike."""
    tok = backbone.tokenizer
    eos = next(iter(tok.eos_ids))
    q = "who painted the mona lisa"
    context = "[Mona Lisa] The Mona Lisa is a portrait painting by the Italian artist Leonardo da Vinci."
    for answer in ("Leonardo da Vinci", "Leonardo da Vinci painted the Mona Lisa.", "It was painted by Leonardo da Vinci"):
        assert pipeline.confirms(tok, tok.encode(answer) + [eos], context, q), answer
    assert not pipeline.confirms(tok, tok.encode("Raphael painted the Mona Lisa.") + [eos], context, q)
    assert not pipeline.confirms(tok, tok.encode("Leonardo da Vinci in 1503") + [eos], context, q)  # 1503: not said
    # what follows the EOS is not part of the answer
    assert pipeline.confirms(tok, tok.encode("Leonardo da Vinci") + [eos] + tok.encode(" and Raphael"), context, q)
    # words, not substrings: "20" is not said by "2020"
    assert not pipeline.confirms(tok, tok.encode("20") + [eos], "It was built in 2020.", "when was it built")
    assert pipeline.confirms(tok, tok.encode("In 2020.") + [eos], "It was built in 2020.", "when was it built")
    # an answer that only restates the question, or nothing, says nothing
    assert not pipeline.confirms(tok, tok.encode("The Mona Lisa.") + [eos], context, q)
    assert not pipeline.confirms(tok, [eos], context, q)


def test_the_read_passages_are_those_close_to_the_most_similar_one_in_the_ranking_order():
    from targ_mlx.selection import read_among

    assert read_among([0.70, 0.69, 0.50], 0.98) == [0, 1] and read_among([0.70, 0.69, 0.50], 0.0) == [0, 1, 2]
    assert read_among([0.70, 0.40], 0.99) == [0] and read_among([-0.1, 0.2], 0.9) == [1] and read_among([], 0.9) == []
    assert read_among([-0.3, -0.1], 0.9) == [0, 1]  # no positive similarity: a share means nothing, all read
    # the best passage ranked below others (BM25, hybrid): read by its similarity, in the ranking's order
    assert read_among([0.60, 0.70, 0.50, 0.69], 0.98) == [1, 3]


def test_reading_depth_reads_only_the_passages_close_to_the_most_similar_one(assistant_factory, small_index_dir,
                                                                             small_index_questions):
    """--depth-ratio R: the answer reads the top-K passages whose similarity is at least R x the
    best similarity among them, in the ranking's order, says so truly in its reason, and the gate
    still sees all K (found); R = 0 reads all K. On a BM25 ranking (not sorted by similarity) that
    is not the first few of the ranking."""
    bm25 = open_indexes([small_index_dir], retriever="bm25")
    q, ratio = _unsorted_ranking_and_ratio(bm25, [x["question"] for x in small_index_questions])
    full = assistant_factory(retriever=bm25, gate="always", max_tokens=1).answer(q)
    cut = assistant_factory(retriever=bm25, gate="always", max_tokens=1, depth_ratio=ratio).answer(q)
    best = max(p.score for p in full.found)
    expected = [p.key for p in full.found if p.score >= ratio * best]
    assert len(full.passages) == len(full.found) == 5 and 0 < len(expected) < 5
    assert expected != [p.key for p in full.found[: len(expected)]]  # not a prefix of the ranking
    assert [p.key for p in cut.passages] == expected
    assert [p.key for p in cut.found] == [p.key for p in full.found]  # what the gate looked at is unchanged
    # the reason is true: every passage left out is below R x the best similarity
    assert all(p.score < ratio * best for p in cut.found if p.key not in expected)
    assert (f"read {len(expected)} of 5 passages (the rest below {ratio:g} x the best one's similarity)" in cut.reason
            and "of 5 passages" not in full.reason)
    assert cut.tokens.context < full.tokens.context


def _unsorted_ranking_and_ratio(retriever, questions: list[str]) -> tuple[str, float]:
    """The first question whose top 5 (by `retriever`) has a similarity cut that is not a prefix of
    its ranking, and a ratio R midway in that cut."""
    for q in questions:
        scores = [p.score for p in retriever.search(q, 5)]
        best = max(scores)
        desc = sorted(set(scores), reverse=True)
        for hi, lo in zip(desc, desc[1:]):
            keep = [s >= hi for s in scores]
            if best > 0 and lo > 0 and keep != sorted(keep, reverse=True):  # some kept passage ranks below a dropped one
                return q, round((hi + lo) / 2 / best, 6)
    raise AssertionError("no question's BM25 ranking of the small index is out of similarity order")


def test_read_each_asked_and_evaluated_choose_the_same_answer_and_cite_what_holds_it(
        backbone, small_index_dir, small_index_questions):
    """read="each": every distinct passage in its own prompt, the question alone as one more, the
    answer chosen by evidence; `targ ask` and the eval's batched record take the same path."""
    from targ_mlx import reader

    retriever = open_retriever(small_index_dir)
    s = EvalSettings(eval_answer(max_tokens=12, read="each"), k_max=8, ks=(8,), baselines=False)
    rows = small_index_questions[:4]
    recs = record_batch(backbone, retriever, [QAItem(q["id"], q["question"], tuple(q["answers"])) for q in rows], s)
    a = Assistant(backbone, retriever, Settings(k=8, max_tokens=12, top_k=s.answer.top_k, context_tokens=s.answer.context_tokens,
                                                prompt_style=s.answer.prompt_style, read="each"))
    for q, rec in zip(rows, recs):
        ans = a.answer(q["question"], gate="always")
        cands = rec.always["candidates"]
        assert len(cands) == reader.READ_EACH + 1 and cands[-1]["source"] == reader.CLOSED_BOOK
        assert ans.answer == rec.always["answer"] and ans.answer in [c["text"] for c in cands]
        assert len({p[1] for p in rec.always["read"]}) == len(rec.always["read"])  # one passage per topic
        assert f"read {len(rec.always['read'])} distinct passages one at a time, chose" in ans.reason
        chosen = next(c for c in cands if c["text"] == ans.answer)
        said = reader.claim(ans.answer, q["question"])
        read = [r[1] for r in rec.always["read"]]
        source = read[chosen["source"]] if chosen["source"] >= 0 else None
        for p in ans.passages:  # cited: the passage it came from, or one whose sentence says it
            assert p.title in read
            assert p.title == source or any(
                reader.held(said, set(reader.normalize(x).split()), set(reader.normalize(p.title).split()))
                >= reader.MIN_HOLD for x in reader.sentences(p.text))


def test_a_wrong_draft_adds_a_ranking_and_never_replaces_the_questions_own(backbone, small_index_dir,
                                                                            small_index_questions):
    """The draft as a search route: question + draft is fused beside the question's own ranking.
    A wrong draft ("Napoleon ...") may bring its passages in, but the question's own top 3 lead the
    top 5 in their order (plain rank fusion let passages both rankings hold half-way down push the
    question's own 2nd out); a right one (the gold answer) never moves the gold passage down."""
    from targ_mlx import retrieval

    r = open_retriever(small_index_dir)
    s = Settings(draft_route=1.0, top_k=5)
    added = 0
    for row in small_index_questions[:12]:
        q = row["question"]
        own = r.search(q, 20)
        wrong, _, searched = pipeline.retrieve(backbone, r, q, s, draft="Napoleon Bonaparte, crowned in Paris in 1804")
        assert searched == f"{q}{pipeline.QUERY_SEPARATOR}{retrieval.draft_query(q, 'Napoleon Bonaparte, crowned in Paris in 1804')}"
        assert [p.key for p in wrong.passages[:3]] == [p.key for p in own[:3]]
        added += [p.key for p in wrong.passages] != [p.key for p in own[:5]]  # the route brought its own in
        right, _, _ = pipeline.retrieve(backbone, r, q, s, draft=row["answers"][0])
        rank = lambda ps: next((i for i, p in enumerate(ps) if p.title == row["gold_title"]), 99)  # noqa: E731
        assert rank(right.passages) <= rank(own[:5])
    assert added >= 1
    # off (the default), or no draft: the question's own ranking alone
    plain, _, searched = pipeline.retrieve(backbone, r, small_index_questions[0]["question"], Settings(top_k=5),
                                           draft="Napoleon")
    assert [p.key for p in plain.passages] == [p.key for p in r.search(small_index_questions[0]["question"], 5)]
    assert pipeline.QUERY_SEPARATOR not in searched
