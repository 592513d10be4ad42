"""What the answer path needs from retrieval: a `Retriever` protocol and its `Passage`.

The usearch on-disk index (`targ_mlx.index`) and the small exact in-memory retriever
(`targ_mlx.index.exact`) both implement `Retriever`; the assistant knows nothing else about how
passages are found. This module imports nothing from `targ_mlx.index`: the index depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class Passage:
    """One retrieved chunk of an article."""

    key: int  # stable chunk id (the usearch key)
    title: str
    text: str
    score: float  # inner product of normalised vectors (cosine); higher is closer

    def format(self) -> str:
        """The paper's context format: `[title] text`."""
        return f"[{self.title}] {self.text}"


@runtime_checkable
class Retriever(Protocol):
    def search(self, query: str, k: int = 5) -> list[Passage]: ...

    def search_batch(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]: ...
