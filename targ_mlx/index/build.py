"""Build an index folder from corpora: chunk, encode, store, then build the HNSW graph; the stages
are `stages.py`'s (shared with `add` and the Ray build), the chunk stream and spec `spec.py`'s.

Resumable: each encoded batch is committed to DIR.partial/passages.db in one SQLite transaction
together with its vectors and the count of chunks consumed from the (deterministic) chunk stream,
so after a kill -9 the next run skips exactly what was committed. The HNSW graph is built from the
stored vectors at the end, then DIR.partial is renamed to DIR: a half-built index is never served.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Sequence

from targ_mlx.index.chunking import ChunkParams
from targ_mlx.index.corpus import read_corpus
from targ_mlx.index.encoder import DEFAULT_BATCH_SIZE, DEFAULT_ENCODER, TORCH, build_backend, canonical_name, load_encoder
from targ_mlx.index.errors import IndexMismatchError
from targ_mlx.index.lexical import add_lexical, has_lexical
from targ_mlx.index.lock import writes_index
from targ_mlx.index.resume import check_strict, previous_partial
from targ_mlx.index.reuse import VectorSource
from targ_mlx.index.spec import build_spec, iter_chunks, same_build, spec_chunks  # noqa: F401  (re-exported)
from targ_mlx.index.stages import (  # noqa: F401  (manifest_for, publish: re-exported)
    DEFAULT_COMMIT_EVERY,
    Progress,
    build_hnsw,
    check_not_empty,
    encode_all,
    finish,
    manifest_for,
    open_db,
    open_partial,
    publish,
)
from targ_mlx.index.store import BUILD_STATE, DTYPES, MANIFEST, HnswParams, partial_dir, read_manifest, rebuild_command, write_json_atomic

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_COMMIT_EVERY", "Progress", "build_index", "existing_backend", "iter_chunks", "manifest_for",
           "publish", "spec_chunks"]


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
        backend: encoder backend (`encoder.BACKENDS`); None: that of the index or unfinished
            build already in `out`, else `encoder.build_backend` (torch-bf16 where the CPU has
            AMX-BF16, else mlx-bf16 where the kernels multiply bfloat16, else mlx, else torch).
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
    spec = build_spec(corpora, name, dtype, limit, chunking, hnsw, backend, dense)
    check_strict(spec, strict)
    if (out / MANIFEST).is_file():
        manifest = read_manifest(out)
        built = manifest["build"]
        if same_build(built, spec):
            if built["hnsw"].get("expansion_search") != expansion_search:
                _set_expansion_search(out, manifest, expansion_search)
            if bm25 and not has_lexical(out):
                add_lexical(out)  # built before BM25 parts existed: add one, the dense part unchanged
            logger.info("%s is already built", out)
            return out
        if "documents" in spec and same_build({**built, "documents": spec["documents"]}, spec):
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
    part = open_partial(out, spec)
    db = open_db(part)
    enc = load_encoder(name, backend=backend)
    enc.batch_size = batch_size
    reuse = [*reuse, *previous_partial(out)]
    source = VectorSource(reuse, name, enc.dims, backend) if reuse and dense else None
    encode_all(db, enc if dense else None, spec, chunking, progress, commit_every, source)
    check_not_empty(db, part, spec)
    index_s = build_hnsw(db, part, enc.dims, dtype, hnsw) if dense else 0.0
    finish(db, part, out, spec, enc.describe(), started, index_s, bm25=bm25)
    return out
