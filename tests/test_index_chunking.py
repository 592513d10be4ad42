"""Chunker: the paper's 1000/100/200 scheme on real text, plus properties over arbitrary text."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from targ_mlx.index.chunking import ChunkParams, chunk_article, chunk_key, split_text

P = ChunkParams()


def _long_article(wiki_pool) -> str:
    with open(wiki_pool, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if len(row["text"]) > 20_000:
                return row["text"]
    raise AssertionError("no long article in the pool")


def test_real_article_chunks_respect_size_overlap_and_boundaries():
    from conftest import WIKI_POOL

    text = _long_article(WIKI_POOL)
    spans = split_text(text, P)
    assert len(spans) > 15
    for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
        assert P.min_size <= e0 - s0 <= P.size
        assert s1 < e0, "consecutive chunks overlap"
        assert e0 - s1 <= P.overlap + 40  # the overlap, moved forward to a word start
        assert text[s1 - 1].isspace(), "chunks start at a word"
        assert text[e0 - 1].isspace() or text[e0 - 1] in ".!?\"')]", "chunks end at a word or sentence"
    assert spans[0][0] == 0 and spans[-1][1] == len(text.rstrip())


def test_short_text_is_skipped_and_tail_merged():
    assert split_text("x" * 199, P) == []
    assert split_text("word " * 40, P) == []  # 199 characters once stripped
    assert split_text("word " * 41, P) == [(0, 204)]
    text = ("A sentence here. " * 70)[:1150]
    spans = split_text(text, P)
    assert len(spans) == 1 or spans[-1][1] - spans[-1][0] >= P.min_size


def test_chunks_carry_title_and_stable_keys():
    text = "Ada Lovelace wrote the first program. " * 60
    a = list(chunk_article("pool", "42", "Ada Lovelace", text))
    b = list(chunk_article("pool", "42", "Ada Lovelace", text))
    assert a == b and len(a) >= 2
    assert all(c.title == "Ada Lovelace" for c in a)
    assert len({c.key for c in a}) == len(a)
    assert a[0].key == chunk_key("pool", "42", 0) and 0 <= a[0].key < 2**63
    assert chunk_key("pool", "43", 0) != a[0].key


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab .\n!?é"), min_size=0, max_size=5000))
def test_spans_cover_text_in_order_within_bounds(text):
    spans = split_text(text, P)
    end = len(text.rstrip())
    if end < P.min_size:
        assert spans == []
        return
    assert spans[0][0] == 0 and spans[-1][1] == end
    for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
        assert s0 < s1 < e0 <= e1, "ordered, overlapping, no gap"
    for s, e in spans:
        assert e - s <= P.size + P.min_size
    for s, e in spans[:-1]:
        assert P.min_size <= e - s <= P.size
