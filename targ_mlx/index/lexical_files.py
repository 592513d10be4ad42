"""What every BM25 engine's folder shares: the passage text it indexes, the rows it is fed, and
lexical.json's list of files with their sizes and sampled checksums (checked on every open)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Iterable, Sequence

from targ_mlx.index.errors import IndexCorruptError, IndexMissingError
from targ_mlx.index.store import sample_checksum, write_json_atomic

META = "lexical.json"

Row = tuple[int, str, str]  # (chunk key, title, text)
# rows(after): the passages with key > after (all of them for None), keys ascending
RowSource = Callable[[int | None], Iterable[Row]]


def passage_text(title: str, text: str) -> str:
    """What BM25 sees of a passage: the article title counts, as it does for the reader."""
    return f"{title} {text}" if title else text


def check_files(folder: Path, meta: dict, fix: str) -> None:
    """Every file lexical.json lists is there, at its size, with its sampled checksum."""
    for name, want in meta["files"].items():
        f = folder / name
        if not f.is_file():
            raise IndexMissingError(f"{f} is missing; {fix}")
        if f.stat().st_size != want["bytes"]:
            raise IndexCorruptError(f"{f} is {f.stat().st_size} bytes but {META} says {want['bytes']} (truncated); {fix}")
        if sample_checksum(f) != want["sample_sha256"]:
            raise IndexCorruptError(f"{f} fails its checksum (corrupted); {fix}")


def publish(tmp: Path, out: Path, meta: dict, skip: Sequence[str] = ()) -> dict:
    """Write lexical.json (with every file's size and checksum) into the finished `tmp` and move it
    to `out`; return the summary without the file list (the index manifest's "lexical")."""
    meta = {**meta, "files": describe(tmp, skip)}
    write_json_atomic(tmp / META, meta)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return {k: v for k, v in meta.items() if k != "files"}


def describe(folder: Path, skip: Sequence[str] = ()) -> dict:
    """lexical.json's "files": each file's size and sampled checksum."""
    return {f.name: {"bytes": f.stat().st_size, "sample_sha256": sample_checksum(f)}
            for f in sorted(folder.iterdir()) if f.is_file() and f.name not in skip and f.name != META}


