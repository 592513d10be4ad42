"""WikiExtractor readers on real slices of the two Wikipedia files, the BM25 part of an index
(build, resume, search, damage), and hybrid search fusing it with the dense ranking."""

import bz2
import itertools
import json
import lzma
import shutil
import subprocess
import sys

import pytest

from conftest import SHARED_DATA
from targ_mlx.index import build_index, open_indexes, open_retriever
from targ_mlx.index.corpus import read_corpus
from targ_mlx.index.errors import CorpusError, IndexCorruptError, IndexMismatchError, IndexMissingError
from targ_mlx.index.hybrid import HybridRetriever
from targ_mlx.index.lexical import add_lexical, build_lexical, has_lexical, lexical_dir, open_lexical
from targ_mlx.index.store import rebuild_command
from targ_mlx.retrieval import Passage, fuse, search_fused

SIMPLEWIKI = SHARED_DATA / "corpus" / "simplewiki_2021.jsonl.xz"
ENWIKI = SHARED_DATA / "corpus" / "enwiki_2025_early.jsonl.xz"


def _head(path, n: int) -> list[dict]:
    """The first n articles of a big .xz file, read as a stream (never the whole file)."""
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in itertools.islice(f, n)]


def _doc(row: dict) -> str:
    """An article as WikiExtractor's plain (non --json) output writes it."""
    return (f'<doc id="{row["id"]}" url="{row["url"]}" title="{row["title"]}">\n{row["title"]}\n\n'
            f'{row["text"]}\n</doc>\n')


@pytest.fixture(scope="module")
def simple_rows():
    return _head(SIMPLEWIKI, 6)


def test_the_two_real_wikipedia_files_stream_from_xz():
    for path, first in ((SIMPLEWIKI, "April"), (ENWIKI, "Anarchism")):
        arts = list(itertools.islice(read_corpus(str(path)), 3))
        assert arts[0].title == first and len(arts[0].text) > 1000
        assert arts[0].source == path.name[: -len(".xz")]  # the label, and so the chunk keys, ignore compression
        assert "\n" not in arts[0].text


def test_wikiextractor_doc_text_json_parts_and_compression_read_the_same_articles(tmp_path, simple_rows):
    tree = tmp_path / "extracted"
    (tree / "AA").mkdir(parents=True)
    (tree / "AB").mkdir()
    (tree / "AA" / "wiki_00").write_text("".join(_doc(r) for r in simple_rows[:2]), encoding="utf-8")
    (tree / "AA" / "wiki_01").write_text("".join(json.dumps(r) + "\n" for r in simple_rows[2:4]), encoding="utf-8")
    with bz2.open(tree / "AB" / "wiki_00.bz2", "wt", encoding="utf-8") as f:
        f.write("".join(_doc(r) for r in simple_rows[4:]))
    got = list(read_corpus(str(tree)))
    assert [a.title for a in got] == [r["title"] for r in simple_rows]
    assert [a.id for a in got] == [str(r["id"]) for r in simple_rows]
    assert {a.source for a in got} == {"extracted"}
    one = list(read_corpus(str(tree / "AA" / "wiki_00")))  # one part file alone
    assert [a.title for a in one] == [r["title"] for r in simple_rows[:2]]
    # the <doc> body drops the repeated title line but keeps every paragraph
    assert one[0].text.startswith(simple_rows[0]["text"].split("\n")[0][:40])
    assert one[0].text == got[0].text


def test_a_truncated_xz_corpus_is_one_line_naming_the_fix(tmp_path):
    data = SIMPLEWIKI.read_bytes()[:200_000]  # a download cut short
    bad = tmp_path / "cut.jsonl.xz"
    bad.write_bytes(data)
    with pytest.raises(CorpusError, match=r"cut\.jsonl\.xz: unreadable .*fix: re-download") as e:
        list(read_corpus(str(bad)))
    assert "\n" not in str(e.value)


def test_online_shorthands_name_the_hugging_face_configs():
    from targ_mlx.index.corpus import ONLINE_ALIASES

    assert ONLINE_ALIASES == {"simplewiki": "hf:wikimedia/wikipedia:20231101.simple",
                              "enwiki": "hf:wikimedia/wikipedia:20231101.en"}


def _rows(n: int):
    rows = _head(SIMPLEWIKI, n)
    return [(1000 + 7 * i, r["title"], r["text"][:1500]) for i, r in enumerate(rows)]


