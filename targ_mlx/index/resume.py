"""Resuming an unfinished build from any entry point, and after the corpus changed.

A build stopped part-way leaves DIR.partial with its arguments (build.json). `resume_unfinished`
runs that same build again (the eval, ask and the app call it for the index they need, so the
user never has to find the command). When a documents folder changed between attempts, the old
partial is set aside as DIR.partial.prev and the new build takes its vectors for every chunk whose
text is unchanged (`reuse.VectorSource` reads a partial's committed vectors), so only the edited
and new files are encoded again; the set-aside folder is deleted once DIR is published.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Callable

from targ_mlx.index.errors import CorpusError, IndexError_
from targ_mlx.index.store import BUILD_STATE, MANIFEST, partial_dir, rebuild_command

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
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


def unfinished(out: Path) -> dict | None:
    """The arguments of the build left unfinished in DIR.partial (None: none, or an `add`)."""
    state = partial_dir(Path(out)) / BUILD_STATE
    if not state.is_file():
        return None
    spec = json.loads(state.read_text())
    return None if "update" in spec else spec


def _recover_swap(out: Path) -> None:
    """An `add` killed between its two renames left DIR.old and DIR.partial: finish the swap."""
    from targ_mlx.index.lock import index_lock
    from targ_mlx.index.update import _recover_swap as recover

    with index_lock(out, wait=True):
        recover(out)


def resume_unfinished(out: Path, progress: Progress | None = None) -> Path:
    """Finish the build left in DIR.partial, if any, waiting for a writer that holds DIR.

    A finished index, or one being updated by an unfinished `add` (DIR still served), is
    returned as it is; an `add` killed half-way through publishing is published.

    Raises:
        IndexError_: the partial is a Ray build (resumed only on Ray: the command is named).
    """
    from targ_mlx.index.build import build_index
    from targ_mlx.index.chunking import ChunkParams

    out = Path(out)
    if not (out / MANIFEST).is_file() and out.with_name(out.name + ".old").is_dir():
        _recover_swap(out)
    spec = unfinished(out)
    if spec is None or (out / MANIFEST).is_file():
        return out
    if spec.get("shard_size"):
        raise IndexError_(f"the --ray build into {out} is unfinished; fix: {rebuild_command(spec, out)}")
    logger.warning("resuming the unfinished build of %s", out)
    hnsw = spec["hnsw"]
    return build_index(
        spec["corpora"], out, encoder=spec["encoder"], dtype=spec["dtype"], limit=spec["limit"],
        connectivity=hnsw["connectivity"], expansion_add=hnsw["expansion_add"],
        expansion_search=hnsw["expansion_search"], chunking=ChunkParams(**spec["chunking"]),
        backend=spec.get("backend"), progress=progress, wait=True,
    )
