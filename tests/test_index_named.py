"""`index.named`: what `/index get NAME` builds, where, and the one line it gives offline."""

import json
from pathlib import Path

import pytest

from targ_mlx.index import named
from targ_mlx.index.errors import CorpusError

WIKI_POOL = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus" / "wiki_pool.jsonl"


def first_articles(path: Path, lines: int = 60, shorter_than: int = 6000) -> Path:
    """The short articles among the pool's first `lines` lines (real KILT pages), as a JSONL."""
    rows = []
    with open(WIKI_POOL, encoding="utf-8") as f:
        for _, line in zip(range(lines), f):
            row = json.loads(line)
            if len(row["text"]) < shorter_than:
                rows.append({"id": row["id"], "title": row["title"], "text": row["text"]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_local_corpus_goes_to_the_user_indexes_folder_under_its_name(tmp_path, monkeypatch):
    corpus = first_articles(tmp_path / "kilt pages.jsonl")
    monkeypatch.setenv(named.ENV_INDEXES, str(tmp_path / "indexes"))
    t = named.target(str(corpus))
    assert (t.corpus, t.out, t.online) == (str(corpus), tmp_path / "indexes" / "kilt-pages", False)
    assert named._folder_name("hf:wikimedia/wikipedia:20231101.simple") == "wikipedia-20231101.simple"
    assert named._folder_name("~/dumps/enwiki-latest-pages-articles.xml.bz2") == "enwiki-latest-pages-articles"


def test_a_missing_path_is_one_line_naming_it_and_the_fix(tmp_path):
    with pytest.raises(CorpusError) as e:
        named.target(str(tmp_path / "nope.jsonl"))
    line = str(e.value)
    assert "\n" not in line and "nope.jsonl: no such file or folder" in line and "/index get simplewiki" in line


def test_simplewiki_offline_is_one_line_never_a_traceback(tmp_path, monkeypatch):
    """With no network (the Hub forced offline here) the failed download is one line naming the fix."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(CorpusError) as e:
        named.get_index(named.target("simplewiki", tmp_path))
    line = str(e.value)
    assert "\n" not in line
    assert line.startswith("/index get simplewiki downloads Simple English Wikipedia: it needs a network (its "
                           "parquet files stream from the Hugging Face Hub); or give a local file: /index get PATH")


def test_get_index_builds_bm25_only_and_resumes_a_stopped_build(tmp_path):
    corpus = first_articles(tmp_path / "pool_head.jsonl")
    t = named.target(str(corpus), tmp_path / "indexes")

    def stop_after_first_commit(done, total):
        if done:
            raise named.BuildStopped

    with pytest.raises(named.BuildStopped):
        named.get_index(t, stop_after_first_commit, commit_every=4)
    assert not t.out.exists() and (t.out.parent / "pool_head.partial").is_dir()
    seen = []
    assert named.get_index(t, lambda done, total: seen.append((done, total))) == t.out
    assert seen[0][0] == 4 and seen[-1][0] == seen[-1][1] > 4  # went on from the first commit to the end
    manifest = json.loads((t.out / "manifest.json").read_text())
    assert manifest["build"]["dense"] is False and manifest["counts"]["passages"] == seen[-1][1]


def test_an_online_name_says_what_its_build_will_take_before_it_starts():
    line = named.cost_line("enwiki")
    assert line.startswith("about 20.0M chunks: ~26 GB of disk and ~3 h on 2 cores") and "resumes" in line
    assert named.cost_line("simplewiki").startswith("about 0.3M chunks: ~0.4 GB of disk and ~2 min on 2 cores")
    assert named.cost_line("/data/my_notes.jsonl") == ""  # a local corpus' size is not known before it is read
