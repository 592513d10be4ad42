"""Serve a built index: memory-mapped usearch view + read-only SQLite passages.

`IndexRetriever` implements `targ_mlx.retrieval.Retriever`. Opening checks the manifest, file sizes
and sampled checksums and maps the vectors with `view=True` (nothing is loaded); the query encoder
is loaded on the first search, once per process.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import numpy as np

from targ_mlx.index.encoder import Encoder, canonical_name
from targ_mlx.index.errors import IndexCorruptError, IndexMismatchError, IndexMissingError
from targ_mlx.index.query import QueryEncoding
from targ_mlx.index.sharded import ShardedRetriever
from targ_mlx.index.swap import survives_swap
from targ_mlx.index.store import (
    PASSAGES,
    VECTORS,
    manifest_id,
    read_manifest,
    rebuild_command,
    verify_files,
)
from targ_mlx.retrieval import Passage, check_k

# Passages of a BM25-only index whose vectors, encoded at search time, are kept (the most
# recently used; 6 MB at 384-d): a chat's follow-ups and a server's similar questions find many of
# the same passages, and encoding them is most of such a search.
KEPT_VECTORS = 4096


class IndexRetriever(QueryEncoding):
    """Top-k passages from an on-disk index; thread-safe for concurrent searches."""

    def __init__(self, path: Path, manifest: dict, index, encoder: Encoder | None = None):
        self.path = Path(path)
        self.manifest = manifest
        self.manifest_id = manifest_id(manifest)
        self.index = index
        self._encoder = encoder
        self._lock = threading.Lock()
        self.kept_vectors = KEPT_VECTORS  # 0: encode every time (bench_kept_vectors.py's "off")
        self._kept: OrderedDict[int, np.ndarray] = OrderedDict()
        uri = f"file:{(self.path / PASSAGES).resolve()}?mode=ro&immutable=1"
        try:
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False)
        except sqlite3.OperationalError as e:  # gone between the vectors' open and this one: a publish's swap
            raise IndexMissingError(f"{self.path / PASSAGES} cannot be opened ({e}); "
                                    f"fix: check that {self.path} is a finished index") from None

    def __len__(self) -> int:
        return len(self.index) if self.index is not None else self.manifest["counts"]["passages"]

    def search_vectors(self, vectors: np.ndarray, k: int = 5, exact: bool = False) -> list[list[Passage]]:
        """Search with already-encoded, normalised query vectors (n, dims)."""
        check_k(k)
        if self.index is None:
            raise IndexMismatchError(f"{self.path} is a BM25-only index (built with --no-dense); "
                                     "fix: search it with --retriever bm25 or hybrid")
        vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
        found = self.index.search(vectors, k, exact=exact)
        keys = np.atleast_2d(found.keys)
        dists = np.atleast_2d(found.distances)
        # one query gives usearch `Matches` (no counts), several give `BatchMatches`
        counts = np.atleast_1d(getattr(found, "counts", len(found.keys)))
        rows = self.passages([int(x) for i, c in enumerate(counts) for x in keys[i, :c]])
        return [
            [
                Passage(int(key), *rows[int(key)], score=float(1.0 - dist))
                for key, dist in zip(keys[i, :c], dists[i, :c])
                if int(key) in rows
            ]
            for i, c in enumerate(counts)
        ]

    def vectors(self, keys: Sequence[int]) -> np.ndarray:
        """The stored (normalised) vectors of chunk keys, float32 (n, dims); hybrid search reads
        them to give a passage only BM25 found its cosine. A BM25-only index stores none: its
        passages are encoded now, as the build would have (a few per search)."""
        if self.index is None:
            return self._encoded(keys)
        got = self.index.get(np.asarray(keys, dtype=np.uint64))
        return np.atleast_2d(np.asarray(got, dtype=np.float32)).reshape(len(keys), -1)

    def _encoded(self, keys: Sequence[int]) -> np.ndarray:
        """Vectors of a BM25-only index's passages: those kept from earlier searches, the others
        encoded now and kept. A passage's vector does not depend on what it is encoded beside (each
        row of a batch is computed on its own tokens), so a kept one is what a new encode gives."""
        keep = self.kept_vectors
        with self._lock:
            have = {k: self._kept[k] for k in keys if keep and k in self._kept}
            for k in have:
                self._kept.move_to_end(k)
        new = [k for k in dict.fromkeys(keys) if k not in have]
        if new:
            rows = self.passages(new)
            have.update(zip(new, self.encoder.encode_passages([rows[k][0] for k in new], [rows[k][1] for k in new])))
            if keep:
                with self._lock:
                    self._kept.update((k, have[k]) for k in new)
                    while len(self._kept) > keep:
                        self._kept.popitem(last=False)
        return np.stack([have[k] for k in keys]) if keys else np.zeros((0, self.encoder.dims), np.float32)

    def passages(self, keys: Sequence[int]) -> dict[int, tuple[str, str]]:
        """key -> (title, text) for the given chunk keys."""
        out: dict[int, tuple[str, str]] = {}
        keys = list(dict.fromkeys(keys))
        with self._lock:
            for i in range(0, len(keys), 900):  # stay under SQLite's bound-parameter limit
                part = keys[i : i + 900]
                sql = f"SELECT key, title, text FROM passages WHERE key IN ({','.join('?' * len(part))})"
                for key, title, text in self._db.execute(sql, part):
                    out[key] = (title, text)
        return out

    def close(self) -> None:
        self._db.close()


@survives_swap
def open_retriever(
    path: Path | str, encoder: Encoder | str | None = None, verify: bool = False,
    expansion_search: int | None = None,
) -> "IndexRetriever | ShardedRetriever":
    """Open a built index for searching (vectors memory-mapped, not loaded); a sharded index
    (built with `--ray`) opens as one `ShardedRetriever` over its shards.

    Args:
        path: the index folder.
        encoder: the query encoder (object or name); None uses the one in the manifest. A name or
            dims that differ from the manifest raise IndexMismatchError.
        verify: also check whole-file sha256 checksums (reads every byte; slow on big indexes).
        expansion_search: HNSW ef at query time (recall vs latency); None uses the manifest's.

    Raises:
        IndexMissingError, IndexCorruptError, IndexMismatchError: one line each, naming the fix.
    """
    from usearch.index import Index

    path = Path(path)
    manifest = read_manifest(path)
    verify_files(path, manifest, full=verify)
    built = manifest["encoder"]
    if isinstance(encoder, str) and canonical_name(encoder) != canonical_name(built["name"]):
        raise IndexMismatchError(
            f"{path} was built with encoder {built['name']} but the query encoder is {encoder}; "
            f"fix: use --encoder {built['name']} or rebuild: {rebuild_command(manifest['build'], path)}"
        )
    if isinstance(encoder, Encoder):
        encoder.check_matches(manifest, str(path))
    elif isinstance(encoder, str):
        encoder = None  # same model as the manifest's: loaded lazily on first search
    if manifest["build"].get("dense", True) is False:  # BM25 only: no graph to open
        return IndexRetriever(path, manifest, None, encoder)
    if "shards" in manifest:  # built on Ray (distributed.py): one graph and store per shard
        shards = [open_retriever(path / s, expansion_search=expansion_search) for s in manifest["shards"]]
        return ShardedRetriever(path, manifest, shards, encoder)
    try:
        index = Index.restore(str(path / VECTORS), view=True)
    except Exception as e:  # usearch raises bare RuntimeError/ValueError for unreadable files
        raise IndexCorruptError(f"{path / VECTORS} cannot be opened ({e}); fix: rebuild the index") from None
    if index is None or index.ndim != built["dims"] or len(index) != manifest["counts"]["passages"]:
        raise IndexCorruptError(
            f"{path / VECTORS} does not match its manifest (dims/count); fix: delete {path} and rebuild: "
            f"{rebuild_command(manifest['build'], path)}"
        )
    # usearch does not save ef with the file: set the manifest's (or the caller's) on every open
    index.expansion_search = expansion_search or manifest["hnsw"].get("expansion_search") or 256
    return IndexRetriever(path, manifest, index, encoder)
