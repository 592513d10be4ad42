"""Build an index folder from corpora: chunk, encode, store, then build the HNSW graph.

Resumable: each encoded batch is committed to DIR.partial/passages.db in one SQLite transaction
together with its vectors and the count of chunks consumed from the (deterministic) chunk stream,
so after a kill -9 the next run skips exactly what was committed. The HNSW graph is built from the
stored vectors at the end, then DIR.partial is renamed to DIR: a half-built index is never served.
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
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import sqlite_utils

from targ_mlx.index.chunking import Chunk, ChunkParams, chunk_article
from targ_mlx.index.corpus import Article, read_corpus
from targ_mlx.index.documents import is_document_folder, scan_report
from targ_mlx.index.encoder import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_ENCODER,
    TORCH,
    Encoder,
    canonical_name,
    build_backend,
    load_encoder,
)
from targ_mlx.index.errors import CorpusError, IndexMismatchError
from targ_mlx.index.lock import writes_index
from targ_mlx.index.resume import check_strict, discard_previous, previous_partial, reusable_partial, set_aside
from targ_mlx.index.lexical import add_lexical, build_lexical, has_lexical, lexical_dir, passage_rows
from targ_mlx.index.reuse import VectorSource
from targ_mlx.index.store import (
    BUILD_STATE,
    DTYPES,
    FORMAT_VERSION,
    MANIFEST,
    METRIC,
    PASSAGES,
    VECTORS,
    HnswParams,
    describe_files,
    partial_dir,
    read_manifest,
    rebuild_command,
    save_graph,
    write_json_atomic,
)

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
DEFAULT_COMMIT_EVERY = 512  # chunks per encode call and per commit: sorting by length pads less
_ADD_PAGE = 50_000  # vectors read from SQLite per usearch add
_SINGLE_THREAD_ADD = 250_000  # up to this many vectors the graph is built on one thread (see _build_hnsw)


def _articles(corpora: Iterable[str], limit: int | None, documents: dict | None) -> Iterator[Article]:
    documents = documents or {}
    stream = itertools.chain.from_iterable(read_corpus(c, documents.get(c)) for c in corpora)
    return itertools.islice(stream, limit) if limit else stream


def iter_chunks(corpora: Iterable[str], params: ChunkParams, limit: int | None = None,
                documents: dict | None = None) -> Iterator[Chunk]:
    """The build's chunk stream, in a fixed order (what resuming relies on).

    `documents` ({folder: {path: sha256}}) pins the files read from documents folders.
    """
    for a in _articles(corpora, limit, documents):
        yield from chunk_article(a.source, a.id, a.title, a.text, params, a.pages, a.keep_short)


def spec_chunks(spec: dict, params: ChunkParams) -> Iterator[Chunk]:
    """The chunk stream a build (or update) spec describes."""
    return iter_chunks(spec["corpora"], params, spec["limit"], spec.get("documents"))


def _countable(spec: str) -> bool:
    # counting chunks first costs one extra read: cheap for the small formats, not for a dump
    return (spec == "vital-articles" or spec.partition("?")[0].lower().endswith((".jsonl", ".ndjson"))
            or is_document_folder(Path(spec)))


def _corpus_spec(c) -> str:
    # a file is recorded by absolute path, so the same build resumes from any working directory
    path, q, query = str(c).partition("?")
    return str(Path(path).resolve()) + q + query if Path(path).exists() else str(c)


def _build_spec(corpora, encoder, dtype, limit, params: ChunkParams, hnsw: HnswParams, backend: str,
                dense: bool = True) -> dict:
    corpora = [_corpus_spec(c) for c in corpora]
    scans = {c: scan_report(Path(c)) for c in corpora if is_document_folder(Path(c))}
    documents = {c: files for c, (files, _) in scans.items()}
    skipped = {c: bad for c, (_, bad) in scans.items() if bad}
    return {
        "format": FORMAT_VERSION,
        "corpora": corpora,
        **({"documents": documents} if documents else {}),
        # unreadable files, left out and listed (the manifest keeps them); not part of what
        # makes two builds the same, so removing a bad file lets the same build resume
        **({"skipped": skipped} if skipped else {}),
        "encoder": encoder,
        "backend": backend,
        "dtype": dtype,
        "limit": limit,
        "chunking": {"size": params.size, "overlap": params.overlap, "min_size": params.min_size},
        "hnsw": {"connectivity": hnsw.connectivity, "expansion_add": hnsw.expansion_add,
                 "expansion_search": hnsw.expansion_search},
        # BM25 only: no vectors stored; the encoder scores the few passages a search returns
        **({} if dense else {"dense": False}),
    }


def _same_build(a: dict, b: dict) -> bool:
    """Equal build arguments, ignoring expansion_search (a serving setting, not part of the graph)."""

    def strip(spec: dict) -> dict:
        return {**{k: v for k, v in spec.items() if k not in ("skipped", "dense")}, "dense": spec.get("dense", True),
                "corpora": [_corpus_spec(c) for c in spec["corpora"]], "backend": spec.get("backend", TORCH),
                "hnsw": {k: v for k, v in spec["hnsw"].items() if k != "expansion_search"}}

    return strip(a) == strip(b)


def _set_expansion_search(out: Path, manifest: dict, ef: int) -> None:
    manifest["build"]["hnsw"]["expansion_search"] = manifest["hnsw"]["expansion_search"] = ef
    write_json_atomic(out / MANIFEST, manifest)
    logger.info("%s: serving expansion_search set to %d", out, ef)


def existing_backend(out: Path) -> str | None:
    """The backend of the index (or unfinished build) in `out`: a rerun without --backend resumes
    or finds it as it was begun, even from before the default backend changed."""
    for spec_file in (out / MANIFEST, partial_dir(out) / BUILD_STATE):
        if spec_file.is_file():
            spec = json.loads(spec_file.read_text())
            return spec.get("build", spec).get("backend", TORCH)
    return None


def _open_partial(out: Path, spec: dict) -> Path:
    part = partial_dir(out)
    state = part / BUILD_STATE
    if state.is_file() and reusable_partial(json.loads(state.read_text()), spec, _same_build):
        set_aside(part)  # documents changed between attempts: start afresh, reusing its vectors
    if state.is_file():
        if not _same_build(json.loads(state.read_text()), spec):
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


def _open_db(part: Path) -> sqlite_utils.Database:
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


@writes_index
def build_index(
    corpora: list[str],
    out: Path,
    encoder: str | None = None,
    dtype: str = "f16",
    limit: int | None = None,
    connectivity: int = HnswParams.connectivity,
    expansion_add: int = HnswParams.expansion_add,
    expansion_search: int = HnswParams.expansion_search,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Progress | None = None,
    chunking: ChunkParams = ChunkParams(),
    commit_every: int = DEFAULT_COMMIT_EVERY,
    reuse: Sequence[Path] = (),
    backend: str | None = None,
    bm25: bool = True,
    dense: bool = True,
    strict: bool = False,
) -> Path:
    """Build (or resume, or find already built) the index of `corpora` in folder `out`.

    Args:
        corpora: corpus specs (see `corpus.py`), read in this order.
        out: the index folder; it appears only when complete.
        encoder: sentence-transformers model name; None for all-MiniLM-L6-v2 (offline).
        dtype: stored vector type, "f16" (default), "i8" or "f32".
        limit: read at most this many articles over all corpora (None: all).
        connectivity, expansion_add, expansion_search: HNSW parameters (see `HnswParams`).
        batch_size: encoder batch size.
        progress: called as progress(chunks_done, chunks_total); total is 0 when unknown.
        chunking: chunk size/overlap/minimum (the paper's 1000/100/200).
        commit_every: chunks encoded per call and committed per transaction (what a kill can lose).
        reuse: finished index folders (same encoder) whose vectors are taken for identical chunks
            instead of encoding them again.
        backend: encoder backend, "mlx", "torch", "torch-bf16" or "onnx-int8"; None: that of the
            index or unfinished build already in `out`, else `encoder.build_backend` (torch-bf16
            where the CPU multiplies bfloat16, else mlx where it runs, else torch).
        bm25: also build the BM25 part (`lexical.py`) for lexical and hybrid search; an index
            already built without it gains it in place.
        dense: encode and store every passage's vector (the HNSW graph). False: a BM25-only
            index, built at reading speed instead of encoding speed (a million chunks in minutes,
            not hours); searches then encode only the passages they return, for their cosine.
        strict: a file of a documents folder that cannot be read is an error, not a skip.
        wait: (keyword, from `writes_index`) wait for another writer of `out` instead of raising
            IndexLockedError.

    Returns:
        `out`, holding vectors.usearch, passages.db and manifest.json.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be a positive number of articles, got {limit}")
    out = Path(out)
    hnsw = HnswParams(connectivity, expansion_add, expansion_search)
    name = canonical_name(encoder or DEFAULT_ENCODER)
    backend = backend or existing_backend(out) or build_backend(name)
    if not dense and not bm25:
        raise ValueError("an index needs a dense or a BM25 part; fix: drop --no-dense or --no-bm25")
    spec = _build_spec(corpora, name, dtype, limit, chunking, hnsw, backend, dense)
    check_strict(spec, strict)
    if (out / MANIFEST).is_file():
        manifest = read_manifest(out)
        built = manifest["build"]
        if _same_build(built, spec):
            if built["hnsw"].get("expansion_search") != expansion_search:
                _set_expansion_search(out, manifest, expansion_search)
            if bm25 and not has_lexical(out):
                add_lexical(out)  # built before BM25 parts existed: add one, the dense part unchanged
            logger.info("%s is already built", out)
            return out
        if "documents" in spec and _same_build({**built, "documents": spec["documents"]}, spec):
            raise IndexMismatchError(
                f"documents changed since {out} was built; fix: python -m targ_mlx.index add {out} "
                f"--corpus {' '.join(spec['documents'])} (re-chunks only the changed files)"
            )
        raise IndexMismatchError(
            f"{out} already holds an index built as `{rebuild_command(built, out)}`; "
            "fix: choose another --out or delete that folder"
        )
    for c in corpora:  # fail on a bad spec before loading the encoder
        read_corpus(c)
    started = time.time()
    part = _open_partial(out, spec)
    db = _open_db(part)
    enc = load_encoder(name, backend=backend)
    enc.batch_size = batch_size
    reuse = [*reuse, *previous_partial(out)]
    source = VectorSource(reuse, name, enc.dims, backend) if reuse and dense else None
    _encode_all(db, enc if dense else None, spec, chunking, progress, commit_every, source)
    _check_not_empty(db, part, spec)
    index_s = _build_hnsw(db, part, enc.dims, dtype, hnsw) if dense else 0.0
    _finish(db, part, out, spec, enc.describe(), started, index_s, bm25=bm25)
    return out


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
def _encode_all(db, enc: Encoder | None, spec: dict, params: ChunkParams, progress: Progress | None,
                group_size: int, source: VectorSource | None = None) -> None:
    """Chunk, encode (unless `enc` is None: a BM25-only index) and commit, a group at a time."""
    state = db["state"].get(1)
    total = state["total"]
    if "pending" not in db.table_names():
        return  # every chunk is encoded and the graph saved
    if total < 0:
        countable = all(_countable(c) for c in spec["corpora"])
        total = sum(1 for _ in spec_chunks(spec, params)) if countable else 0
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


def _check_not_empty(db, part: Path, spec: dict) -> None:
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
def _build_hnsw(db, part: Path, dims: int, dtype: str, hnsw: HnswParams) -> float:
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
def _finish(db, part: Path, out: Path, spec: dict, encoder_info: dict, started: float,
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
    if bm25:  # from the final passages, so a build and an `add` both leave it in step; redone on resume
        build_lexical(passage_rows([part / PASSAGES]), lexical_dir(part))
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
