"""Readers during a writer's publish: open the old index or the new one, never a mix.

`build.publish` replaces DIR in two renames (DIR -> DIR.old, DIR.partial -> DIR). A reader that
already holds DIR keeps working: its vectors are memory-mapped and its SQLite file is open, and
both stay valid after the folder is renamed and deleted. A reader that opens *during* the swap may
find no DIR, or a manifest from one folder and files from the other; `survives_swap` sees that the
manifest changed under it and opens again, so it gets the complete new index.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

from targ_mlx.index.errors import IndexCorruptError, IndexMissingError
from targ_mlx.index.store import MANIFEST, partial_dir

_ATTEMPTS = 5
_PAUSE_S = 0.05  # a swap is two renames; a pause this long outlasts it


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = (path / MANIFEST).stat()
        return st.st_ino, st.st_mtime_ns
    except OSError:
        return None


def _swapping(path: Path, before: tuple[int, int] | None) -> bool:
    """The manifest changed since `before`, or a publish is half-way (DIR.old, or DIR gone while
    DIR.partial holds its manifest)."""
    moved_aside = path.with_name(path.name + ".old").exists()
    return (_identity(path) != before or moved_aside
            or (before is None and (partial_dir(path) / MANIFEST).is_file()))


def survives_swap(open_fn):
    """Wrap `open_fn(path, ...)`: reopen when a publish replaced `path` while it was being opened."""

    @functools.wraps(open_fn)
    def opened(path, *args, **kwargs):
        path_ = Path(path)
        for attempt in range(_ATTEMPTS):
            before = _identity(path_)
            last = attempt == _ATTEMPTS - 1
            try:
                found = open_fn(path, *args, **kwargs)
            except (IndexMissingError, IndexCorruptError):
                if last or not _swapping(path_, before):
                    raise
                time.sleep(_PAUSE_S)
                continue
            if last or _identity(path_) == before:
                return found
            for part in found if isinstance(found, tuple) else (found,):  # opened across the swap: of both
                getattr(part, "close", lambda: None)()
            time.sleep(_PAUSE_S)
        raise AssertionError("unreachable")

    return opened
