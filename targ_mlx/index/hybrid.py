"""Dense + BM25 over one or several indexes, as one `Retriever`: `--retriever bm25 | hybrid`.

Hybrid fuses two rankings, each FUSE_DEPTH deep, by reciprocal rank, as the follow-up fusion
does (`retrieval.fuse`): cosines and BM25 scores have no common scale, ranks do. Over several
index folders (Wikipedia and your notes) each ranking is first merged across the folders by its
own score (cosine with cosine, BM25 with BM25), so a folder's best passage does not win a place
just for being first in its own folder. Every passage returned, whichever ranking found it,
carries both raw scores: `score`, the cosine of the query and passage vectors (read back from the
stored vector for a passage only BM25 found, or encoded now in a BM25-only index, so a
search-first gate sees one similarity scale in every mode), and `bm25`. The fused rank is its
position.

A BM25-only index (built --no-dense) has no vectors to search, so there hybrid's dense ranking is
BM25's own top FUSE_DEPTH re-ordered by cosine, their passages encoded at search time: the same
fusion over a shorter dense list (each search encodes FUSE_DEPTH passages, not the 5 it returns).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from targ_mlx.index.lexical import LexicalIndex
from targ_mlx.retrieval import FUSE_DEPTH, RETRIEVERS, Passage, check_k, fuse

DENSE, BM25, HYBRID = RETRIEVERS
MODES = RETRIEVERS


@dataclass(frozen=True)
class _Hit:
    """A BM25 hit before it has text or cosine: which folder holds it, and its score."""

    part: int
    key: int
    bm25: float


class HybridRetriever:
    """Folders, each a dense retriever (IndexRetriever / ShardedRetriever) with its BM25 part."""

    def __init__(self, parts: Sequence[tuple[object, LexicalIndex]], mode: str = HYBRID, manifest_id: str | None = None):
        if mode not in (BM25, HYBRID):
            raise ValueError(f"HybridRetriever mode must be {BM25} or {HYBRID}, got {mode!r}")
        if not parts:
            raise ValueError("HybridRetriever needs at least one index")
        self.parts = list(parts)
        self.mode = mode
        first = self.parts[0][0]
        self.path, self.manifest = first.path, first.manifest
        # the log names what answered: the same passages under another ranking are another source
        self.manifest_id = f"{manifest_id or first.manifest_id}+{mode}"

    def __len__(self) -> int:
        return sum(len(dense) for dense, _ in self.parts)

    @property
    def encoder(self):
        return self.parts[0][0].encoder

    def search(self, query: str, k: int = 5) -> list[Passage]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:
        check_k(k)
        if not queries:
            return []
        vecs, ranked = self._ranked(queries, k)
        self._complete(ranked, vecs)
        return [[replace(p, bm25=bm25[p.key]) for p in found if not np.isnan(p.score)] for found, bm25, _ in ranked]

    def search_fused(self, queries: Sequence[str], k: int, weights: Sequence[float] | None = None,
                     keep: int = 0) -> list[Passage]:
        """What `retrieval.search_fused` returns for several queries of one question (each ranked
        FUSE_DEPTH deep, fused by rank), with text and cosine looked up or encoded for the fused
        top `k` only: a BM25-only folder encodes k passages, not FUSE_DEPTH per query. Each keeps
        the cosine and BM25 score of the first query whose ranking holds it, as `fuse` keeps the
        first-seen passage."""
        check_k(k)
        if not queries:  # as search_batch: nothing asked, nothing encoded
            return []
        vecs, ranked = self._ranked(queries, max(k, FUSE_DEPTH))
        top = fuse([found for found, _, _ in ranked], k, weights=weights, keep=keep)
        first: dict[int, int] = {}
        for i, (found, _, _) in enumerate(ranked):
            for p in found:
                first.setdefault(p.key, i)
        mine = [([p for p in top if first[p.key] == i], bm25, owner) for i, (_, bm25, owner) in enumerate(ranked)]
        self._complete(mine, vecs)
        done = {p.key: replace(p, bm25=bm25[p.key]) for found, bm25, _ in mine for p in found}
        return [done[p.key] for p in top if not np.isnan(done[p.key].score)]

    def _ranked(self, queries: Sequence[str], k: int):
        """(the queries' vectors per folder, each query's `_rank`): the top `k` of each ranking,
        a passage only BM25 found still a bare key."""
        depth = max(k, FUSE_DEPTH)
        vecs = [np.atleast_2d(dense.encoder.encode_queries(queries)).astype(np.float32) for dense, _ in self.parts]
        dense = [[[] for _ in queries] for _ in self.parts]
        if self.mode == HYBRID:
            for part, ((retriever, lex), v) in enumerate(zip(self.parts, vecs)):
                dense[part] = (retriever.search_vectors(v, depth) if retriever.index is not None
                               else self._by_cosine(retriever, lex, queries, v, depth))
        return vecs, [self._rank(q, [d[i] for d in dense], k, depth) for i, q in enumerate(queries)]

    @staticmethod
    def _by_cosine(retriever, lex: LexicalIndex, queries: Sequence[str], vecs: np.ndarray, depth: int):
        """A BM25-only folder's dense ranking: per query, its BM25 top `depth` by cosine (one
        encoder call for the whole batch's passages). `_rank` searches BM25 again, query by query:
        the encoding here costs far more than a second search."""
        tops = [[key for key, _ in row] for row in lex.search(queries, depth)]
        keys = list(dict.fromkeys(key for top in tops for key in top))
        texts = retriever.passages(keys)
        keys = [key for key in keys if key in texts]
        rows = dict(zip(keys, retriever.vectors(keys))) if keys else {}
        return [sorted((Passage(key, *texts[key], score=float(rows[key] @ v)) for key in top if key in rows),
                       key=lambda p: -p.score) for top, v in zip(tops, vecs)]

    def _rank(self, query: str, dense: list[list[Passage]], k: int, depth: int):
        """(top k, each key's BM25, the folder of each BM25-only hit) for one query; a hit only BM25
        found is a bare key (no text, cosine NaN) until `_complete` fills it in."""
        by_cosine = sorted((p for rows in dense for p in rows), key=lambda p: -p.score)[:depth]
        hits = sorted(self._bm25_hits(query, depth if self.mode == HYBRID else k), key=lambda h: -h.bm25)[:depth]
        have = {p.key: p for p in by_cosine}
        lexical = [have.get(h.key) or Passage(h.key, "", "", float("nan")) for h in hits]
        top = fuse([by_cosine, lexical], k) if self.mode == HYBRID else lexical[:k]
        bm25 = {h.key: h.bm25 for h in hits}
        below = [p.key for p in top if p.key not in bm25]  # found by the dense ranking, below BM25's top
        if below:  # their BM25 scores too, from whichever folder holds them
            scored = [lex.score_keys(query, below) for _, lex in self.parts]
            bm25.update((key, max(s[i] for s in scored)) for i, key in enumerate(below))
        return top, bm25, {h.key: h.part for h in hits}

    def _complete(self, ranked, vecs: list[np.ndarray]) -> None:
        """Text and cosine for every BM25-only hit that made a top k, one lookup (or one encoder
        call, in a BM25-only index) per folder for the whole batch."""
        for part, (retriever, _) in enumerate(self.parts):
            want = [(i, j, p.key) for i, (top, _, owner) in enumerate(ranked) for j, p in enumerate(top)
                    if np.isnan(p.score) and owner.get(p.key) == part]
            if not want:
                continue
            keys = list(dict.fromkeys(key for _, _, key in want))
            texts = retriever.passages(keys)
            keys = [key for key in keys if key in texts]
            rows = dict(zip(keys, retriever.vectors(keys))) if keys else {}
            for i, j, key in want:
                if key in rows:
                    ranked[i][0][j] = Passage(key, *texts[key], score=float(rows[key] @ vecs[part][i]))

    def _bm25_hits(self, query: str, depth: int) -> list[_Hit]:
        """The `depth` best BM25 passages of each folder."""
        return [_Hit(part, key, score) for part, (_, lex) in enumerate(self.parts)
                for key, score in lex.search([query], depth)[0]]

    def passages(self, keys):
        out = {}
        for retriever, _ in self.parts:
            out.update(retriever.passages([k for k in keys if k not in out]))
        return out

    def close(self) -> None:
        for retriever, _ in self.parts:
            retriever.close()
