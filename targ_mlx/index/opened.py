"""What a front end may know of an open retriever, read in one place.

The retrievers (`IndexRetriever`, `ShardedRetriever`, `MergedRetriever`, `HybridRetriever`,
`BuildingIndex`) differ in which of these they hold; `describe` reads them all, so no face
probes a retriever's attributes itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class OpenedIndex:
    paths: tuple[Path, ...]  # the index folders searched, in order
    manifest_id: str | None  # what the decision log records as the index (None while building)
    ready: bool  # False while a background build runs
    status: str  # "" when ready, else why the index cannot be searched ("index building 43%")
    mode: str  # dense, bm25 or hybrid
    corpora: tuple[str, ...]  # the corpora the (first) index was built from
    size: int  # passages (0 while building)


def _inner(retriever):
    """The retriever a `BuildingIndex` serves once built (None before), else the retriever itself."""
    return getattr(retriever, "_retriever", None) if hasattr(retriever, "ready") else retriever


def _paths(retriever) -> list[Path]:
    if retriever is None:
        return []
    if getattr(retriever, "paths", None):  # what `open_indexes` opened
        return [Path(p) for p in retriever.paths]
    if getattr(retriever, "path", None) is not None:
        return [Path(retriever.path)]
    return [p for part in getattr(retriever, "parts", []) for p in _paths(part)]


def describe(retriever) -> OpenedIndex:
    """The facts of `retriever` (any of this package's retrievers)."""
    inner = _inner(retriever)
    manifest = getattr(inner, "manifest", None) or {}
    try:
        size = len(retriever)
    except TypeError:
        size = 0
    return OpenedIndex(
        paths=tuple(dict.fromkeys(_paths(inner))), manifest_id=getattr(retriever, "manifest_id", None),
        ready=bool(getattr(retriever, "ready", True)), status=getattr(retriever, "status", "") or "",
        mode=getattr(inner, "mode", "dense"), corpora=tuple(manifest.get("build", {}).get("corpora", [])), size=size)


def load_encoders(retriever):
    """Load the query encoder of every part now (not on the first search); returns `retriever`."""
    if getattr(retriever, "mode", "dense") == "bm25":  # searched by words only: no encoder to load
        return retriever
    for part in getattr(retriever, "parts", [retriever]):  # indexes built with other encoders
        dense = part[0] if isinstance(part, tuple) else part  # a hybrid's parts: (dense, BM25) pairs
        dense.encoder  # noqa: B018
    return retriever
