"""On-disk Wikipedia retrieval: corpus readers, chunking, a sentence-transformers encoder, a usearch
HNSW index with SQLite passages, and `python -m targ_mlx.index` to build, inspect and search it.

Importing this package loads neither torch nor usearch nor mlx; they load when first used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from targ_mlx.index.build import build_index, existing_backend
from targ_mlx.index.chunking import ChunkParams
from targ_mlx.index.corpus import VITAL
from targ_mlx.index.encoder import DEFAULT_ENCODER, Encoder, backend_of, build_backend, default_backend, family, load_encoder
from targ_mlx.index.exact import ExactRetriever
from targ_mlx.index.errors import (
    CorpusError,
    IndexCorruptError,
    IndexError_,
    IndexLockedError,
    IndexMismatchError,
    IndexMissingError,
)
from targ_mlx.index.background import BuildingIndex
from targ_mlx.index.opened import OpenedIndex, describe, load_encoders
from targ_mlx.index.retriever import IndexRetriever, open_retriever
from targ_mlx.index.merged import open_indexes
from targ_mlx.index.unfinished import resume_unfinished, unfinished
from targ_mlx.index.update import add_documents
from targ_mlx.index.store import HnswParams, IndexInfo, read_manifest

DEFAULT_INDEX_NAME = "vital-articles-minilm"
ENV_INDEX = "TARG_MLX_INDEX"

__all__ = [
    "BuildingIndex", "OpenedIndex", "describe", "load_encoders",
    "CorpusError", "ChunkParams", "DEFAULT_ENCODER", "Encoder", "ExactRetriever", "HnswParams", "IndexCorruptError",
    "IndexError_", "IndexInfo", "IndexMismatchError", "IndexMissingError", "IndexRetriever",
    "add_documents", "build_index", "default_index_dir", "ensure_default_index", "ensure_index", "load_encoder", "open_indexes",
    "open_retriever", "read_manifest",
]


def default_index_dir() -> Path:
    """$TARG_MLX_INDEX, else <repo>/index/vital-articles-minilm in a source checkout, else the
    user data dir (platformdirs)."""
    if os.environ.get(ENV_INDEX):
        return Path(os.environ[ENV_INDEX]).expanduser()
    repo_index = Path(__file__).resolve().parents[2] / "index"
    if repo_index.is_dir():
        return repo_index / DEFAULT_INDEX_NAME
    import platformdirs

    return Path(platformdirs.user_data_dir("targ-mlx")) / "index" / DEFAULT_INDEX_NAME


def ensure_default_index(progress: Callable[[int, int], None] | None = None) -> Path:
    """Build the offline default index (vital-articles, all-MiniLM-L6-v2, f16) on first use.

    Resumes an interrupted build; returns at once when it is already built. Vectors of identical
    chunks in finished sibling indexes built with the same encoder (e.g. index/vital-pool-minilm)
    are reused instead of encoded again.
    """
    out = default_index_dir()
    if (out / "manifest.json").is_file():
        try:
            return build_index([VITAL], out, progress=progress)
        except IndexLockedError:
            return out  # another process is writing it (an `add`): serve it as it is, never wait
    if unfinished(out):  # the build begun there (perhaps by another entry point), as it was begun
        return resume_unfinished(out, progress)
    backend = existing_backend(out) or build_backend(DEFAULT_ENCODER)
    return build_index([VITAL], out, progress=progress, backend=backend,
                       reuse=_siblings_with_encoder(out, DEFAULT_ENCODER, backend), wait=True)


def ensure_index(path: Path | str | None, progress: Callable[[int, int], None] | None = None) -> Path:
    """The index an entry point needs, with any unfinished build of it resumed first.

    Args:
        path: an index folder; None for the default index (built on first use).
        progress: called as progress(done, total) while a build runs.
    """
    if path is None:
        return ensure_default_index(progress)
    return resume_unfinished(Path(path), progress)


def _siblings_with_encoder(out: Path, encoder: str, backend: str) -> list[Path]:
    if not out.parent.is_dir():
        return []
    found = []
    for d in sorted(out.parent.iterdir()):
        try:
            m = read_manifest(d)
            if d != out and m["encoder"]["name"] == encoder and family(backend_of(m)) == family(backend):
                found.append(d)
        except IndexError_:
            continue  # not a finished index: nothing to reuse there
    return found
