"""One or several index folders (e.g. Wikipedia and your notes) as one `Retriever`, dense,
BM25 or hybrid (`hybrid.py`).

Dense: those built with the same encoder become the shards of one `ShardedRetriever` (the query
is encoded once); indexes with other encoders are searched each with its own and merged by
score. BM25 and hybrid: one `HybridRetriever` over all the folders, each with its BM25 part.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from targ_mlx.index.encoder import backend_of, canonical_name, family
from targ_mlx.index.errors import IndexError_, IndexMismatchError, IndexMissingError
from targ_mlx.index.hybrid import DENSE, HYBRID, MODES, HybridRetriever
from targ_mlx.index.lexical import fix_command, has_lexical, open_lexical
from targ_mlx.index.retriever import open_retriever
from targ_mlx.index.swap import survives_swap
from targ_mlx.index.sharded import ShardedRetriever
from targ_mlx.index.store import manifest_id, read_manifest
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


# From this many passages (all folders together) hybrid is the default where every folder has both
# parts. On held-out questions (scripts/archive/probe_fusion.py; BENCHMARKS.md, rows "hybrid vs dense") fusing BM25
# in lost 1-2.4 points of hit@5 over the Vital leads (9,554 passages) and the clean corpus (21,716),
# and gained 0.6 / 3.4 / 2.0 (NQ-Open / TriviaQA / PopQA) over the large corpus (994,419). Between
# the two sizes nothing was measured; 100k sits between them.
# A BM25-only index is searched hybrid too (BM25's top 20 re-ordered by fusing in their cosine
# order): over the large corpus it puts an answer in the top 5 more often (hit@5 +4 / +2 / +3 on
# held-out questions; BENCHMARKS.md, "BM25 top 20 re-ordered by cosine"), answers as well as BM25's
# top 5 (results/reader.md, "BM25's top 20 re-ordered by cosine"), and costs ~0.2 s more a search on
# 2 AMX cores (BENCHMARKS.md, "search latency over the large BM25 index, Xeon 207").
HYBRID_FROM = 100_000


def retriever_mode(paths: Sequence[Path | str], wanted: str | None) -> str:
    """`wanted`, checked; None: hybrid where a folder has no vectors (a BM25-only index: its BM25
    top 20 re-ordered by cosine) or where the folders have both parts and hold HYBRID_FROM passages
    or more, dense otherwise."""
    if wanted is not None and wanted not in MODES:
        raise ValueError(f"--retriever {wanted!r} is not one of {', '.join(MODES)}; fix: pick one of them")
    lacking = [Path(p) for p in paths if not has_lexical(Path(p))]
    manifests = [_finished_manifest(Path(p)) for p in paths]  # read once: vectors and size
    no_vectors = [Path(p) for p, m in zip(paths, manifests) if m is not None and m["build"].get("dense", True) is False]
    if no_vectors and wanted == DENSE:
        raise IndexMismatchError(f"{no_vectors[0]} is a BM25-only index (built with --no-dense); "
                                 "fix: --retriever bm25 (or hybrid: BM25's top passages re-ordered by cosine)")
    if wanted is None:
        return HYBRID if not lacking and (no_vectors or _passages(manifests) >= HYBRID_FROM) else DENSE
    if wanted != DENSE and lacking:
        raise IndexMissingError(
            f"{lacking[0]} has no BM25 part for --retriever {wanted}; fix: {fix_command(lacking[0])} "
            "(or --retriever dense)")
    return wanted


def _passages(manifests: Sequence[dict | None]) -> int:
    try:
        return sum(m["counts"]["passages"] for m in manifests)
    except (TypeError, KeyError):
        return 0  # a folder not a finished index (None): open_retriever says what is wrong with it


def _finished_manifest(path: Path) -> dict | None:
    try:
        return read_manifest(path)
    except IndexError_:
        return None  # not a finished index: open_retriever says what is wrong with it


@survives_swap
def _open_both(path: Path | str, expansion_search: int | None = None) -> tuple:
    """One folder's dense part and BM25 part, from the same publish: a swap between the two opens
    (an `add` publishing the folder) opens both again, so the texts and the BM25 keys agree."""
    return open_retriever(path, expansion_search=expansion_search), open_lexical(Path(path))


def open_indexes(paths: Sequence[Path | str], expansion_search: int | None = None, retriever: str | None = None):
    """One `Retriever` over several index folders (one folder: `open_retriever`'s own, or its
    hybrid/BM25 form).

    Args:
        retriever: "dense", "bm25" or "hybrid"; None: `retriever_mode`'s choice (hybrid for BM25-only
            indexes and from HYBRID_FROM passages, else dense).
    Its `manifest_id` names the combination, so the decision log tells which indexes answered.
    """
    if not paths:
        raise ValueError("open_indexes needs at least one index folder")
    mode = retriever_mode(paths, retriever)
    if mode != DENSE:
        parts = [_open_both(p, expansion_search) for p in paths]
        opened = [r for r, _ in parts]
        combined = opened[0].manifest_id if len(opened) == 1 else manifest_id(
            {"indexes": sorted(r.manifest_id for r in opened)})
        hybrid = HybridRetriever(parts, mode, combined)
        hybrid.paths = [Path(p) for p in paths]
        return hybrid
    opened = [open_retriever(p, expansion_search=expansion_search) for p in paths]
    if len(opened) == 1:
        opened[0].paths = [Path(paths[0])]
        return opened[0]
    groups: dict[tuple, list] = {}
    for r in opened:
        enc = r.manifest["encoder"]
        key = (canonical_name(enc["name"]), family(backend_of(r.manifest)), enc["dims"])
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
