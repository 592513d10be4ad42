"""The BM25 part as indexes built before Tantivy hold it: bm25s's eager sparse matrix.

Kept so those indexes still open and search (kind "bm25s" in lexical.json; `python -m
targ_mlx.index lexical DIR` rebuilds one with Tantivy), and so the benchmark that chose Tantivy
(`scripts/bench/bench_lexical.py`) can build both side by side. Its build holds every token of
the corpus in memory (4.47 GB peak at a million chunks): no new index is built with it.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from targ_mlx.index.lexical_files import Row, passage_text, publish

KEYS = "keys.npy"
# bm25s's defaults for Lucene's BM25 variant (Robertson k1/b as Lucene ships them), not tuned here
K1, B = 1.5, 0.75
STOPWORDS = "en"
STEMMER = "english"  # Snowball, via PyStemmer
_BATCH = 20_000  # passages tokenized per call: bounds the strings held at once


def _bm25s():
    import bm25s

    # bm25s sets its own logger to DEBUG on import: its lines would show in our CLI output
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def _stemmer():
    import Stemmer

    return Stemmer.Stemmer(STEMMER)


def build_bm25s(rows: Iterable[Row], out: Path) -> dict:
    """Index (key, title, text) rows, keys ascending, into folder `out` the way indexes were built
    before Tantivy (for side-by-side benchmarks only)."""
    bm25s = _bm25s()
    from bm25s.tokenization import Tokenized, Tokenizer

    t0 = time.perf_counter()
    tok = Tokenizer(stopwords=STOPWORDS, stemmer=_stemmer())
    keys: list[int] = []
    ids: list[list[int]] = []
    rows = iter(rows)
    while batch := list(itertools.islice(rows, _BATCH)):
        keys.extend(k for k, _, _ in batch)
        ids.extend(tok.tokenize([passage_text(t, x) for _, t, x in batch], update_vocab=True,
                                return_as="ids", show_progress=False))
    if not keys:
        raise ValueError("no passages to index")
    model = bm25s.BM25(k1=K1, b=B)
    model.index(Tokenized(ids=ids, vocab=tok.get_vocab_dict()), show_progress=False)
    del ids
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(str(tmp), show_progress=False)
    np.save(tmp / KEYS, np.asarray(keys, dtype=np.int64))
    return publish(tmp, out, {"format": 1, "kind": "bm25s", "k1": K1, "b": B, "method": model.method,
                              "stopwords": STOPWORDS, "stemmer": STEMMER, "passages": len(keys),
                              "vocabulary": len(model.vocab_dict), "build_s": round(time.perf_counter() - t0, 2)})


@dataclass
class Bm25sIndex:
    """A memory-mapped bm25s index: every passage's BM25 is one sparse column sum."""

    path: Path
    meta: dict
    model: object  # bm25s.BM25
    keys: np.ndarray  # row -> chunk key, ascending

    @classmethod
    def open(cls, folder: Path, meta: dict) -> "Bm25sIndex":
        model = _bm25s().BM25.load(str(folder), mmap=True, show_progress=False)
        return cls(folder, meta, model, np.load(folder / KEYS, mmap_mode="r"))

    def __len__(self) -> int:
        return len(self.keys)

    def _scores(self, query: str) -> np.ndarray:
        """BM25 of every passage for `query` (row order; zeros when no term is known)."""
        toks = _bm25s().tokenize([query], stopwords=STOPWORDS, stemmer=_stemmer(), return_ids=False,
                                 show_progress=False)[0]
        toks = [t for t in toks if t in self.model.vocab_dict]  # unknown terms cannot score
        if not toks:
            return np.zeros(len(self.keys), dtype=np.float32)
        return np.asarray(self.model.get_scores(toks), dtype=np.float32)

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        out = []
        for q in queries:
            s = self._scores(q)
            out.append([(int(self.keys[i]), float(s[i])) for i in top_rows(s, k)])
        return out

    def score_keys(self, query: str, keys: Sequence[int]) -> list[float]:
        s = self._scores(query)
        rows = np.searchsorted(self.keys, np.asarray(keys, dtype=np.int64))
        return [float(s[r]) if r < len(self.keys) and int(self.keys[r]) == k else 0.0 for r, k in zip(rows, keys)]


def top_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Rows of the `k` highest scores, best first (ties by row), zero scores left out."""
    if not len(scores):
        return np.arange(0)
    top = np.argpartition(-scores, min(k, len(scores)) - 1)[:k] if len(scores) > k else np.arange(len(scores))
    top = top[np.argsort(-scores[top], kind="stable")]
    return top[scores[top] > 0]
