"""Exact search over a few passages held in memory (numpy brute force, no index on disk)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from targ_mlx.index.encoder import Encoder, load_encoder
from targ_mlx.retrieval import Passage, check_k


class ExactRetriever:
    """Exact search over a few passages held in memory: numpy brute force, no index on disk.

    For tests, small corpora and as the ground truth the HNSW index is measured against. Keys are
    the passages' positions in the list given.
    """

    def __init__(self, passages: Sequence[tuple[str, str]], encoder=None):
        """Args:
        passages: (title, text) pairs, encoded once here.
        encoder: a `targ_mlx.index.Encoder`, a sentence-transformers model name, or None for
            the offline default all-MiniLM-L6-v2.
        """
        self.encoder = encoder if isinstance(encoder, Encoder) else load_encoder(encoder)
        self.titles = [t for t, _ in passages]
        self.texts = [x for _, x in passages]
        self.vectors = self.encoder.encode_passages(self.titles, self.texts)

    def __len__(self) -> int:
        return len(self.texts)

    def search(self, query: str, k: int = 5) -> list[Passage]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:
        check_k(k)
        if not queries:
            return []
        scores = self.encoder.encode_queries(queries) @ self.vectors.T
        k = min(k, len(self.texts))
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return [
            [Passage(int(i), self.titles[i], self.texts[i], float(row[i])) for i in idx]
            for row, idx in zip(scores, top)
        ]
