"""Resuming a build after the corpus changed, and `--strict`: the helpers `build.py` and
`update.py` call (finishing an unfinished build from an entry point is `unfinished.py`).

When a documents folder changed between attempts, the old
partial is set aside as DIR.partial.prev and the new build takes its vectors for every chunk whose
text is unchanged (`reuse.VectorSource` reads a partial's committed vectors), so only the edited
and new files are encoded again; the set-aside folder is deleted once DIR is published.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Callable

from targ_mlx.index.errors import CorpusError
from targ_mlx.index.store import BUILD_STATE

logger = logging.getLogger(__name__)
_SHOWN_SKIPS = 5  # files named in a --strict error before "and N more"


def previous_dir(out: Path) -> Path:
    return Path(out).with_name(Path(out).name + ".partial.prev")


def check_strict(spec: dict, strict: bool) -> None:
    """With --strict, any file skipped as unreadable is an error naming the files, in one line."""
    bad = [f"{Path(folder, rel)} ({why})" for folder, files in spec.get("skipped", {}).items()
           for rel, why in files.items()]
    if strict and bad:
        more = f" and {len(bad) - _SHOWN_SKIPS} more" if len(bad) > _SHOWN_SKIPS else ""
        raise CorpusError(
            f"--strict: {len(bad)} file(s) cannot be read: {'; '.join(bad[:_SHOWN_SKIPS])}{more}; "
            "fix: repair or remove them, or drop --strict to skip them"
        )


def reusable_partial(old: dict, new: dict, same_build: Callable[[dict, dict], bool]) -> bool:
    """True when two build specs differ only in the files of their documents folders."""
    if "update" in old or same_build(old, new) or "documents" not in new:
        return False
    return same_build({**old, "documents": new["documents"]}, new)


def set_aside(part: Path) -> Path:
    """Move DIR.partial to DIR.partial.prev (replacing an older one) so a new build can reuse it."""
    prev = previous_dir(part.with_name(part.name.removesuffix(".partial")))
    if prev.exists():
        shutil.rmtree(prev)
    os.replace(part, prev)
    logger.warning("documents changed since %s was begun; starting afresh, reusing its unchanged chunks", part)
    return prev


def previous_partial(out: Path) -> list[Path]:
    """[DIR.partial.prev] when a set-aside partial can lend vectors, else []."""
    prev = previous_dir(out)
    return [prev] if (prev / BUILD_STATE).is_file() else []


def discard_previous(out: Path) -> None:
    shutil.rmtree(previous_dir(out), ignore_errors=True)
