"""Several index folders (e.g. Wikipedia and your notes) as one `Retriever`.

Those built with the same encoder become the shards of one `ShardedRetriever` (the query is
encoded once); indexes with other encoders are searched each with its own and merged by score.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from targ_mlx.index.encoder import backend_of, canonical_name
from targ_mlx.index.retriever import open_retriever
from targ_mlx.index.sharded import ShardedRetriever
from targ_mlx.index.store import manifest_id
from targ_mlx.retrieval import Passage


class MergedRetriever:
    """Indexes built with different encoders: each searched with its own, top-k merged by score."""

    def __init__(self, parts: list, manifest_id: str):
        self.parts = parts
        self.manifest_id = manifest_id

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def search(self, query: str, k: int = 5) -> list[Passage]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:
        found = [p.search_batch(queries, k) for p in self.parts]
        merged = []
        for rows in zip(*found):
            best = {}
            for p in sorted((p for row in rows for p in row), key=lambda p: -p.score):
                best.setdefault(p.key, p)
            merged.append(list(best.values())[:k])
        return merged

    def close(self) -> None:
        for p in self.parts:
            p.close()


def open_indexes(paths: Sequence[Path | str], expansion_search: int | None = None):
    """One `Retriever` over several index folders (one folder: `open_retriever`'s own).

    Its `manifest_id` names the combination, so the decision log tells which indexes answered.
    """
    if not paths:
        raise ValueError("open_indexes needs at least one index folder")
    opened = [open_retriever(p, expansion_search=expansion_search) for p in paths]
    if len(opened) == 1:
        opened[0].paths = [Path(paths[0])]
        return opened[0]
    groups: dict[tuple, list] = {}
    for r in opened:
        enc = r.manifest["encoder"]
        key = (canonical_name(enc["name"]), backend_of(r.manifest), enc["dims"])
        groups.setdefault(key, []).extend(getattr(r, "shards", [r]))
    combined = manifest_id({"indexes": sorted(r.manifest_id for r in opened)})
    parts = []
    for shards in groups.values():
        part = ShardedRetriever(shards[0].path, shards[0].manifest, shards)
        part.manifest_id = combined
        parts.append(part)
    merged = parts[0] if len(parts) == 1 else MergedRetriever(parts, combined)
    merged.paths = [Path(p) for p in paths]  # what the app's `/index add` extends
    return merged
