"""`add DIR --corpus FOLDER...`: bring an index up to date with folders of documents, in place.

Only files whose sha256 changed (or that are new) are read, chunked and encoded; the passages of
changed and removed files are deleted; the HNSW graph is loaded and edited (old keys removed, new
vectors added), never rebuilt. The work happens in DIR.partial, a copy of DIR, with the build's
own machinery (`build.py`): the plan in build.json, each encoded batch committed with its resume
point, the manifest written last and the folder published in place of DIR. An interrupted `add`
resumes when run again; DIR is served unchanged until the new one replaces it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from targ_mlx.index.spec import corpus_spec
from targ_mlx.index.stages import DEFAULT_COMMIT_EVERY, encode_all, finish, open_db
from targ_mlx.index.chunking import ChunkParams
from targ_mlx.index.documents import digest, is_document_folder, scan_report
from targ_mlx.index.encoder import DEFAULT_BATCH_SIZE, load_encoder, query_backend
from targ_mlx.index.errors import CorpusError, IndexMismatchError
from targ_mlx.index.lexical import has_lexical
from targ_mlx.index.lock import writes_index
from targ_mlx.index.resume import check_strict, previous_partial, set_aside
from targ_mlx.index.reuse import VectorSource
from targ_mlx.index.store import (
    BUILD_STATE,
    MANIFEST,
    PASSAGES,
    VECTORS,
    manifest_id,
    partial_dir,
    read_manifest,
    save_graph,
    write_json_atomic,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpdatePlan:
    """Which files an `add` re-reads and which it drops, per documents folder."""

    changed: dict[str, dict[str, str]] = field(default_factory=dict)  # folder -> {path: sha256}
    removed: dict[str, list[str]] = field(default_factory=dict)  # folder -> [path]
    skipped: dict[str, dict[str, str]] = field(default_factory=dict)  # folder -> {path: why unreadable}

    @property
    def empty(self) -> bool:
        return not any(self.changed.values()) and not any(self.removed.values())

    def summary(self) -> str:
        n_changed = sum(map(len, self.changed.values()))
        n_removed = sum(map(len, self.removed.values()))
        n_skipped = sum(map(len, self.skipped.values()))
        return f"{n_changed} new or changed file(s), {n_removed} removed" + (
            f", {n_skipped} skipped as unreadable" if n_skipped else "")


def plan_update(built: dict, folders: list[str]) -> tuple[UpdatePlan, dict]:
    """Compare the folders on disk with the files the index holds; return the plan and new spec."""
    old = built.get("documents", {})
    scans = {f: scan_report(Path(f)) for f in folders}
    now = {f: files for f, (files, _) in scans.items()}
    skipped = {**built.get("skipped", {}), **{f: bad for f, (_, bad) in scans.items()}}
    plan = UpdatePlan(
        changed={f: {r: s for r, s in files.items() if old.get(f, {}).get(r) != s} for f, files in now.items()},
        removed={f: [r for r in old.get(f, {}) if r not in now[f]] for f in folders},
        skipped={f: bad for f, (_, bad) in scans.items() if bad},
    )
    spec = {**built, "corpora": built["corpora"] + [f for f in folders if f not in built["corpora"]],
            "documents": {**old, **now}, "skipped": {f: bad for f, bad in skipped.items() if bad}}
    if not spec["skipped"]:
        del spec["skipped"]
    return plan, spec


def _recover_swap(out: Path) -> None:
    """Finish a publish that was stopped between moving DIR aside and moving DIR.partial in."""
    old, part = out.with_name(out.name + ".old"), partial_dir(out)
    if not (out / MANIFEST).is_file() and (part / MANIFEST).is_file() and old.is_dir():
        os.replace(part, out)
    if old.is_dir() and (out / MANIFEST).is_file():
        shutil.rmtree(old)


def _start(out: Path, manifest: dict, spec: dict, plan: UpdatePlan, folders: list[str]) -> Path:
    part = partial_dir(out)
    if part.exists():
        shutil.rmtree(part)  # no plan file: nothing was committed there
    part.mkdir()
    for name in (PASSAGES, VECTORS):
        shutil.copy2(out / name, part / name)
    write_json_atomic(part / BUILD_STATE, {**spec, "update": {
        "base": manifest_id(manifest), "folders": folders, "changed": plan.changed, "removed": plan.removed,
        "deleted": False}})
    return part


def _resume(out: Path, manifest: dict, folders: list[str]) -> dict | None:
    state_file = partial_dir(out) / BUILD_STATE
    if not state_file.is_file():
        return None
    state = json.loads(state_file.read_text())
    upd = state.get("update")
    if upd is None or upd["base"] != manifest_id(manifest) or upd["folders"] != folders:
        raise IndexMismatchError(
            f"{partial_dir(out)} holds another unfinished build or add; fix: rerun that command "
            f"or delete {partial_dir(out)}"
        )
    if _files_moved_on(upd):
        set_aside(partial_dir(out))  # files changed again: plan afresh, reusing what was encoded
        return None
    logger.info("resuming the add in %s", partial_dir(out))
    return state


def _files_moved_on(upd: dict) -> bool:
    """True when a file the unfinished add meant to read no longer has the bytes it planned for."""
    for folder, files in upd["changed"].items():
        for rel, sha in files.items():
            path = Path(folder, rel)
            if not path.is_file() or digest(path) != sha:
                return True
    return False


def _delete_stale(out: Path, part: Path, db, state: dict) -> None:
    """One transaction: drop the passages of changed and removed files, remember their keys."""
    upd = state["update"]
    files = [(f, r) for f, rs in upd["changed"].items() for r in rs] + [
        (f, r) for f, rs in upd["removed"].items() for r in rs]
    with closing(sqlite3.connect(f"file:{(out / PASSAGES).resolve()}?mode=ro&immutable=1", uri=True)) as src:
        stale = [k for f, r in files
                 for (k,) in src.execute("SELECT key FROM passages WHERE source = ? AND article = ?", (f, r))]
    with db.conn:
        db.conn.execute("CREATE TABLE IF NOT EXISTS stale (key INTEGER PRIMARY KEY)")
        db.conn.execute("CREATE TABLE IF NOT EXISTS pending (key INTEGER PRIMARY KEY, vector BLOB)")
        db.conn.executemany("INSERT OR IGNORE INTO stale (key) VALUES (?)", [(k,) for k in stale])
        db.conn.executemany("DELETE FROM passages WHERE key = ?", [(k,) for k in stale])
        db.conn.execute("UPDATE state SET consumed = 0, total = -1, encode_s = 0 WHERE id = 1")
    write_json_atomic(part / BUILD_STATE, {**state, "update": {**upd, "deleted": True}})


def _edit_graph(db, part: Path) -> float:
    """Remove the stale keys from the graph and add the new vectors; redoing it is harmless."""
    from usearch.index import Index

    if "pending" not in db.table_names():
        return 0.0
    t0 = time.perf_counter()
    index = Index.restore(str(part / VECTORS))
    stale = np.fromiter((k for (k,) in db.execute("SELECT key FROM stale")), dtype=np.uint64)
    if len(stale):
        index.remove(stale)
    rows = db.execute("SELECT key, vector FROM pending ORDER BY key").fetchall()
    if rows:
        keys = np.fromiter((r[0] for r in rows), dtype=np.uint64, count=len(rows))
        vecs = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), index.ndim)
        index.add(keys, vecs, threads=1)  # one thread: the exact graph (see stages.build_hnsw)
    save_graph(index, part / VECTORS)
    with db.conn:
        db.conn.execute("DROP TABLE pending")
        db.conn.execute("DROP TABLE stale")
    return time.perf_counter() - t0


@writes_index
def add_documents(
    out: Path,
    corpora: list[str],
    progress: Callable[[int, int], None] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    commit_every: int = DEFAULT_COMMIT_EVERY,
    strict: bool = False,
) -> UpdatePlan:
    """Add or update the documents of `corpora` (folders) in the index `out`; resume if interrupted.

    Args:
        out: a finished index folder (of documents, Wikipedia, or both).
        corpora: documents folders; files of other folders in the index are left alone.
        progress: called as progress(chunks_done, chunks_total) while encoding.
        batch_size, commit_every, strict, wait: as for `build_index`.

    Returns:
        The plan carried out (empty when the index was already up to date).
    """
    out = Path(out)
    _recover_swap(out)
    manifest = read_manifest(out)
    if "shards" in manifest:
        raise IndexMismatchError(f"{out} is a sharded (--ray) index; fix: add documents to a single-process index")
    if manifest["build"].get("dense", True) is False:
        raise IndexMismatchError(f"{out} is a BM25-only index (--no-dense); fix: build your documents into an index "
                                 "of their own and search both (--index twice)")
    folders = [corpus_spec(c) for c in corpora]
    for f in folders:
        if not is_document_folder(Path(f)):
            raise CorpusError(f"add --corpus {f}: not a folder of .md/.txt/.html/.pdf files; fix: name such a folder")
    started = time.time()
    state = _resume(out, manifest, folders)
    if state is None:
        plan, spec = plan_update(manifest["build"], folders)
        check_strict({"skipped": plan.skipped}, strict)
        if plan.empty:
            logger.info("%s is up to date", out)
            return plan
        state = json.loads((_start(out, manifest, spec, plan, folders) / BUILD_STATE).read_text())
    upd = state["update"]
    plan = UpdatePlan(upd["changed"], upd["removed"],
                      {f: bad for f, bad in state.get("skipped", {}).items() if f in folders})
    part = partial_dir(out)
    db = open_db(part)
    try:
        if not upd["deleted"]:
            _delete_stale(out, part, db, state)
        enc = load_encoder(manifest["encoder"]["name"], backend=query_backend(manifest))
        enc.check_matches(manifest, str(out))
        enc.batch_size = batch_size
        params = ChunkParams(**manifest["chunking"])
        reading = {"corpora": [f for f in folders if plan.changed.get(f)], "limit": None, "documents": plan.changed}
        prev = previous_partial(out)
        source = VectorSource(prev, enc.name, enc.dims, enc.backend) if prev else None
        encode_all(db, enc, reading, params, progress, commit_every, source)
        index_s = _edit_graph(db, part)
    except BaseException:
        db.close()  # an interrupted add (Ctrl-C) leaves no connection that would lock the resume
        raise
    spec = {k: v for k, v in state.items() if k != "update"}
    finish(db, part, out, spec, enc.describe(), started, index_s, bm25=has_lexical(out))
    logger.info("updated %s: %s", out, plan.summary())
    return plan
