"""Reuse vectors from an already built index instead of encoding the same chunks again.

A chunk is reused when another index built with the same encoder holds the same key with the same
text (same corpus, article and offset): e.g. the vital-articles default index taken from a
vital-articles + wiki_pool index in seconds. Vectors come back at that index's stored precision.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Sequence

import numpy as np

from targ_mlx.index.chunking import Chunk
from targ_mlx.index.encoder import canonical_name
from targ_mlx.index.errors import IndexMismatchError
from targ_mlx.index.store import PASSAGES, VECTORS, read_manifest, verify_files


class VectorSource:
    """Stored vectors of finished indexes, looked up by chunk key and checked against the text."""

    def __init__(self, dirs: Sequence[Path], encoder: str, dims: int):
        from usearch.index import Index

        self.parts = []
        for d in map(Path, dirs):
            m = read_manifest(d)
            verify_files(d, m)
            if canonical_name(m["encoder"]["name"]) != canonical_name(encoder) or m["encoder"]["dims"] != dims:
                raise IndexMismatchError(
                    f"--reuse {d} was built with {m['encoder']['name']}, not {encoder}; "
                    "fix: reuse an index built with the same encoder, or drop --reuse"
                )
            db = sqlite3.connect(f"file:{(d / PASSAGES).resolve()}?mode=ro&immutable=1", uri=True)
            self.parts.append((Index.restore(str(d / VECTORS), view=True), db))
        self.reused = 0

    def lookup(self, chunks: Sequence[Chunk]) -> dict[int, np.ndarray]:
        """key -> float32 vector for the chunks found with identical text."""
        want = {c.key: c.text for c in chunks}
        found: dict[int, np.ndarray] = {}
        for index, db in self.parts:
            keys = [k for k in want if k not in found]
            if not keys:
                break
            sql = f"SELECT key, text FROM passages WHERE key IN ({','.join('?' * len(keys))})"
            same = [k for k, text in db.execute(sql, keys) if text == want[k]]
            if same:
                vecs = np.atleast_2d(np.stack(index.get(np.asarray(same, dtype=np.uint64), dtype=np.float32)))
                vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
                found.update(zip(same, vecs))
        self.reused += len(found)
        return found
