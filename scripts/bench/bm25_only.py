"""BM25's rankings of an index with their texts and no cosine: for benches that need only what a
search returns and in what order (a BM25-only index otherwise encodes every passage it returns
for its cosine: seconds per question at depth 20). The order is the one `--retriever bm25`
returns."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from targ_mlx.index import open_retriever
from targ_mlx.index.lexical import open_lexical
from targ_mlx.retrieval import Passage


class BM25Only:
    def __init__(self, index: str | Path):
        self.texts, self.lex = open_retriever(index), open_lexical(Path(index))

    def search_batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        ranked = self.lex.search(list(queries), k)
        text = self.texts.passages([key for rs in ranked for key, _ in rs])
        return [[Passage(key, *text[key], 0.0, score) for key, score in rs if key in text] for rs in ranked]
