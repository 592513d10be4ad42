"""The stages of an index build after its spec, shared by the single-process build (build.py),
`add` (update.py) and the Ray build (distributed.py): open the partial folder and its SQLite
file, encode and commit the chunk stream a group at a time, build the HNSW graph, publish.

Resumable: each encoded group is committed to DIR.partial/passages.db in one SQLite transaction
together with its vectors and the count of chunks consumed from the (deterministic) chunk stream,
so after a kill -9 the next run skips exactly what was committed. DIR.partial is renamed to DIR
only when complete: a half-built index is never served.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np

from targ_mlx import _sqlite_utils
from targ_mlx.index.chunking import ChunkParams
from targ_mlx.index.encoder import Encoder
from targ_mlx.index.errors import CorpusError, IndexMismatchError
from targ_mlx.index.lexical import build_lexical_from, lexical_dir
from targ_mlx.index.resume import discard_previous, reusable_partial, set_aside
from targ_mlx.index.reuse import VectorSource
from targ_mlx.index.spec import countable, same_build, spec_chunks
from targ_mlx.index.store import (
    BUILD_STATE,
    FORMAT_VERSION,
    MANIFEST,
    METRIC,
    PASSAGES,
    VECTORS,
    HnswParams,
    describe_files,
    partial_dir,
    save_graph,
    write_json_atomic,
)

sqlite_utils = _sqlite_utils.load()

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
DEFAULT_COMMIT_EVERY = 512  # chunks per encode call and per commit: sorting by length pads less
_ADD_PAGE = 50_000  # vectors read from SQLite per usearch add
_SINGLE_THREAD_ADD = 250_000  # up to this many vectors the graph is built on one thread (see build_hnsw)


def open_partial(out: Path, spec: dict) -> Path:
    part = partial_dir(out)
    state = part / BUILD_STATE
    if state.is_file() and reusable_partial(json.loads(state.read_text()), spec, same_build):
        set_aside(part)  # documents changed between attempts: start afresh, reusing its vectors
    if state.is_file():
        if not same_build(json.loads(state.read_text()), spec):
            raise IndexMismatchError(
                f"{part} holds an unfinished build with other arguments; fix: rerun that build "
                f"or delete {part} to start this one"
            )
        logger.info("resuming the build in %s", part)
    else:
        if part.exists():
            shutil.rmtree(part)  # a partial without its state file never committed a batch
        part.mkdir(parents=True)
        write_json_atomic(state, spec)
    return part


def open_db(part: Path) -> sqlite_utils.Database:
    db = sqlite_utils.Database(part / PASSAGES)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL survives a killed process intact
    if not _initialised(db):
        # a kill -9 while the tables were being created leaves some of them: nothing was committed
        for table in ("passages", "pending", "state"):
            db[table].drop(ignore=True)
        db.conn.execute("BEGIN")  # one transaction: every table and the state row, or none
        try:
            db["passages"].create(
                {"key": int, "title": str, "text": str, "article": str, "source": str, "start": int, "end": int},
                pk="key",
            )
            db["pending"].create({"key": int, "vector": bytes}, pk="key")
            db["state"].create({"id": int, "consumed": int, "total": int, "encode_s": float}, pk="id")
            db.conn.execute("INSERT INTO state (id, consumed, total, encode_s) VALUES (1, 0, -1, 0.0)")
            db.conn.execute("COMMIT")
        except BaseException:
            db.conn.execute("ROLLBACK")
            raise
    return db


def _initialised(db) -> bool:
    """The partial's tables exist with their state row (written last, in the same transaction)."""
    return "state" in db.table_names() and db.execute("SELECT 1 FROM state WHERE id = 1").fetchone() is not None


def _closes_db_on_error(fn):
    """A step that stops (Ctrl-C, a full disk) closes the partial's connection: one left open by a
    traceback kept in memory would lock the next in-process attempt out of that file."""

    @functools.wraps(fn)
    def step(db, *args, **kwargs):
        try:
            return fn(db, *args, **kwargs)
        except BaseException:
            db.close()
            raise

    return step


@_closes_db_on_error
def encode_all(db, enc: Encoder | None, spec: dict, params: ChunkParams, progress: Progress | None,
                group_size: int, source: VectorSource | None = None) -> None:
    """Chunk, encode (unless `enc` is None: a BM25-only index) and commit, a group at a time."""
    state = db["state"].get(1)
    total = state["total"]
    if "pending" not in db.table_names():
        return  # every chunk is encoded and the graph saved
    if total < 0:
        counted = all(countable(c) for c in spec["corpora"])
        total = sum(1 for _ in spec_chunks(spec, params)) if counted else 0
        with db.conn:
            db.conn.execute("UPDATE state SET total = ? WHERE id = 1", (total,))
    done, encode_s = state["consumed"], state["encode_s"]
    stream = itertools.islice(spec_chunks(spec, params), done, None)
    if progress:
        progress(done, total)
    while group := list(itertools.islice(stream, group_size)):
        t0 = time.perf_counter()
        known = source.lookup(group) if source else {}
        todo = [c for c in group if c.key not in known] if enc is not None else []
        if todo:
            known.update(zip((c.key for c in todo), enc.encode_passages([c.title for c in todo], [c.text for c in todo])))
        vecs = [known[c.key] for c in group] if enc is not None else []
        encode_s += time.perf_counter() - t0
        done += len(group)
        with db.conn:  # one transaction: the passages, their vectors and the resume point
            # OR IGNORE: the same article twice in the input yields the same keys; keep one
            db.conn.executemany(
                "INSERT OR IGNORE INTO passages (key, title, text, article, source, start, end) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(c.key, c.title, c.text, c.article, c.source, c.start, c.end) for c in group],
            )
            db.conn.executemany(
                "INSERT OR IGNORE INTO pending (key, vector) VALUES (?, ?)",
                [(c.key, v.tobytes()) for c, v in zip(group, vecs)],
            )
            db.conn.execute("UPDATE state SET consumed = ?, encode_s = ? WHERE id = 1", (done, encode_s))
        if progress:
            progress(done, max(total, done) if total else 0)


