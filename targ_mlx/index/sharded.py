"""Serve a sharded index (built by `distributed.py`) as one `Retriever`.

Each shard is a complete index with its own memory-mapped graph and passage store. A query goes
to every shard's graph; the per-shard top-k lists are merged by score (a chunk stored in two
shards counts once) and only the k winners' passages are read, each from its own shard's store.
Several index folders are served the same way by `merged.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from targ_mlx.index.encoder import Encoder
from targ_mlx.index.query import QueryEncoding
from targ_mlx.index.store import manifest_id
from targ_mlx.retrieval import Passage, check_k


class ShardedRetriever(QueryEncoding):
    """Top-k passages over all shards of an index; thread-safe for concurrent searches."""

    def __init__(self, path: Path, manifest: dict, shards: list, encoder: Encoder | None = None):
        self.path = Path(path)
        self.manifest = manifest
        self.manifest_id = manifest_id(manifest)
        self.shards = shards  # IndexRetriever per shard, in manifest order
        self._encoder = encoder

    def __len__(self) -> int:
        return sum(len(s) for s in self.shards)

    def search_vectors(self, vectors: np.ndarray, k: int = 5, exact: bool = False) -> list[list[Passage]]:
        """Search with already-encoded, normalised query vectors (n, dims)."""
        check_k(k)
        vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
        n = len(vectors)
        keys, dists, owner = [], [], []
        for s, shard in enumerate(self.shards):
            found = shard.index.search(vectors, k, exact=exact)
            kk = np.atleast_2d(found.keys).astype(np.int64)
            counts = np.atleast_1d(getattr(found, "counts", kk.shape[1]))
            # slots past `counts` (a shard with fewer than k vectors) hold garbage: rank them last
            valid = np.arange(kk.shape[1])[None, :] < counts[:, None]
            dd = np.where(valid, np.atleast_2d(found.distances), np.inf).astype(np.float64)
            keys.append(kk), dists.append(dd), owner.append(np.full(kk.shape, s))
        keys, dists, owner = (np.concatenate(a, axis=1) for a in (keys, dists, owner))
        order = np.argsort(dists, axis=1, kind="stable")
        picks: list[list[tuple[int, int, float]]] = []
        wanted: dict[int, set[int]] = {}
        for i in range(n):
            seen, row = set(), []
            for j in order[i]:
                if len(row) == k or not np.isfinite(dists[i, j]):
                    break
                key = int(keys[i, j])
                if key in seen:
                    continue
                seen.add(key)
                row.append((int(owner[i, j]), key, float(dists[i, j])))
                wanted.setdefault(int(owner[i, j]), set()).add(key)
            picks.append(row)
        texts = {s: self.shards[s].passages(sorted(ks)) for s, ks in wanted.items()}
        return [
            [Passage(key, *texts[s][key], score=1.0 - dist) for s, key, dist in row if key in texts[s]]
            for row in picks
        ]

    def vectors(self, keys: Sequence[int]) -> np.ndarray:
        """The stored vectors of chunk keys, each from the shard that holds it (float32 (n, dims))."""
        out = np.zeros((len(keys), self.manifest["encoder"]["dims"]), dtype=np.float32)
        for shard in self.shards:
            rows = shard.passages(keys)  # which keys this shard holds
            idx = [i for i, k in enumerate(keys) if k in rows]
            if idx:
                out[idx] = shard.vectors([keys[i] for i in idx])
        return out

    def passages(self, keys: Sequence[int]) -> dict[int, tuple[str, str]]:
        """key -> (title, text), looked up in every shard."""
        out: dict[int, tuple[str, str]] = {}
        for shard in self.shards:
            out.update(shard.passages([k for k in keys if k not in out]))
        return out

    def close(self) -> None:
        for shard in self.shards:
            shard.close()
