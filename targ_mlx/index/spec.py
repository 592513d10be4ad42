"""A build's input: the chunk stream (in a fixed order, what resuming relies on) and the build
spec that names it, shared by the single-process build, `add` (update.py) and the Ray build."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterable, Iterator

from targ_mlx.index.chunking import Chunk, ChunkParams, chunk_article
from targ_mlx.index.corpus import Article, read_corpus
from targ_mlx.index.documents import is_document_folder, scan_report
from targ_mlx.index.encoder import TORCH
from targ_mlx.index.store import FORMAT_VERSION, HnswParams


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


def countable(spec: str) -> bool:
    # counting chunks first costs one extra read: cheap for the small formats, not for a dump
    return (spec == "vital-articles" or spec.partition("?")[0].lower().endswith((".jsonl", ".ndjson"))
            or is_document_folder(Path(spec)))


def corpus_spec(c) -> str:
    # a file is recorded by absolute path, so the same build resumes from any working directory
    path, q, query = str(c).partition("?")
    return str(Path(path).resolve()) + q + query if Path(path).exists() else str(c)


def build_spec(corpora, encoder, dtype, limit, params: ChunkParams, hnsw: HnswParams, backend: str,
                dense: bool = True) -> dict:
    corpora = [corpus_spec(c) for c in corpora]
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


def same_build(a: dict, b: dict) -> bool:
    """Equal build arguments, ignoring expansion_search (a serving setting, not part of the graph)."""

    def strip(spec: dict) -> dict:
        return {**{k: v for k, v in spec.items() if k not in ("skipped", "dense")}, "dense": spec.get("dense", True),
                "corpora": [corpus_spec(c) for c in spec["corpora"]], "backend": spec.get("backend", TORCH),
                "hnsw": {k: v for k, v in spec["hnsw"].items() if k != "expansion_search"}}

    return strip(a) == strip(b)