def test_bm25_finds_the_article_a_query_names(tmp_path):
    rows = _rows(60)
    meta = build_lexical(lambda after: rows, tmp_path / "idx" / "bm25")
    assert meta["passages"] == 60 and meta["kind"] == "tantivy"
    lex = open_lexical(tmp_path / "idx")
    found = lex.search([f"{rows[17][1]}", "qqqzzz unknownword", "the of and"], 5)
    assert found[0][0][0] == rows[17][0] and found[0][0][1] > 0
    assert found[1] == [] and found[2] == []  # no known term: nothing, not five arbitrary passages
    assert len(lex) == 60
    # the score of a given passage is the one its ranking gave; 0 for one the query misses
    top = found[0][:3]
    assert lex.score_keys(rows[17][1], [k for k, _ in top] + [123]) == pytest.approx([s for _, s in top] + [0.0])


def test_bm25_rows_must_come_in_key_order(tmp_path):
    rows = _rows(3)
    with pytest.raises(ValueError, match="ascending key order"):
        build_lexical(lambda after: rows[::-1], tmp_path / "bm25")


def test_hybrid_fusion_ranks_by_reciprocal_rank():
    def p(key):
        return Passage(key, f"t{key}", "", 0.0)

    dense = [p(1), p(2), p(3)]
    lexical = [p(3), p(4), p(1)]
    # 1: 1/61 + 1/63; 3: 1/63 + 1/61 (tie: 1 seen first); 2: 1/62; 4: 1/62 (2 seen first)
    assert [x.key for x in fuse([dense, lexical], 4)] == [1, 3, 2, 4]


def test_a_big_index_with_both_parts_is_searched_hybrid_by_default(small_index_dir, monkeypatch):
    from targ_mlx.index import merged

    size = len(open_indexes([small_index_dir], retriever="dense"))
    monkeypatch.setattr(merged, "HYBRID_FROM", size + 1)  # one passage short of "big": dense
    assert merged.retriever_mode([small_index_dir], None) == "dense"
    assert not isinstance(open_indexes([small_index_dir]), HybridRetriever)
    monkeypatch.setattr(merged, "HYBRID_FROM", size)
    assert merged.retriever_mode([small_index_dir], None) == "hybrid"
    found = open_indexes([small_index_dir])
    assert isinstance(found, HybridRetriever) and found.mode == "hybrid"
    assert merged.retriever_mode([small_index_dir], "dense") == "dense"  # asked for: kept


def test_hybrid_search_carries_both_raw_scores_for_every_passage(small_index_dir, small_index_questions):
    assert has_lexical(small_index_dir)
    assert not isinstance(open_indexes([small_index_dir]), HybridRetriever)  # dense stays the default
    hybrid = open_indexes([small_index_dir], retriever="hybrid")
    assert isinstance(hybrid, HybridRetriever) and hybrid.mode == "hybrid" and len(hybrid.parts) == 1
    dense = open_indexes([small_index_dir], retriever="dense")
    bm25 = open_indexes([small_index_dir], retriever="bm25")
    lex = open_lexical(small_index_dir)
    enc = dense.encoder
    for q in small_index_questions[:8]:
        text = q["question"]
        h, d, b = hybrid.search(text, 5), dense.search(text, 20), bm25.search(text, 5)
        assert len(h) == 5 and all(x.bm25 is not None for x in h + b)
        cos = {x.key: x.score for x in d}
        qv = enc.encode_queries([text])[0]
        for x in h + b:
            # the cosine of a passage BM25 alone found is read back from its stored (f16) vector
            want = cos.get(x.key, float(dense.vectors([x.key])[0] @ qv))
            assert x.score == pytest.approx(want, abs=2e-3)
            assert x.bm25 == pytest.approx(lex.score_keys(text, [x.key])[0], rel=1e-6)
        assert [x.bm25 for x in b] == sorted((x.bm25 for x in b), reverse=True)
        # hybrid's order is the fusion of the two rankings, each 20 deep
        lex_rank = [x.key for x in bm25.search(text, 20)]
        assert [x.key for x in h] == [x.key for x in fuse([d, [Passage(k, "", "", 0) for k in lex_rank]], 5)]


def test_every_mode_finds_most_gold_passages_and_hybrid_is_within_one_of_the_best(small_index_dir, small_index_questions):
    """50 real NQ-Open questions whose gold passage is in the index, among 100 real distractors."""
    hits = {}
    for mode in ("dense", "bm25", "hybrid"):
        r = open_indexes([small_index_dir], retriever=mode)
        found = r.search_batch([q["question"] for q in small_index_questions], 5)
        hits[mode] = sum(q["gold_title"] in {p.title for p in f} for q, f in zip(small_index_questions, found))
    assert hits["hybrid"] >= max(hits["dense"], hits["bm25"]) - 1, hits
    assert min(hits.values()) >= 35, hits


