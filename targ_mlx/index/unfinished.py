"""Finish what a stopped writer left, from any entry point: an unfinished build in DIR.partial
(its arguments are in build.json, so `resume_unfinished` runs the same build again: the eval, ask
and the app call it for the index they need, and the user never has to find the command), or an
`add` killed between its two renames."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

from targ_mlx.index.errors import IndexError_
from targ_mlx.index.store import BUILD_STATE, MANIFEST, partial_dir, rebuild_command

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


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
        backend=spec.get("backend"), dense=spec.get("dense", True) is not False, progress=progress, wait=True,
    )
