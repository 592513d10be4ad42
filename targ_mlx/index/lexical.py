"""BM25 beside the dense index: a lexical ranking of the same passages, in DIR/bm25/.

Dense search misses what a name or a rare word finds (a Wikipedia question is mostly names), and
BM25 misses paraphrase; fusing the two rankings (`hybrid.py`) beats either. The scores are
bm25s's eager sparse matrix (one column of precomputed BM25 weights per term), saved with
`numpy.save` and memory-mapped on open, so a million passages open in milliseconds and a query
costs one sparse column sum. Passages are indexed in key order; `keys.npy` maps a row back to the
chunk key the dense index and passages.db use.

The folder is written under DIR/bm25.tmp and renamed when complete; its own `lexical.json` lists
every file's size and sampled checksum, so a missing or truncated file is caught on open.
"""

from __future__ import annotations

import itertools
import logging
import json
import os
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from targ_mlx.index.errors import IndexCorruptError, IndexMissingError
from targ_mlx.index.store import PASSAGES, sample_checksum, write_json_atomic

LEXICAL = "bm25"  # the folder inside an index
META = "lexical.json"
KEYS = "keys.npy"
FORMAT = 1
# bm25s's defaults for Lucene's BM25 variant (Robertson k1/b as Lucene ships them), not tuned here
K1, B = 1.5, 0.75
STOPWORDS = "en"
STEMMER = "english"  # Snowball, via PyStemmer
_BATCH = 20_000  # passages tokenized per call: bounds the strings held at once


def lexical_dir(index: Path) -> Path:
    return Path(index) / LEXICAL


def has_lexical(index: Path) -> bool:
    return (lexical_dir(index) / META).is_file()