def _copy(index, dst):
    shutil.copytree(index, dst)
    return dst


def test_a_missing_or_truncated_bm25_segment_is_one_line_naming_the_fix(small_index_dir, tmp_path):
    idx = _copy(small_index_dir, tmp_path / "idx")
    segment = max(lexical_dir(idx).glob("*.idx"), key=lambda f: f.stat().st_size)  # a segment's postings
    segment.write_bytes(segment.read_bytes()[:-8])
    with pytest.raises(IndexCorruptError, match=r"\.idx is \d+ bytes .*truncated.*fix: python -m targ_mlx.index lexical") as e:
        open_indexes([idx], retriever="hybrid")
    assert "\n" not in str(e.value)
    segment.unlink()
    with pytest.raises(IndexMissingError, match=r"\.idx is missing; fix: python -m targ_mlx.index lexical"):
        open_indexes([idx], retriever="bm25")
    add_lexical(idx)  # the fix it names
    assert open_indexes([idx], retriever="hybrid").search("who", 1)


def test_an_index_without_bm25_stays_dense_and_gains_it_in_place(small_index_corpus, small_index_dir, tmp_path):
    idx = _copy(small_index_dir, tmp_path / "idx")
    shutil.rmtree(lexical_dir(idx))  # as every index built before BM25 parts existed
    assert not isinstance(open_indexes([idx]), HybridRetriever)
    with pytest.raises(IndexMissingError, match="no BM25 part for --retriever hybrid; fix: python -m targ_mlx.index lexical"):
        open_indexes([idx], retriever="hybrid")
    before = open_retriever(idx).manifest_id
    (lexical_dir(idx).with_name("bm25.tmp")).mkdir()  # a BM25 stage killed half-way left this
    build_index([str(small_index_corpus)], idx)  # the same build again: adds BM25, the dense part unchanged
    assert has_lexical(idx) and not lexical_dir(idx).with_name("bm25.tmp").exists()
    assert open_retriever(idx).manifest_id == before
    assert isinstance(open_indexes([idx], retriever="hybrid"), HybridRetriever)


def test_index_cli_searches_in_each_mode_and_rebuilds_bm25(small_index_dir, small_index_questions, tmp_path):
    idx = _copy(small_index_dir, tmp_path / "idx")
    q = small_index_questions[0]["question"]
    run = lambda *a: subprocess.run([sys.executable, "-m", "targ_mlx.index", *a], capture_output=True, text=True)  # noqa: E731
    out = run("search", str(idx), q, "--retriever", "bm25", "-k", "3", "--json")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == 3 and all(r["bm25"] > 0 for r in rows)
    shutil.rmtree(lexical_dir(idx))
    out = run("search", str(idx), q, "--retriever", "hybrid")
    assert out.returncode != 0
    assert out.stderr.strip().count("\n") == 0 and "fix: python -m targ_mlx.index lexical" in out.stderr
    out = run("lexical", str(idx))
    n = open_retriever(idx).manifest["counts"]["passages"]
    assert out.returncode == 0 and f"BM25 over {n} passages" in out.stdout and not out.stderr, out.stderr
    assert f"bm25         {n} passages" in run("info", str(idx)).stdout


def test_a_bm25_only_index_stores_no_vectors_and_scores_what_it_returns(small_index_corpus, small_index_dir,
                                                                        small_index_questions, tmp_path):
    idx = build_index([str(small_index_corpus)], tmp_path / "lex", dense=False)
    assert not (idx / "vectors.usearch").exists() and has_lexical(idx)
    assert "--no-dense" in rebuild_command(open_retriever(idx).manifest["build"], idx)
    lexical_only = open_indexes([idx], retriever="bm25")
    assert isinstance(lexical_only, HybridRetriever) and lexical_only.mode == "bm25"
    full = open_indexes([small_index_dir], retriever="bm25")
    for q in small_index_questions[:5]:
        a, b = lexical_only.search(q["question"], 5), full.search(q["question"], 5)
        assert [p.key for p in a] == [p.key for p in b]  # the same passages, the same BM25
        # the cosine of each, encoded at search time, is the stored vector's (f16) cosine
        assert [p.score for p in a] == pytest.approx([p.score for p in b], abs=2e-3)
    with pytest.raises(IndexMismatchError, match=r"BM25-only index .*fix: --retriever bm25"):
        open_indexes([idx], retriever="dense")


