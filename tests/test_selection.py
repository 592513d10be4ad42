"""Selecting what is read from what was found, on real NQ-Open gold passages and pool distractors."""

import json
from itertools import islice

from conftest import NQ_GOLD, WIKI_POOL

from targ_mlx.matching import contains
from targ_mlx.prompts import pack_context
from targ_mlx.retrieval import Passage
from targ_mlx.selection import GAP, bm25_scores, select, sentences, terms


def words(text: str) -> int:
    return len(text.split())


def gold_rows(n: int) -> list[dict]:
    """The first `n` NQ-Open dev questions with a gold passage whose answer is in its middle, not its
    first sentence (so a selection that keeps only openings misses it)."""
    out = []
    with open(NQ_GOLD, encoding="utf-8") as f:
        for row in map(json.loads, f):
            gold = row["passages"][0]
            sents = sentences(gold["text"])
            if len(sents) >= 4 and not contains(sents[0], row["answers"]) and contains(gold["text"], row["answers"]):
                out.append(row)
                if len(out) == n:
                    break
    return out


def distractors(n: int) -> list[Passage]:
    with open(WIKI_POOL, encoding="utf-8") as f:
        rows = [r for r in map(json.loads, islice(f, 400)) if r["source"] == "hipporag_2wiki_corpus"]
    return [Passage(1000 + i, r["title"], r["text"], 0.5) for i, r in enumerate(rows[:n])]


def test_sentences_keep_abbreviations_and_join_fragments():
    text = ("The U.S. Army took the painting in c. 1503. It was sold to the king in 1518. The Louvre holds "
            "it (since 1797). Ibid.")
    assert sentences(text) == ["The U.S. Army took the painting in c. 1503.", "It was sold to the king in 1518.",
                               "The Louvre holds it (since 1797). Ibid."]
    assert sentences("Short. Then a longer second sentence.") == ["Short. Then a longer second sentence."]


def test_bm25_prefers_the_document_with_the_rare_query_word():
    docs = [terms("the painter was born in vinci"), terms("the painter lived in florence"), terms("paris museum")]
    scores = bm25_scores(terms("where was the painter born"), docs)
    assert scores[0] > scores[1] > scores[2] == 0.0


def test_the_answer_sentence_of_a_low_ranked_passage_is_read_within_the_budget():
    """Gold passages ranked 10th behind 9 real distractors: the top 5 packed into 120 words miss the
    answer; the selection reads the gold passage's answer sentence for most questions."""
    rows = gold_rows(20)
    others = distractors(9)
    top5_hits = selected_hits = 0
    for row in rows:
        gold = row["passages"][0]
        found = others + [Passage(1, gold["title"], gold["text"], 0.4)]
        top5 = pack_context(found[:5], 120, lambda s: s.split(), lambda ids: " ".join(ids))
        chosen = select(row["question"], found, 120, words)
        assert sum(words(p.format()) for p in chosen) <= 120
        top5_hits += contains(top5.text, row["answers"])
        selected_hits += contains(" ".join(p.text for p in chosen), row["answers"])
    assert top5_hits == 0
    assert selected_hits >= 16, selected_hits  # of 20 (20 here; 0 when the rank decides alone)


def test_a_passages_chosen_sentences_keep_their_order_with_gaps_marked():
    text = ("Alpha one is the first sentence here. Beta two is unrelated filler text. Gamma three mentions "
            "the zebra crossing. Delta four is more filler text. Epsilon five names the zebra again.")
    p = Passage(7, "Zebra", text, 0.9)
    (chosen,) = select("zebra", [p], 40, words, size=1)
    assert chosen.key == 7 and chosen.title == "Zebra"
    parts = chosen.text.split(f" {GAP.strip()} ")
    assert parts[0].startswith("Alpha") or parts[0].startswith("Gamma")
    kept = sentences(text)
    order = [kept.index(s) for part in parts for s in sentences(part)]
    assert order == sorted(order) and "Gamma" in chosen.text and "Epsilon" in chosen.text


