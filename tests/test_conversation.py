"""History budgeting and standalone search queries, on real TREC CAsT turns and the real SmolLM2."""

import json
from pathlib import Path

import pytest

from targ_mlx.conversation import (
    TURN_OVERHEAD_TOKENS,
    Turn,
    answer_query,
    clean_rewrite,
    fit_history,
    model_rewrite,
    questions_query,
    search_queries,
    turns_from_messages,
)
from targ_mlx.log.decisions import DecisionLog
from targ_mlx.retrieval import Passage, fuse

CAST = [json.loads(line) for line in (Path(__file__).parent / "fixtures" / "cast_turns.jsonl").open()]


def words(text: str) -> int:
    return len(text.split())


def test_fit_history_drops_oldest_first():
    turns = [Turn("one two", "three"), Turn("four", "five six"), Turn("seven", "eight nine")]
    per_turn = 3 + TURN_OVERHEAD_TOKENS  # 3 words each in this count
    assert fit_history(turns, 3 * per_turn, words) == tuple(turns)
    assert fit_history(turns, 2 * per_turn, words) == tuple(turns[1:])
    assert fit_history(turns, 2 * per_turn - 1, words) == (turns[2],)
    assert fit_history(turns, 0, words) == ()


def test_turns_from_a_saved_transcript():
    with DecisionLog(":memory:") as log:
        for role, text in [("user", "who painted the mona lisa"), ("assistant", "Leonardo da Vinci."),
                           ("system", "/help text"), ("user", "when was he born?"), ("assistant", "In 1452."),
                           ("user", "left unanswered")]:
            log.add_message("s1", role, text)
        turns = turns_from_messages(log.messages("s1"))
    assert turns == [Turn("who painted the mona lisa", "Leonardo da Vinci."), Turn("when was he born?", "In 1452.")]


@pytest.mark.parametrize("row", [r for r in CAST if r["history"]], ids=lambda r: r["id"])
def test_questions_form_carries_the_topic(row):
    history = [Turn(q, "") for q in row["history"]]
    query = questions_query(row["question"], history)
    # every earlier question the prompt keeps: the form that found most of what the manual rewrites find
    assert query.endswith(row["question"]) and all(q.strip() in query for q in row["history"])
    assert search_queries(row["question"], history, "questions") == [query]
    assert search_queries(row["question"], history, "none") == [row["question"]]


@pytest.mark.parametrize("row", [r for r in CAST if r["history"]], ids=lambda r: r["id"])
def test_answer_form_adds_the_last_answer_before_the_question(row):
    # CAsT has no answers: a stand-in answer per earlier question (the benchmark generates real ones)
    history = [Turn(q, "The Zanzibar.") for q in row["history"]]
    query = answer_query(row["question"], history)
    assert query == f"zanzibar {row['question']}"  # what the answer says beyond its question
    assert answer_query(row["question"], history, whole=True) == f"{history[-1].answer} {row['question']}"
    assert search_queries(row["question"], history, "answer") == [query]
    every = answer_query(row["question"], history, kept=None)
    assert every == " ".join([q.strip() for q in row["history"]] + ["zanzibar", row["question"]])
    # without an answer (CAsT gives none) the method falls back to the questions form
    no_answers = [Turn(q, "") for q in row["history"]]
    assert answer_query(row["question"], no_answers, kept=None) == questions_query(row["question"], no_answers)
    assert search_queries(row["question"], no_answers, "answer") == [questions_query(row["question"], no_answers)]
    # the default searches the question as asked beside the questions form, and the answer form after an answer
    assert search_queries(row["question"], no_answers) == [row["question"], questions_query(row["question"], no_answers)]
    assert search_queries(row["question"], history) == [row["question"], questions_query(row["question"], history),
                                                        query]


def test_answer_form_names_who_was_answered():
    history = [Turn("who painted the mona lisa", "Leonardo da Vinci painted the Mona Lisa.")]
    assert search_queries("when was he born?", history, "answer") == ["leonardo da vinci when was he born?"]
    assert "Leonardo" not in search_queries("when was he born?", history, "questions")[0]


