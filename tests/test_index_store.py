"""Serving an index: search quality on real data, the mmap view, and one-line errors for a
missing, truncated, corrupted or mismatched index. Also the CLI (`python -m targ_mlx.index`)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from targ_mlx.index import (
    IndexCorruptError,
    IndexError_,
    IndexMismatchError,
    IndexMissingError,
    IndexRetriever,
    open_retriever,
)
from targ_mlx.index.__main__ import main
from targ_mlx.retrieval import Passage, Retriever


@pytest.fixture
def index_copy(small_index_dir, tmp_path):
    """A private copy of the small index to damage."""
    return shutil.copytree(small_index_dir, tmp_path / "copy")


def _norm(text: str) -> str:
    return " ".join(text.split())


def test_retriever_finds_gold_passages(small_index_dir, small_index_questions):
    r = open_retriever(small_index_dir)
    assert isinstance(r, Retriever) and isinstance(r, IndexRetriever)
    questions = [q["question"] for q in small_index_questions]
    results = r.search_batch(questions, k=5)
    hits = sum(any(_norm(p.text) in _norm(q["gold_text"]) for p in ps)
               for q, ps in zip(small_index_questions, results))
    assert hits / len(questions) >= 0.8, hits
    top = results[0]
    assert len(top) == 5 and all(isinstance(p, Passage) for p in top)
    assert [p.score for p in top] == sorted((p.score for p in top), reverse=True)
    assert -1.01 <= top[-1].score <= top[0].score <= 1.01
    one = r.search(questions[0], k=5)
    # the same passages; a query encoded alone and in a batch differs in the last float bits
    assert [p.key for p in one] == [p.key for p in top]
    assert [p.score for p in one] == pytest.approx([p.score for p in top], abs=1e-5)
    assert r.index.dtype.name.lower().startswith("f16")


def test_hnsw_matches_exact_search(small_index_dir, small_index_questions):
    r = open_retriever(small_index_dir)
    q = r.encoder.encode_queries([x["question"] for x in small_index_questions])
    approx = r.search_vectors(q, k=5)
    exact = r.search_vectors(q, k=5, exact=True)
    recall = np.mean([len({p.key for p in a} & {p.key for p in e}) / 5 for a, e in zip(approx, exact)])
    assert recall >= 0.99


def test_manifest_id_is_short_and_stable(small_index_dir):
    a, b = open_retriever(small_index_dir), open_retriever(small_index_dir)
    assert a.manifest_id == b.manifest_id and len(a.manifest_id) == 12


def _one_line(e: Exception) -> str:
    msg = str(e)
    assert "\n" not in msg and "fix" in msg
    return msg


def test_missing_index_names_the_build_command(tmp_path):
    with pytest.raises(IndexMissingError) as e:
        open_retriever(tmp_path / "nowhere")
    assert "python -m targ_mlx.index build" in _one_line(e.value)


def test_missing_file(index_copy):
    (index_copy / "passages.db").unlink()
    with pytest.raises(IndexMissingError, match="passages.db is missing") as e:
        open_retriever(index_copy)
    assert "rebuild" in _one_line(e.value)


def test_truncated_vectors(index_copy):
    path = index_copy / "vectors.usearch"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(IndexCorruptError, match="truncated") as e:
        open_retriever(index_copy)
    _one_line(e.value)


def test_checksum_mismatch(index_copy):
    path = index_copy / "vectors.usearch"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    path.write_bytes(bytes(data))
    with pytest.raises(IndexCorruptError, match="checksum") as e:
        open_retriever(index_copy, verify=True)
    _one_line(e.value)


def test_garbled_manifest(index_copy):
    (index_copy / "manifest.json").write_text("{not json")
    with pytest.raises(IndexCorruptError) as e:
        open_retriever(index_copy)
    _one_line(e.value)


def test_query_encoder_mismatch(small_index_dir):
    with pytest.raises(IndexMismatchError, match="intfloat/e5-base-v2") as e:
        open_retriever(small_index_dir, encoder="intfloat/e5-base-v2")
    assert "--encoder sentence-transformers/all-MiniLM-L6-v2" in _one_line(e.value)
    assert isinstance(e.value, IndexError_)


def test_cli_help():
    for argv in (["--help"], ["build", "--help"], ["info", "--help"], ["search", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0


def test_cli_info_and_search(small_index_dir, small_index_questions, capsys):
    main(["info", str(small_index_dir), "--verify"])
    out = capsys.readouterr().out
    assert "manifest_id" in out and "all-MiniLM-L6-v2" in out
    q = small_index_questions[0]
    main(["search", str(small_index_dir), q["question"], "-k", "3", "--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 3 and {"key", "score", "title", "text"} <= set(rows[0])


def test_cli_error_is_one_line_and_nonzero(tmp_path, capsys):
    assert main(["info", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no index at") and "\n" not in err


def test_import_does_not_load_mlx_torch_or_textual():
    code = ("import sys, targ_mlx.index, targ_mlx.index.__main__; "
            "bad = [m for m in ('mlx.core', 'torch', 'textual', 'usearch') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_default_index_dir(monkeypatch, tmp_path):
    from targ_mlx.index import default_index_dir

    monkeypatch.delenv("TARG_MLX_INDEX", raising=False)
    assert default_index_dir() == Path(__file__).resolve().parents[1] / "index" / "vital-articles-minilm"
    monkeypatch.setenv("TARG_MLX_INDEX", str(tmp_path / "mine"))
    assert default_index_dir() == tmp_path / "mine"


def test_progress_bar_shows_rate_and_eta():
    import io

    from targ_mlx.index.progress import ProgressBar

    out = io.StringIO()
    bar = ProgressBar(stream=out, every=0.0)
    bar(0, 100)
    bar(50, 100)
    bar(100, 100)
    text = out.getvalue()
    assert "50/100 chunks" in text and "passages/s" in text and "ETA" in text and text.endswith("\n")


def test_a_publish_between_the_vectors_and_the_passages_opens_the_new_index(index_copy, monkeypatch):
    """The race CI met: the vectors opened from the old folder, then `publish` moved it aside, and the
    passages' SQLite file was opened before the new folder took its place. The open must retry and return the new index whole, not
    raise sqlite3's 'unable to open database file'."""
    import sqlite3

    from targ_mlx.index import retriever as retriever_module
    from targ_mlx.index.store import partial_dir

    new = shutil.copytree(index_copy, partial_dir(index_copy))
    old = index_copy.with_name(index_copy.name + ".old")
    real_connect, swapped = sqlite3.connect, []

    def connect_between_the_renames(*args, **kwargs):  # the folder is gone for this one connect
        if swapped:
            return real_connect(*args, **kwargs)
        index_copy.rename(old)
        try:
            return real_connect(*args, **kwargs)
        finally:
            new.rename(index_copy)
            shutil.rmtree(old)
            swapped.append(True)

    monkeypatch.setattr(retriever_module.sqlite3, "connect", connect_between_the_renames)
    r = open_retriever(index_copy)
    assert swapped and r.search("who wrote hamlet", k=3)
    assert r.path == index_copy and not old.exists()


