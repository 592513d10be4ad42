"""What the answer path needs from retrieval: a `Retriever` protocol and its `Passage`.

The usearch on-disk index (`targ_mlx.index`) and the small exact in-memory retriever
(`targ_mlx.index.exact`) both implement `Retriever`; the assistant knows nothing else about how
passages are found. This module imports nothing from `targ_mlx.index`: the index depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

# Reciprocal rank fusion's constant (Cormack et al., 2009): a passage ranked r-th (from 1) in a
# list scores 1 / (RRF_C + r); 60 is the paper's value, not tuned here (10 scored within 0.01 on
# TREC CAsT: docs/archive/benchmarks-journal.md, "Standalone retrieval queries").
RRF_C = 60
FUSE_DEPTH = 20  # passages taken from each ranking before fusing
# How an index with a BM25 part is searched (`--retriever`): vectors, BM25, or both fused by rank
RETRIEVERS = ("dense", "bm25", "hybrid")
RETRIEVER_HELP = ("how the index is searched: dense vectors, bm25, or hybrid (both, fused by rank; on a BM25-only "
                  "index, BM25's top 20 re-ordered by cosine). Default: hybrid on a BM25-only index and on an "
                  "index of 100k passages or more with both parts, else dense")


@dataclass(frozen=True)
class Passage:
    """One retrieved chunk of an article."""

    key: int  # stable chunk id (the usearch key)
    title: str
    text: str
    score: float  # inner product of normalised vectors (cosine); higher is closer
    bm25: float | None = None  # its BM25 score for the query, when the index has a BM25 part (hybrid.py)

    def format(self) -> str:
        """The paper's context format: `[title] text`."""
        return f"[{self.title}] {self.text}"


@runtime_checkable
class Retriever(Protocol):
    def search(self, query: str, k: int = 5) -> list[Passage]: ...

    def search_batch(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]: ...


@runtime_checkable
class FusingRetriever(Retriever, Protocol):
    """A retriever that fuses several queries' rankings itself, for less work than fusing their
    full searches (`search_fused`)."""

    def search_fused(self, queries: Sequence[str], k: int, weights: Sequence[float] | None = None,
                     keep: int = 0) -> list[Passage]: ...


DRAFT_QUERY_WORDS = 32  # of the closed-book draft added to the question in its search route
# The question's own top passages that lead a fusion with the draft's route (`fuse`'s keep): with
# none kept, passages both rankings hold half-way down pushed the question's own 2nd out of the
# top 5 for a wrong draft; keeping 3 left the wrong drafts' hit@5 at or above the question's alone
# (chosen with the route's weight on dev halves: scripts/bench/bench_draft_route.py, BENCHMARKS.md)
DRAFT_KEEP = 3


def draft_query(question: str, draft: str) -> str:
    """The draft's search route (generation-augmented retrieval): the question with what the model
    said before any search, so a ranking can find the article that names its answer. It is
    fused beside the question's own ranking (`fuse`), never in its place: a wrong draft may
    only add a ranking, not remove the question's."""
    words = draft.split()[:DRAFT_QUERY_WORDS]
    return f"{question} {' '.join(words)}".strip()


def check_k(k: int) -> None:
    """Every retriever's one check on how many passages it is asked for."""
    if k <= 0:
        raise ValueError(f"k must be a positive number of passages, got {k}")


def fuse(rankings: Sequence[Sequence[Passage]], k: int, c: int = RRF_C,
         weights: Sequence[float] | None = None, keep: int = 0) -> list[Passage]:
    """The top `k` of several rankings of one index by reciprocal rank fusion: each passage scores
    the sum of weight / (c + rank) over the rankings it is in (weights: 1 each unless given; ties:
    first seen first). A passage keeps its own cosine `score`; the fused order is by rank, since
    the queries' cosines differ in scale. With `keep`, the first ranking's top `keep` come first
    whatever the others say: a passage found by two weak rankings cannot push out what the
    question itself ranks highest (RRF alone lets one at rank 14 and 4 beat one at rank 2)."""
    fused: dict[int, float] = {}
    first: dict[int, Passage] = {}
    for ranking, weight in zip(rankings, weights or [1.0] * len(rankings)):
        for rank, p in enumerate(ranking, start=1):
            fused[p.key] = fused.get(p.key, 0.0) + weight / (c + rank)
            first.setdefault(p.key, p)
    order = sorted(fused, key=lambda key: -fused[key])  # stable: ties stay in first-seen order
    if keep and rankings:  # the first ranking's top `keep` lead, in its own order
        lead = [p.key for p in rankings[0][:keep]]
        order = lead + [key for key in order if key not in set(lead)]
    return [first[key] for key in order[:k]]


def search_fused(retriever: Retriever, queries: Sequence[str], k: int,
                 weights: Sequence[float] | None = None, keep: int = 0) -> list[Passage]:
    """The top `k` for one query, or for several queries of one question their rankings
    (FUSE_DEPTH deep) fused by `fuse` with `weights` (1 each unless given) and `keep`. A retriever with a
    `search_fused` of its own (`FusingRetriever`; hybrid.py: passages only BM25 found get their
    cosine after the fusion, for the k it returns) answers the same with less work."""
    if len(queries) == 1:
        return retriever.search(queries[0], k)
    if isinstance(retriever, FusingRetriever):
        return retriever.search_fused(queries, k, weights, keep)
    return fuse(retriever.search_batch(queries, max(k, FUSE_DEPTH)), k, weights=weights, keep=keep)