def lexical_summary(index: Path) -> dict | None:
    """lexical.json of an index's BM25 part, None when it has none."""
    try:
        return json.loads((lexical_dir(index) / META).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def fix_command(index: Path) -> str:
    return f"python -m targ_mlx.index lexical {index}"


def _bm25s():
    import bm25s

    # bm25s sets its own logger to DEBUG on import: its lines would show in our CLI output
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def _stemmer():
    import Stemmer

    return Stemmer.Stemmer(STEMMER)


def _tokenizer():
    from bm25s.tokenization import Tokenizer

    return Tokenizer(stopwords=STOPWORDS, stemmer=_stemmer())


def passage_text(title: str, text: str) -> str:
    """What BM25 sees of a passage: the article title counts, as it does for the reader."""
    return f"{title} {text}" if title else text


def build_lexical(rows: Iterable[tuple[int, str, str]], out: Path,
                  progress: Callable[[int], None] | None = None) -> dict:
    """Index (key, title, text) rows, keys ascending, into folder `out` (replaced when complete).

    Returns the summary kept in lexical.json (and the index manifest's "lexical").
    """
    bm25s = _bm25s()
    from bm25s.tokenization import Tokenized

    t0 = time.perf_counter()
    tok = _tokenizer()
    keys: list[int] = []
    ids: list[list[int]] = []
    rows = iter(rows)
    while batch := list(itertools.islice(rows, _BATCH)):
        keys.extend(k for k, _, _ in batch)
        ids.extend(tok.tokenize([passage_text(t, x) for _, t, x in batch], update_vocab=True,
                                return_as="ids", show_progress=False))
        if progress:
            progress(len(keys))
    if not keys:
        raise ValueError("no passages to index")
    if any(a >= b for a, b in zip(keys, keys[1:])):
        raise ValueError("build_lexical needs the rows in ascending key order")
    model = bm25s.BM25(k1=K1, b=B)
    model.index(Tokenized(ids=ids, vocab=tok.get_vocab_dict()), show_progress=False)
    del ids
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(str(tmp), show_progress=False)
    np.save(tmp / KEYS, np.asarray(keys, dtype=np.int64))
    meta = {
        "format": FORMAT, "kind": "bm25s", "k1": K1, "b": B, "method": model.method,
        "stopwords": STOPWORDS, "stemmer": STEMMER, "passages": len(keys),
        "vocabulary": len(model.vocab_dict), "build_s": round(time.perf_counter() - t0, 2),
        "files": {f.name: {"bytes": f.stat().st_size, "sample_sha256": sample_checksum(f)}
                  for f in sorted(tmp.iterdir())},
    }
    write_json_atomic(tmp / META, meta)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return {k: v for k, v in meta.items() if k != "files"}


def passage_rows(db_paths: Sequence[Path]) -> Iterable[tuple[int, str, str]]:
    """(key, title, text) of every passage in the given passages.db files, keys ascending, each
    key once (a chunk stored in two shards counts once)."""
    import heapq

    conns = [sqlite3.connect(f"file:{p}?mode=ro", uri=True) for p in db_paths]
    try:
        streams = [c.execute("SELECT key, title, text FROM passages ORDER BY key") for c in conns]
        last = None
        for row in heapq.merge(*streams, key=lambda r: r[0]):
            if row[0] != last:
                last = row[0]
                yield row
    finally:
        for c in conns:
            c.close()


def index_databases(index: Path) -> list[Path]:
    """The passages.db files of an index folder (one per shard of a Ray build)."""
    manifest = json.loads((Path(index) / "manifest.json").read_text())
    return [Path(index) / s / PASSAGES for s in manifest["shards"]] if "shards" in manifest else [Path(index) / PASSAGES]


def add_lexical(index: Path, progress: Callable[[int], None] | None = None) -> dict:
    """Build (or rebuild) the BM25 part of a finished index folder from its passages."""
    index = Path(index)
    return build_lexical(passage_rows(index_databases(index)), lexical_dir(index), progress)


@dataclass
class LexicalIndex:
    """A memory-mapped BM25 index: `search` returns (chunk key, BM25 score) rankings."""

    path: Path
    model: object  # bm25s.BM25
    keys: np.ndarray  # row -> chunk key, ascending
    meta: dict

    @classmethod
    def open(cls, index: Path) -> "LexicalIndex":
        """Open DIR/bm25, checking every file's size and sampled checksum.

        Raises IndexMissingError / IndexCorruptError in one line naming the command that rebuilds it.
        """
        bm25s = _bm25s()
        index = Path(index)
        folder = lexical_dir(index)
        fix = f"fix: {fix_command(index)}"
        try:
            meta = json.loads((folder / META).read_text())
        except FileNotFoundError:
            raise IndexMissingError(f"{folder / META} is missing (no BM25 index here); {fix}") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise IndexCorruptError(f"{folder / META} is not valid JSON; {fix}") from None
        for name, want in meta["files"].items():
            f = folder / name
            if not f.is_file():
                raise IndexMissingError(f"{f} is missing; {fix}")
            if f.stat().st_size != want["bytes"]:
                raise IndexCorruptError(f"{f} is {f.stat().st_size} bytes but {META} says {want['bytes']} (truncated); {fix}")
            if sample_checksum(f) != want["sample_sha256"]:
                raise IndexCorruptError(f"{f} fails its checksum (corrupted); {fix}")
        model = bm25s.BM25.load(str(folder), mmap=True, show_progress=False)
        keys = np.load(folder / KEYS, mmap_mode="r")
        return cls(folder, model, keys, meta)

    def __len__(self) -> int:
        return len(self.keys)

    def query_tokens(self, query: str) -> list[str]:
        """The query's stemmed terms that the corpus has (unknown terms cannot score)."""
        toks = _bm25s().tokenize([query], stopwords=STOPWORDS, stemmer=_stemmer(), return_ids=False,
                              show_progress=False)[0]
        vocab = self.model.vocab_dict
        return [t for t in toks if t in vocab]

    def scores(self, query: str) -> np.ndarray:
        """BM25 of every passage for `query` (row order; zeros when no term is known)."""
        toks = self.query_tokens(query)
        if not toks:
            return np.zeros(len(self.keys), dtype=np.float32)
        return np.asarray(self.model.get_scores(toks), dtype=np.float32)

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """Top `k` (chunk key, BM25 score) per query, best first; passages scoring 0 are left out."""
        out = []
        for q in queries:
            s = self.scores(q)
            out.append([(int(self.keys[i]), float(s[i])) for i in top_rows(s, k)])
        return out

    def scores_of(self, query_scores: np.ndarray, keys: Sequence[int]) -> list[float]:
        """The BM25 scores (from `scores(query)`) of given chunk keys; 0 for a key not indexed."""
        rows = np.searchsorted(self.keys, np.asarray(keys, dtype=np.int64))
        return [float(query_scores[r]) if r < len(self.keys) and int(self.keys[r]) == k else 0.0
                for r, k in zip(rows, keys)]


def top_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Rows of the `k` highest scores, best first (ties by row), zero scores left out."""
    if not len(scores):
        return np.arange(0)
    top = np.argpartition(-scores, min(k, len(scores)) - 1)[:k] if len(scores) > k else np.arange(len(scores))
    top = top[np.argsort(-scores[top], kind="stable")]
    return top[scores[top] > 0]
