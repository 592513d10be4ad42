"""A chat's questions are searched as asked and in context, on a small real index of Vital leads.

The index holds the articles a chat about the Mona Lisa and then the South Pole touches, the
painters a Mona-Lisa-flavoured query drifts to (Botticelli, Giotto, Raphael, Masaccio), and 120
other leads of the offline default corpus, encoded by the default encoder.
"""

import json

import pytest

from targ_mlx.conversation import Turn, dependence, fused_forms, names_the_answer, search_forms

NAMED = ["Mona Lisa", "Leonardo da Vinci", "South Pole", "History of Antarctica", "Robert Falcon Scott",
         "Roald Amundsen", "Sandro Botticelli", "The Birth of Venus", "Giotto", "Raphael", "Masaccio",
         "Michelangelo", "Louvre", "Antarctica", "Ernest Shackleton"]
OTHERS = 120
MONA_LISA = [("who painted the mona lisa", "Leonardo da Vinci painted the Mona Lisa.")]


@pytest.fixture(scope="module")
def chat_index(tmp_path_factory):
    from targ_mlx.index import build_index, open_retriever
    from targ_mlx.index.corpus import vital_articles_path

    leads = json.loads(vital_articles_path().read_text(encoding="utf-8"))
    titles = [t for t in NAMED if t in leads]
    titles += [t for t in list(leads)[::80] if t not in titles][:OTHERS]
    folder = tmp_path_factory.mktemp("chat-index")
    corpus = folder / "leads.jsonl"
    corpus.write_text("".join(json.dumps({"id": t, "title": t, "text": leads[t]["extract"]}) + "\n"
                              for t in titles), encoding="utf-8")
    return open_retriever(build_index([str(corpus)], folder / "index"))


def top_titles(answer, n=3):
    return [p.title for p in answer.found[:n]]


def test_a_new_topic_in_a_chat_is_searched_as_it_is_alone(assistant_factory, chat_index):
    a = assistant_factory(retriever=chat_index, gate="always", max_tokens=1)
    q = "who was the first person to reach the south pole"
    alone, in_chat = a.answer(q), a.answer(q, history=MONA_LISA)
    assert in_chat.history_turns == 1 and in_chat.search_query.startswith(q)
    shared = set(top_titles(alone)) & set(top_titles(in_chat))
    assert len(shared) >= 2, (top_titles(alone), top_titles(in_chat))
    assert top_titles(in_chat, 1) == top_titles(alone, 1) == ["South Pole"]


def test_a_follow_up_still_finds_who_it_is_about(assistant_factory, chat_index):
    a = assistant_factory(retriever=chat_index, gate="always", max_tokens=1)
    follow = a.answer("when was he born?", history=MONA_LISA)
    assert "Leonardo da Vinci" in top_titles(follow), top_titles(follow)


def test_a_pronoun_standing_for_the_name_answered_finds_that_person_first(assistant_factory, chat_index):
    """"he" after "who painted the mona lisa?" is the painter: the earlier question's own words (the
    Mona Lisa, painters beside it) must not outrank him."""
    a = assistant_factory(retriever=chat_index, gate="always", max_tokens=1)
    for answer in ("Leonardo da Vinci", "Leonardo da Vinci painted the Mona Lisa."):
        follow = a.answer("when was he born?", history=[("who painted the mona lisa", answer)])
        assert top_titles(follow, 1) == ["Leonardo da Vinci"], top_titles(follow)


def test_a_pronoun_stands_for_the_answer_only_after_who_and_a_name_from_a_source():
    painted = [Turn("who painted the mona lisa", "Leonardo da Vinci")]
    assert names_the_answer("when was he born?", painted)
    assert [f.query for f in fused_forms("when was he born?", painted)] == ["leonardo da vinci when was he born?"]
    # the person was named in the question and described in the answer: "she" is the question's subject
    assert not names_the_answer("what was she famous for?",
                                [Turn("who was anne bonny?", "Anne Bonny was an Irish pirate operating in the Caribbean.")])
    # a sentence naming a person (CAsT: the manual rewrite is "How did Jerry Garcia lose his finger?")
    assert names_the_answer("How did he lose his finger?", [Turn("Who was the leader?", "The Dead was led by Jerry Garcia.")])
    assert not names_the_answer("what was she famous for?", [Turn("who was anne bonny?", "An Irish pirate")])
    assert not names_the_answer("what is it about?", [Turn("who wrote hamlet", "William Shakespeare")])  # not a person
    assert not names_the_answer("when was he born?", [Turn("who painted the mona lisa", "Leonardo da Vinci", False)])
    assert not names_the_answer("when was he born?", [Turn("what is the mona lisa", "A portrait")])
    unsourced = fused_forms("when was he born?", [Turn("who painted the mona lisa", "Leonardo da Vinci", False)])
    assert len(unsourced) == 2  # an answer from memory alone is not searched with


def test_dependence_reads_pronouns_ellipsis_and_bare_fragments():
    assert dependence("when was he born?") == 1.0
    assert dependence("Is it treatable?") == 1.0
    assert dependence("What about the oldest?") == 1.0
    assert dependence("What are the main themes?") == 0.5  # names no topic of its own
    assert dependence("who was the first person to reach the south pole") == 0.0
    assert dependence("Who wrote the origin of species") == 0.0


def test_the_question_as_asked_is_searched_and_weighted_by_dependence():
    """Unless a pronoun stands for the name answered (above), the question as asked is one form."""
    history = [Turn(*MONA_LISA[0])]
    new, follow = search_forms("who was the first person to reach the south pole", history), \
        search_forms("where is it kept?", history)
    assert new[0].query == "who was the first person to reach the south pole"
    assert follow[0].query == "where is it kept?"
    # a new topic leads with itself; a follow-up leads with the forms built from the earlier turns
    assert new[0].weight > max(f.weight for f in new[1:])
    assert follow[0].weight < min(f.weight for f in follow[1:])
    assert len(new) == len(follow) == 3  # as asked, the questions form, the answer form