def test_a_bm25_only_index_is_searched_hybrid_by_default_fusing_bm25s_top_20_with_their_cosine_order(
        small_index_corpus, small_index_questions, tmp_path):
    idx = build_index([str(small_index_corpus)], tmp_path / "lex", dense=False)
    bm25, default = open_indexes([idx], retriever="bm25"), open_indexes([idx])
    assert default.mode == "hybrid"
    moved = 0
    for q in small_index_questions[:8]:
        top = bm25.search(q["question"], 20)  # BM25's order, each with its cosine (encoded now)
        by_cosine = sorted(top, key=lambda p: -p.score)
        want = fuse([by_cosine, top], 5)
        got = default.search(q["question"], 5)
        assert [p.key for p in got] == [p.key for p in want]
        assert [p.score for p in got] == pytest.approx([p.score for p in want], abs=1e-5)
        assert all(p.bm25 > 0 and p.text for p in got)
        moved += [p.key for p in got] != [p.key for p in top[:5]]
    assert moved  # the cosine order changed some top 5: this is not BM25 under another name


def test_a_fused_search_in_the_index_returns_what_fusing_its_full_rankings_returns(small_index_corpus, small_index_dir,
                                                                                 small_index_questions, tmp_path):
    """HybridRetriever.search_fused (a chat question's forms fused before any passage is completed)
    gives the passages, cosines and BM25 scores that fusing each form's full top 20 gives."""
    lex = build_index([str(small_index_corpus)], tmp_path / "lex", dense=False)
    retrievers = [open_indexes([lex], retriever="bm25"), open_indexes([lex], retriever="hybrid"),
                  open_indexes([small_index_dir], retriever="bm25"), open_indexes([small_index_dir], retriever="hybrid")]
    qs = [q["question"] for q in small_index_questions[:12]]
    chats = [(qs[i], f"{qs[i]} {qs[i + 1]}", qs[i + 1]) for i in range(0, 12, 3)]  # a follow-up's forms
    for r in retrievers:
        assert isinstance(r, HybridRetriever)
        for forms in chats:
            for weights in (None, [0.25, 1.0, 0.5]):
                want = fuse(r.search_batch(list(forms), 20), 5, weights=weights)
                got = search_fused(r, list(forms), 5, weights)
                assert [p.key for p in got] == [p.key for p in want], r.mode
                assert [p.score for p in got] == pytest.approx([p.score for p in want], abs=1e-6)
                assert [p.bm25 for p in got] == pytest.approx([p.bm25 for p in want], abs=1e-6)
                assert all(p.text for p in got)


def test_a_bm25_only_index_encodes_a_passage_once_and_keeps_what_a_new_encode_gives(small_index_corpus,
                                                                                  small_index_questions, tmp_path):
    """A BM25-only index encodes the passages a search returns (hybrid: BM25's top 20) for their
    cosine; a chat's follow-ups find many of the same, so their vectors are kept. A question asked
    again encodes nothing, gets the cosines a search that keeps none gets, and the kept ones stay
    within their bound, the most recent kept."""
    idx = build_index([str(small_index_corpus)], tmp_path / "lex", dense=False)
    r, fresh = open_indexes([idx], retriever="hybrid"), open_indexes([idx], retriever="hybrid")
    part, cold = r.parts[0][0], fresh.parts[0][0]
    cold.kept_vectors = 0
    qs = [q["question"] for q in small_index_questions[:5]]
    first = r.search(qs[0], 5)
    kept = dict(part._kept)
    assert len(kept) == 20 and {p.key for p in first} <= set(kept)
    again = r.search(qs[0], 5)
    assert all(part._kept[k] is v for k, v in kept.items())  # served, not encoded and stored again
    want = fresh.search(qs[0], 5)
    assert [p.key for p in again] == [p.key for p in first] == [p.key for p in want]
    assert [p.score for p in again] == pytest.approx([p.score for p in want], abs=1e-6)
    assert not cold._kept
    part.kept_vectors = 7
    for q in qs[1:]:
        r.search(q, 5)
    last_20 = {p.key for p in open_indexes([idx], retriever="bm25").search(qs[-1], 20)}
    assert len(part._kept) == 7 and set(part._kept) <= last_20  # the last search's, the older ones gone
