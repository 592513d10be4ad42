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
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from targ_mlx.index.lexical import LexicalIndex, top_rows
from targ_mlx.retrieval import FUSE_DEPTH, RETRIEVERS, Passage, fuse

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
        if k <= 0:
            raise ValueError(f"k must be a positive number of passages, got {k}")
        if not queries:
            return []
        depth = max(k, FUSE_DEPTH)
        vecs = [np.atleast_2d(dense.encoder.encode_queries(queries)).astype(np.float32) for dense, _ in self.parts]
        dense = ([dense.search_vectors(v, depth) for (dense, _), v in zip(self.parts, vecs)]
                 if self.mode == HYBRID else [[[] for _ in queries] for _ in self.parts])
        return [self._one(q, [v[i] for v in vecs], [d[i] for d in dense], k, depth)
                for i, q in enumerate(queries)]

    def _one(self, query: str, vecs: list[np.ndarray], dense: list[list[Passage]], k: int, depth: int) -> list[Passage]:
        by_cosine = sorted((p for rows in dense for p in rows), key=lambda p: -p.score)[:depth]
        scores = [lex.scores(query) for _, lex in self.parts]  # every passage's BM25, per folder
        hits = sorted(self._bm25_hits(scores, depth if self.mode == HYBRID else k), key=lambda h: -h.bm25)[:depth]
        bm25 = {h.key: h.bm25 for h in hits}
        have = {p.key: p for p in by_cosine}
        # a BM25 hit the dense ranking lacks is a bare key until it wins a place in the top k
        lexical = [have.get(h.key) or Passage(h.key, "", "", float("nan")) for h in hits]
        ranked = fuse([by_cosine, lexical], k) if self.mode == HYBRID else lexical[:k]
        owner = {h.key: h.part for h in hits}
        for part, (retriever, _) in enumerate(self.parts):
            missing = [p.key for p in ranked if p.key not in have and owner.get(p.key) == part]
            if missing:  # its text, and its cosine from the stored vector (or encoded now: BM25-only index)
                texts = retriever.passages(missing)
                found = [key for key in missing if key in texts]
                cos = retriever.vectors(found) @ vecs[part] if found else []
                have.update({key: Passage(key, *texts[key], score=float(c)) for key, c in zip(found, cos)})
        ranked = [have[p.key] for p in ranked if p.key in have]
        for p in ranked:  # a passage the dense ranking found and BM25 ranked below its top: its score too
            if p.key not in bm25:
                bm25[p.key] = max(lex.scores_of(s, [p.key])[0] for (_, lex), s in zip(self.parts, scores))
        return [replace(p, bm25=bm25[p.key]) for p in ranked]

    def _bm25_hits(self, scores: list[np.ndarray], depth: int) -> list[_Hit]:
        """The `depth` best BM25 passages of each folder."""
        return [_Hit(part, int(lex.keys[r]), float(s[r]))
                for part, ((_, lex), s) in enumerate(zip(self.parts, scores)) for r in top_rows(s, depth)]

    def passages(self, keys):
        out = {}
        for retriever, _ in self.parts:
            out.update(retriever.passages([k for k in keys if k not in out]))
        return out

    def close(self) -> None:
        for retriever, _ in self.parts:
            retriever.close()