def test_nothing_fits_a_zero_budget_and_no_passages_select_nothing():
    p = Passage(1, "T", "One sentence that is long enough. Another sentence long enough.", 0.9)
    assert select("sentence", [p], 0, words) == []
    assert select("sentence", [], 100, words) == []


def test_an_answer_that_reads_sentences_reads_the_selection_and_the_gate_sees_the_top_k(assistant_factory,
                                                                                         small_index_dir,
                                                                                         small_index_questions):
    from targ_mlx.index import open_retriever

    retriever = open_retriever(small_index_dir)
    q = small_index_questions[0]["question"]
    a = assistant_factory(retriever=retriever, gate="always", max_tokens=2, context_tokens=200)
    whole, picked = a.answer(q), a.answer(q, read="sentences")
    assert [p.key for p in picked.found] == [p.key for p in whole.found]  # the gate's view is unchanged
    assert 0 < picked.tokens.context <= 200 and 0 < whole.tokens.context <= 200
    top20 = {p.key: p.text for p in retriever.search(q, 20)}
    for p in picked.passages:  # each read passage is sentences of one of the top 20, in their order
        assert p.key in top20
        for part in p.text.split(f" {GAP.strip()} "):
            assert part in top20[p.key] or part.strip() in top20[p.key]
    assert [p.text for p in picked.passages] != [p.text for p in whole.passages]


def test_reading_depth_stops_at_windows_far_below_the_best():
    """With min_ratio, a question whose answer one window carries reads that window, not the budget."""
    rows = gold_rows(10)
    others = distractors(9)
    full = deep = 0
    for row in rows:
        gold = row["passages"][0]
        found = [Passage(1, gold["title"], gold["text"], 0.9)] + others
        everything = select(row["question"], found, 300, words)
        focused = select(row["question"], found, 300, words, min_ratio=0.7)
        full += sum(words(p.format()) for p in everything)
        deep += sum(words(p.format()) for p in focused)
        assert {p.key for p in focused} <= {p.key for p in everything}
    assert deep < 0.6 * full, (deep, full)


def test_support_is_the_largest_share_of_the_question_one_sentence_holds():
    """A sentence that names every content word of the question (with its passage's title) gives 1;
    words spread over two sentences count only as far as one sentence holds them; a question of
    function words only, or no passages, gives 0."""
    from targ_mlx.selection import support

    q = "who painted the mona lisa"  # content words: painted, mona, lisa
    spread = [("Mona Lisa", "It hangs in the Louvre in Paris. Leonardo da Vinci painted it around 1503.")]
    assert support(q, spread) == 1.0  # the title holds mona, lisa; the second sentence holds painted
    apart = [("Louvre", "The Mona Lisa hangs here. Many painted portraits hang beside it.")]
    assert support(q, apart) == 2 / 3  # mona lisa in one sentence, painted in another
    assert support(q, [("Louvre", "A museum in Paris.")]) == 0.0
    assert support("who is it", spread) == 0.0 and support(q, []) == 0.0
    assert support(q, apart + spread) == 1.0  # the best passage decides, not the first


def test_the_gate_sees_the_support_of_what_the_search_found(assistant_factory, small_index_dir, small_index_questions,
                                                            tmp_path):
    """The runner computes the support over the passages the gate sees (the found top K, as packed)
    and the answer, its JSON and the decision log's row carry it."""
    from targ_mlx.index import open_retriever
    from targ_mlx.log.decisions import DecisionLog
    from targ_mlx.selection import support

    log = DecisionLog(tmp_path / "log.db")
    a = assistant_factory(retriever=open_retriever(small_index_dir), gate="evidence", max_tokens=2, log=log)
    q = small_index_questions[0]["question"]
    ans = a.answer(q)
    found = open_retriever(small_index_dir).search(q, len(ans.found))
    assert [p.key for p in found] == [p.key for p in ans.found]
    # the packed passages are the found ones, cut to the budget: the support of their packed text
    assert ans.support is not None and 0.0 < ans.support <= 1.0
    assert ans.support <= support(q, [(p.title, p.text) for p in found]) + 1e-12
    assert ans.to_dict()["support"] == ans.support
    assert log.rows(limit=1)[0]["extra"]["support"] == ans.support