def test_an_answer_from_memory_alone_is_not_searched_with():
    """A wrong answer the model gave from memory ("Tommaso di Ser Giovanni di Simone", Masaccio's
    birth name) must not become the next question's search: the answer form is used only for an
    answer read from a source or confirmed by one (Turn.grounded, from the decision log)."""
    grounded = [Turn("who painted the mona lisa", "Leonardo da Vinci")]
    unsourced = [Turn("who painted the mona lisa", "Tommaso di Ser Giovanni di Simone", False)]
    assert any("leonardo" in q for q in search_queries("when was he born?", grounded))
    assert not any("tommaso" in q.lower() for q in search_queries("when was he born?", unsourced))
    assert not any("tommaso" in q.lower() for q in search_queries("when was he born?", unsourced, "answer"))
    from targ_mlx.records import Answer, PassageRef

    with DecisionLog(":memory:") as log:  # the log says which answers had a source
        read = log.record(Answer(question="who painted the mona lisa", answer="Leonardo da Vinci", model="m", gate="always",
                                 tau=0.0, score=None, retrieved=True, passages=(PassageRef(1, "Mona Lisa", 0.7),)),
                          source="chat", session="s1")
        memory = log.record(Answer(question="who was the first person to reach the south pole", answer="Ernest Shackleton",
                                   model="m", gate="never", tau=0.0, score=None, retrieved=False), source="chat", session="s1")
        for role, text, d in [("user", "who painted the mona lisa", None), ("assistant", "Leonardo da Vinci", read),
                              ("user", "who was the first person to reach the south pole", None),
                              ("assistant", "Ernest Shackleton", memory)]:
            log.add_message("s1", role, text, d)
        turns = turns_from_messages(log.messages("s1"), log.grounded)
    assert [t.grounded for t in turns] == [True, False]
    from targ_mlx.prompts import messages  # and such turns still go into the prompt as (question, answer)

    assert [m["content"] for m in messages("when was he born?", history=turns)][1:4] == [
        "who painted the mona lisa", "Leonardo da Vinci", "who was the first person to reach the south pole"]


def test_first_turn_is_searched_as_asked():
    first = CAST[0]
    assert not first["history"]
    for method in ("questions", "fused", "answer"):
        assert search_queries(first["question"], [], method) == [first["question"]]


def passages(*keys: int) -> list[Passage]:
    return [Passage(key=k, title=f"t{k}", text="", score=1.0 - 0.01 * i) for i, k in enumerate(keys)]


def test_fuse_ranks_by_reciprocal_rank():
    a, b = passages(1, 2, 3, 4), passages(5, 3, 1, 6)
    # 1: 1/61 + 1/63, 3: 1/63 + 1/62, 5: 1/61, 2: 1/62, 4: 1/64, 6: 1/64
    assert [p.key for p in fuse([a, b], 6)] == [1, 3, 5, 2, 4, 6]
    assert [p.key for p in fuse([a, b], 2)] == [1, 3]
    assert fuse([a], 3) == a[:3]  # one ranking keeps its order
    assert fuse([a, b], 3, c=0)[0].key == 1  # c=0: 1 + 1/3 beats 1/2 + 1/3 (key 3)
    assert fuse([a, b], 6)[1] is a[2]  # a passage keeps its own fields and first-seen object
    # weights scale each ranking's terms: b alone decides when a weighs 0, and 1s change nothing
    assert [p.key for p in fuse([a, b], 3, weights=[0.0, 1.0])] == [p.key for p in b[:3]]
    assert fuse([a, b], 6, weights=[1.0, 1.0]) == fuse([a, b], 6)


def test_clean_rewrite_strips_labels_and_falls_back():
    assert clean_rewrite(' Rewritten question: "Is throat cancer treatable?"\nmore', "q") == "Is throat cancer treatable?"
    assert clean_rewrite("  \n", "is it treatable?") == "is it treatable?"


def test_bad_method_is_named():
    with pytest.raises(ValueError, match="rewrite method 'llm' unknown"):
        search_queries("is it treatable?", [Turn("what is throat cancer?", "")], "llm")


def test_model_rewrite_is_one_short_line(backbone):
    row = CAST[1]  # "Is it treatable?" after "What is throat cancer?"
    out = model_rewrite(backbone, row["question"], [Turn(q, "") for q in row["history"]])
    assert out and "\n" not in out and len(backbone.tokenizer.encode(out)) <= 32
