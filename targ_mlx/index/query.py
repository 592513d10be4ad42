"""Text search shared by the single and the sharded retriever: the query encoder, loaded on first
use and checked against the manifest, in front of each retriever's `search_vectors`."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from targ_mlx.index.encoder import Encoder, load_encoder, query_backend
from targ_mlx.retrieval import Passage


class QueryEncoding:
    """Shared by the single and the sharded retriever: the query encoder, loaded on first use
    (once per process) and checked against the manifest, and text search over `search_vectors`."""

    path: Path
    manifest: dict
    _encoder: Encoder | None

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            enc = load_encoder(self.manifest["encoder"]["name"], backend=query_backend(self.manifest))
            enc.check_matches(self.manifest, str(self.path))
            self._encoder = enc
        return self._encoder

    def search(self, query: str, k: int = 5) -> list[Passage]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:
        if not queries:
            return []
        return self.search_vectors(self.encoder.encode_queries(queries), k)

    def search_vectors(self, vectors: np.ndarray, k: int = 5, exact: bool = False) -> list[list[Passage]]:
        raise NotImplementedError
