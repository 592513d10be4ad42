"""Reuse vectors from another index instead of encoding the same chunks again.

A chunk is reused when another index built with the same encoder holds the same key with the same
text (same corpus, article and offset): e.g. the vital-articles default index taken from a
vital-articles + wiki_pool index in seconds. The other index may be finished (vectors come back
at its stored precision) or still building (`DIR.partial`: its committed float32 vectors).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Sequence

import numpy as np

from targ_mlx.index.chunking import Chunk
from targ_mlx.index.encoder import TORCH, backend_of, canonical_name, family
from targ_mlx.index.errors import IndexMismatchError, IndexMissingError
from targ_mlx.index.store import BUILD_STATE, MANIFEST, PASSAGES, VECTORS, read_manifest, verify_files


def _in(keys: Sequence[int]) -> str:
    return ",".join("?" * len(keys))


def _expand_shards(dirs) -> list[Path]:
    """A sharded index (built with --ray) lends the vectors of each of its shards."""
    out = []
    for d in dirs:
        shards = read_manifest(d).get("shards", []) if (d / MANIFEST).is_file() else []
        out += [d / s for s in shards] or [d]
    return out


class VectorSource:
    """Stored vectors of other indexes, looked up by chunk key and checked against the text."""

    def __init__(self, dirs: Sequence[Path], encoder: str, dims: int, backend: str = TORCH):
        from usearch.index import Index

        self.parts: list[tuple[object, sqlite3.Connection]] = []
        for d in _expand_shards(map(Path, dirs)):
            if (d / MANIFEST).is_file():
                if not (d / VECTORS).is_file():
                    continue  # a BM25-only index (--no-dense): no vectors to lend
                m = read_manifest(d)
                verify_files(d, m)
                built, index = m["encoder"]["name"], Index.restore(str(d / VECTORS), view=True)
                built_backend = backend_of(m)
                if m["encoder"]["dims"] != dims:
                    built = f"{built} ({m['encoder']['dims']}-d)"
                db = sqlite3.connect(f"file:{(d / PASSAGES).resolve()}?mode=ro&immutable=1", uri=True)
            elif (d / BUILD_STATE).is_file():
                state = json.loads((d / BUILD_STATE).read_text())
                built, index, built_backend = state["encoder"], None, state.get("backend", TORCH)
                if not (d / PASSAGES).is_file():
                    continue  # stopped before its first commit: nothing to lend
                db = sqlite3.connect(f"file:{(d / PASSAGES).resolve()}?mode=ro", uri=True)
                if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'pending'").fetchone():
                    if not (d / VECTORS).is_file():
                        db.close()
                        continue
                    index = Index.restore(str(d / VECTORS), view=True)  # its graph is built: vectors there
            else:
                raise IndexMissingError(f"--reuse {d}: neither a finished index nor a build in progress; "
                                        "fix: pass an index folder or its .partial folder")
            if canonical_name(built) != canonical_name(encoder) or family(built_backend) != family(backend):
                raise IndexMismatchError(
                    f"--reuse {d} was built with {built} ({built_backend}), not {encoder} ({backend}); "
                    "fix: reuse an index built with the same encoder, or drop --reuse"
                )
            self.parts.append((index, db))

    def lookup(self, chunks: Sequence[Chunk]) -> dict[int, np.ndarray]:
        """key -> float32 vector for the chunks found with identical text."""
        want = {c.key: c.text for c in chunks}
        found: dict[int, np.ndarray] = {}
        for index, db in self.parts:
            keys = [k for k in want if k not in found]
            if not keys:
                break
            if index is None:  # a build in progress: its committed float32 vectors
                sql = f"SELECT p.key, p.text, v.vector FROM passages p JOIN pending v ON v.key = p.key WHERE p.key IN ({_in(keys)})"
                for k, text, blob in db.execute(sql, keys):
                    if text == want[k]:
                        found[k] = np.frombuffer(blob, dtype=np.float32).copy()
                continue
            same = [k for k, text in db.execute(f"SELECT key, text FROM passages WHERE key IN ({_in(keys)})", keys)
                    if text == want[k]]
            if same:
                vecs = np.atleast_2d(np.stack(index.get(np.asarray(same, dtype=np.uint64), dtype=np.float32)))
                vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
                found.update(zip(same, vecs))
        return found
