"""Building an index: contents, idempotence, argument mismatch, and resuming after kill -9."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from targ_mlx.index import IndexMismatchError, build_index, open_retriever
from targ_mlx.index.build import iter_chunks
from targ_mlx.index.chunking import ChunkParams
from targ_mlx.index.store import PASSAGES, partial_dir

REPO = Path(__file__).resolve().parents[1]


def _keys(index_dir: Path) -> list[int]:
    with closing(sqlite3.connect(index_dir / PASSAGES)) as db:
        return [k for (k,) in db.execute("SELECT key FROM passages ORDER BY key")]


def test_small_index_holds_every_chunk_once(small_index_dir, small_index_corpus):
    expected = sorted({c.key for c in iter_chunks([str(small_index_corpus)], ChunkParams())})
    assert _keys(small_index_dir) == expected
    r = open_retriever(small_index_dir)
    assert len(r) == len(expected)
    m = r.manifest
    enc = {k: v for k, v in m["encoder"].items() if k not in ("onnx_sha256", "runtime")}
    assert enc == {"name": "sentence-transformers/all-MiniLM-L6-v2", "dims": 384,
                   "query_prefix": "", "passage_prefix": "", "backend": m["build"]["backend"]}
    assert m["dtype"] == "f16" and m["metric"] == "ip"
    assert m["chunking"] == {"size": 1000, "overlap": 100, "min_size": 200}
    assert m["counts"]["articles"] == 150 and m["corpora"][0]["source"] == "small_pool.jsonl"
    assert set(m["files"]) == {"vectors.usearch", "passages.db"}
    assert sorted(os.listdir(small_index_dir)) == ["bm25", "manifest.json", "passages.db", "vectors.usearch"]
    assert not partial_dir(small_index_dir).exists()


def test_rebuild_same_args_is_a_no_op_and_other_args_are_refused(small_index_dir, small_index_corpus):
    before = (small_index_dir / "manifest.json").read_text()
    t0 = time.perf_counter()
    assert build_index([str(small_index_corpus)], small_index_dir) == small_index_dir
    assert time.perf_counter() - t0 < 5
    assert (small_index_dir / "manifest.json").read_text() == before
    with pytest.raises(IndexMismatchError, match="another --out"):
        build_index([str(small_index_corpus)], small_index_dir, dtype="i8")


def _build_cmd(corpus: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "targ_mlx.index", "build", "--corpus", str(corpus), "--out", str(out),
            "--commit-every", "8", "--quiet"]


def _committed(part: Path) -> int:
    try:
        # closed at once: a reader left open would block the build's final journal switch
        with closing(sqlite3.connect(f"file:{part / PASSAGES}?mode=ro", uri=True, timeout=0.1)) as db:
            return db.execute("SELECT consumed FROM state").fetchone()[0]
    except sqlite3.Error:
        return 0


def _kill_after(cmd: list[str], part: Path, at_least: int, timeout: float = 600) -> int:
    """Start a build, kill -9 it once `at_least` chunks are committed; return that count."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    try:
        while (done := _committed(part)) < at_least:
            assert proc.poll() is None, f"build ended before the kill: {proc.stderr.read().decode()[-500:]}"
            assert time.monotonic() < deadline, "build made no progress"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return done


def test_kill_9_then_resume_gives_exactly_the_unique_chunks(tmp_path, small_index_corpus):
    # the corpus twice: duplicate articles must still give each chunk key once
    corpus = tmp_path / "twice.jsonl"
    lines = small_index_corpus.read_text().splitlines(keepends=True)[:36]
    corpus.write_text("".join(lines + lines[:6]))
    out = tmp_path / "idx"
    part = partial_dir(out)
    cmd = _build_cmd(corpus, out)

    first = _kill_after(cmd, part, 8)
    assert not out.exists(), "a half-built index must never appear"
    assert part.exists()
    with pytest.raises(Exception, match="unfinished"):
        open_retriever(out)
    second = _kill_after(cmd, part, first + 8)
    assert second > first, "the second run resumed instead of starting over"
    assert not out.exists()

    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-800:]
    assert not part.exists()
    expected = [c.key for c in iter_chunks([str(corpus)], ChunkParams())]
    assert len(expected) > len(set(expected))  # the duplicate lines really produce duplicate keys
    assert _keys(out) == sorted(set(expected))
    r = open_retriever(out)
    assert len(r) == len(set(expected))
    assert r.manifest["counts"]["chunks_read"] == len(expected)


def test_reuse_takes_vectors_of_identical_chunks(tmp_path, small_index_dir, small_index_corpus):
    from targ_mlx.index import load_encoder
    from targ_mlx.index.reuse import VectorSource

    subset = tmp_path / "small_pool.jsonl"  # same file name: same corpus label, same chunk keys
    subset.write_text("".join(small_index_corpus.read_text().splitlines(keepends=True)[:30]))
    chunks = list(iter_chunks([str(subset)], ChunkParams()))
    enc = load_encoder()
    source = VectorSource([small_index_dir], enc.name, enc.dims, enc.backend)
    found = source.lookup(chunks)
    assert set(found) == {c.key for c in chunks}
    fresh = enc.encode_passages([c.title for c in chunks[:5]], [c.text for c in chunks[:5]])
    for c, v in zip(chunks[:5], fresh):
        assert float(found[c.key] @ v) > 0.999  # f16-rounded copies of the same vectors

    out = build_index([str(subset)], tmp_path / "reused", reuse=[small_index_dir])
    assert _keys(out) == sorted(c.key for c in chunks)
    assert open_retriever(out).manifest["timing"]["encode_s"] < 1.0  # nothing was encoded


def test_a_bm25_only_sibling_lends_no_vectors_and_does_not_stop_a_build(tmp_path, small_index_corpus):
    """The default index's build looks for vectors in its sibling folders; a BM25-only index built
    beside it (the large corpus, --no-dense) has none and once made that build fail
    ("no such table: pending")."""
    subset = tmp_path / "small_pool.jsonl"
    subset.write_text("".join(small_index_corpus.read_text().splitlines(keepends=True)[:10]))
    bm25_only = build_index([str(subset)], tmp_path / "bm25-only", dense=False)
    out = build_index([str(subset)], tmp_path / "dense", reuse=[bm25_only])
    assert len(open_retriever(out)) == len(_keys(out)) > 0


def test_expansion_search_is_a_serving_setting(tmp_path, small_index_dir, small_index_corpus):
    import shutil

    copy = shutil.copytree(small_index_dir, tmp_path / "copy")
    t0 = time.perf_counter()
    build_index([str(small_index_corpus)], copy, expansion_search=32)  # no rebuild: manifest only
    assert time.perf_counter() - t0 < 5
    assert open_retriever(copy).index.expansion_search == 32
    assert open_retriever(copy, expansion_search=300).index.expansion_search == 300
    r = open_retriever(small_index_dir)
    assert r.index.expansion_search == r.manifest["hnsw"]["expansion_search"]


def test_same_corpus_gives_a_byte_identical_graph(tmp_path, small_index_corpus):
    # small graphs are built on one thread: usearch's parallel insert sometimes strands a node
    corpus = tmp_path / "part.jsonl"
    corpus.write_text("".join(small_index_corpus.read_text().splitlines(keepends=True)[:30]))
    a, b = build_index([str(corpus)], tmp_path / "a"), build_index([str(corpus)], tmp_path / "b")
    assert (a / "vectors.usearch").read_bytes() == (b / "vectors.usearch").read_bytes()
