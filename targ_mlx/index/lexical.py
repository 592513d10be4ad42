"""BM25 beside the dense index: a lexical ranking of the same passages, in DIR/bm25/.

Dense search misses what a name or a rare word finds (a Wikipedia question is mostly names), and
BM25 misses paraphrase; fusing the two rankings (`hybrid.py`) beats either.

The engine is Tantivy (`lexical_tantivy.py`): Lucene-style segments written as the passages
stream in, merged on disk and memory-mapped on open, so a build holds a fixed writer heap
whatever the corpus size (all of English Wikipedia on a laptop), and a query walks posting lists
with block-max WAND instead of scoring every passage. Indexes built before it (bm25s's eager
sparse matrix, whose build held every token of the corpus in memory) still open
(`lexical_bm25s.py`); `python -m targ_mlx.index lexical DIR` rebuilds one with Tantivy.

The folder is written under DIR/bm25.tmp and renamed when complete; its own `lexical.json` names
the engine and lists every file's size and sampled checksum, so a missing or truncated file is
one clear error on open. A build killed half-way resumes after the last committed passage.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Callable, Iterator, Protocol, Sequence

from targ_mlx.index.errors import IndexCorruptError, IndexMissingError
from targ_mlx.index.lexical_bm25s import Bm25sIndex
from targ_mlx.index.lexical_files import META, Row, RowSource, check_files
from targ_mlx.index.lexical_tantivy import TantivyIndex, build
from targ_mlx.index.store import PASSAGES

LEXICAL = "bm25"  # the folder inside an index


class LexicalIndex(Protocol):
    """An opened BM25 part: (chunk key, BM25 score) rankings and the scores of given keys."""

    path: Path
    meta: dict

    def __len__(self) -> int: ...

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """Top `k` (chunk key, BM25 score) per query, best first; passages scoring 0 left out."""

    def score_keys(self, query: str, keys: Sequence[int]) -> list[float]:
        """BM25 of `query` for each of `keys` (0 for a key that does not match or is not indexed)."""


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


def build_lexical(rows: RowSource, out: Path, source: dict | None = None,
                  progress: Callable[[int], None] | None = None) -> dict:
    """Index the rows into folder `out` (replaced when complete) with Tantivy, resuming a build of
    the same `source` (a dict naming what the rows are) that was stopped half-way.

    Returns the summary kept in lexical.json (and the index manifest's "lexical").
    """
    return build(rows, Path(out), source or {}, progress)


def passage_rows(db_paths: Sequence[Path]) -> RowSource:
    """The passages of the given passages.db files as a `RowSource`: keys ascending, each key once
    (a chunk stored in two shards counts once), streamed (never the whole table in memory)."""

    def rows(after: int | None = None) -> Iterator[Row]:
        import heapq

        conns = [sqlite3.connect(f"file:{p}?mode=ro", uri=True) for p in db_paths]
        try:
            streams = [c.execute("SELECT key, title, text FROM passages WHERE key > ? ORDER BY key",
                                 (-1 if after is None else after,)) for c in conns]
            last = None
            for row in heapq.merge(*streams, key=lambda r: r[0]):
                if row[0] != last:
                    last = row[0]
                    yield row
        finally:
            for c in conns:
                c.close()

    return rows


def databases_source(db_paths: Sequence[Path]) -> dict:
    """What a resumed build checks it is still indexing: each database's passage count and last key."""
    out = []
    for p in db_paths:
        with sqlite3.connect(f"file:{p}?mode=ro", uri=True) as c:
            out.append([Path(p).parent.name, *c.execute("SELECT count(*), max(key) FROM passages").fetchone()])
    return {"databases": out}


def build_lexical_from(db_paths: Sequence[Path], out: Path, progress: Callable[[int], None] | None = None) -> dict:
    """The BM25 part of the passages in `db_paths`, into `out` (a build, a Ray union, an `add`)."""
    return build_lexical(passage_rows(db_paths), out, databases_source(db_paths), progress)


def index_databases(index: Path) -> list[Path]:
    """The passages.db files of an index folder (one per shard of a Ray build)."""
    manifest = json.loads((Path(index) / "manifest.json").read_text())
    return [Path(index) / s / PASSAGES for s in manifest["shards"]] if "shards" in manifest else [Path(index) / PASSAGES]


def add_lexical(index: Path, progress: Callable[[int], None] | None = None) -> dict:
    """Build (or rebuild) the BM25 part of a finished index folder from its passages."""
    index = Path(index)
    return build_lexical_from(index_databases(index), lexical_dir(index), progress)


def open_lexical(index: Path) -> LexicalIndex:
    """Open DIR/bm25 with the engine that built it, checking every file's size and checksum.

    Raises IndexMissingError / IndexCorruptError in one line naming the command that rebuilds it.
    """
    index = Path(index)
    folder = lexical_dir(index)
    fix = f"fix: {fix_command(index)}"
    try:
        meta = json.loads((folder / META).read_text())
    except FileNotFoundError:
        raise IndexMissingError(f"{folder / META} is missing (no BM25 index here); {fix}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise IndexCorruptError(f"{folder / META} is not valid JSON; {fix}") from None
    check_files(folder, meta, fix)
    kind = meta.get("kind", "bm25s")
    if kind == "tantivy":
        return TantivyIndex.open(folder, meta, fix)
    if kind == "bm25s":
        return Bm25sIndex.open(folder, meta)
    raise IndexCorruptError(f"{folder / META} names an unknown engine {kind!r}; {fix}")