def test_a_publish_between_the_dense_and_the_bm25_opens_gives_both_parts_of_the_new_index(index_copy, monkeypatch):
    """Hybrid opens a folder's vectors and its BM25 part one after the other; an `add` publishing
    the folder between the two must not leave the vectors of one publish beside the BM25 keys of the
    other: both are opened again, from the new folder."""
    import json as json_module

    from targ_mlx.index import lexical, open_indexes
    from targ_mlx.index.store import manifest_id, partial_dir

    new = shutil.copytree(index_copy, partial_dir(index_copy))
    manifest = json_module.loads((new / "manifest.json").read_text())
    manifest["published"] = "the add's"  # the new publish's manifest differs, as an add's does
    (new / "manifest.json").write_text(json_module.dumps(manifest))
    old = index_copy.with_name(index_copy.name + ".old")
    swapped = []

    class PublishFirst:  # the writer's two renames land just before the BM25 part's metadata is read
        def __getattr__(self, name):
            if name == "loads" and not swapped:
                index_copy.rename(old)
                new.rename(index_copy)
                shutil.rmtree(old)
                swapped.append(True)
            return getattr(json_module, name)

    monkeypatch.setattr(lexical, "json", PublishFirst())
    r = open_indexes([index_copy], retriever="hybrid")
    assert swapped and r.parts[0][0].manifest_id == manifest_id(manifest)
    assert r.search("who wrote hamlet", k=3)