def check_not_empty(db, part: Path, spec: dict) -> None:
    """No passages at all: say so and publish nothing (an empty index would answer nothing)."""
    if db.execute("SELECT 1 FROM passages LIMIT 1").fetchone():
        return
    db.close()
    shutil.rmtree(part)  # nothing in it worth resuming
    skipped = sum(len(bad) for bad in spec.get("skipped", {}).values())
    raise CorpusError(
        f"{' '.join(spec['corpora'])} yielded no passages ({skipped} file(s) skipped as unreadable); "
        "fix: check the corpus path and that its files hold text"
    )


@_closes_db_on_error
def build_hnsw(db, part: Path, dims: int, dtype: str, hnsw: HnswParams) -> float:
    from usearch.index import Index

    if "pending" not in db.table_names():
        return 0.0  # a previous run saved the graph and dropped the vectors, then was stopped
    t0 = time.perf_counter()
    index = Index(ndim=dims, metric=METRIC, dtype=dtype, connectivity=hnsw.connectivity,
                  expansion_add=hnsw.expansion_add, expansion_search=hnsw.expansion_search)
    # usearch's multi-threaded insert races: 5 of 20 builds of the same 152 vectors left a node
    # unreachable (recall@5 0.976 vs exact at ef=256), while 1 thread gave 20/20 exact graphs,
    # identical on every run. One thread costs ~2x add time (50k vectors: 70 s vs 34 s on 2 cores),
    # which is small beside encoding, so use it up to a size where the race matters least.
    n_pending = db.execute("SELECT count(*) FROM pending").fetchone()[0]
    threads = 1 if n_pending <= _SINGLE_THREAD_ADD else 0
    last = -1
    while True:
        rows = db.execute(
            "SELECT key, vector FROM pending WHERE key > ? ORDER BY key LIMIT ?", [last, _ADD_PAGE]
        ).fetchall()
        if not rows:
            break
        keys = np.fromiter((r[0] for r in rows), dtype=np.uint64, count=len(rows))
        vecs = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), dims)
        index.add(keys, vecs, threads=threads)
        last = rows[-1][0]
    save_graph(index, part / VECTORS)
    db["pending"].drop()
    return time.perf_counter() - t0


def manifest_for(spec: dict, encoder_info: dict, corpora: list, counts: dict, timing: dict, files: dict,
                 **extra) -> dict:
    """An index folder's manifest.json (single-process builds, Ray shards and their union)."""
    return {
        "format": FORMAT_VERSION, "build": spec, "encoder": encoder_info, "dtype": spec["dtype"],
        "metric": METRIC, "normalised": True, "hnsw": spec["hnsw"], "chunking": spec["chunking"],
        "corpora": corpora, "counts": counts, "timing": timing, **extra,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": files,
    }


def publish(part: Path, out: Path, manifest: dict) -> None:
    """Write the manifest into DIR.partial and rename it to DIR (replacing an index being updated)."""
    write_json_atomic(part / MANIFEST, manifest)
    if out.exists() and not any(out.iterdir()):
        out.rmdir()
    old = out.with_name(out.name + ".old")
    if out.exists():  # an updated index (update.py): move the served one aside first
        os.replace(out, old)
    os.replace(part, out)  # atomic on one filesystem: DIR appears complete or not at all
    (out / BUILD_STATE).unlink(missing_ok=True)  # shards of a Ray build have none
    if old.exists():
        shutil.rmtree(old)
    discard_previous(out)  # a set-aside partial lent its vectors (resume.py); no longer needed


@_closes_db_on_error
def finish(db, part: Path, out: Path, spec: dict, encoder_info: dict, started: float,
            index_s: float, bm25: bool = True) -> None:
    state = db["state"].get(1)
    sources = db.execute(
        "SELECT source, count(*), count(DISTINCT article) FROM passages GROUP BY source ORDER BY source"
    ).fetchall()
    passages = sum(r[1] for r in sources)
    dense = spec.get("dense", True)
    if not dense and "pending" in db.table_names():
        db["pending"].drop()  # a BM25-only index stores no vectors
    db.execute("PRAGMA journal_mode=DELETE")  # fold the WAL back: the index is one read-only file
    db.vacuum()
    db.close()
    if bm25:  # from the final passages, so a build and an `add` both leave it in step; resumed after its last commit
        build_lexical_from([part / PASSAGES], lexical_dir(part))
    manifest = manifest_for(
        spec, encoder_info,
        corpora=[{"source": s, "passages": n, "articles": a} for s, n, a in sources],
        counts={"passages": passages, "articles": sum(r[2] for r in sources), "chunks_read": state["consumed"]},
        timing={"encode_s": round(state["encode_s"], 2), "index_s": round(index_s, 2),
                "wall_s_last_run": round(time.time() - started, 2)},
        files=describe_files(part, (VECTORS, PASSAGES) if dense else (PASSAGES,)),
    )
    publish(part, out, manifest)
    logger.info("built %s: %d passages", out, passages)
