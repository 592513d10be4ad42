"""Repacked GGUF models on disk, so a model is converted for the kernels once.

Converting a GGUF for the kernels (K-quant blocks to affine groups, then to 16-column tiles)
takes a minute or more for a 1.5B model; loading the result takes seconds. An entry is keyed by
the GGUF file's path, size and mtime, `FORMAT`, the scale dtype and the Q4_K tiles' layout, and holds:

  native.safetensors  the arrays `NativeLM.state()` names (what the kernels read)
  model.safetensors   the mlx-lm model's weights, loaded lazily: MLX reads an array only when
                      something evaluates it, so they cost no memory while the kernels run
  meta.json           GGUF metadata (tokenizer, chat template) and the model's fields
  manifest.json       written last: each file's size and CRC32 of its first and last MiB

An entry that is incomplete, or whose files do not match its manifest, is rebuilt, not trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import zlib
from pathlib import Path

import mlx.core as mx

from targ_mlx.paths import default_cache_path

logger = logging.getLogger(__name__)

FORMAT = 4  # bump when pack's layout or what an entry holds changes

FILES = ("native.safetensors", "model.safetensors", "meta.json")
_EDGE = 1 << 20


def _as_stored() -> set[int]:
    """The K-quant types made from the file's own blocks; TARG_MLX_KQUANT=repacked repacks
    everything to affine tiles from the model's weights instead (to compare)."""
    from targ_mlx.runtime.native.pack import Q4_K, Q6_K

    return set() if os.environ.get("TARG_MLX_KQUANT", "stored") == "repacked" else {Q4_K, Q6_K}


def stored_weights(path: str) -> dict:
    """The kernels' weights made from the file's own K-quant blocks, by mlx-lm module path."""
    from targ_mlx.runtime import gguf_blocks
    from targ_mlx.runtime.gguf import stored_blocks

    return {name: gguf_blocks.kernel_weights(qtype, b, embedding=name == "model.embed_tokens")
            for name, (qtype, b) in stored_blocks(path, _as_stored()).items()}


def entry_dir(path: str) -> Path:
    from targ_mlx.runtime.gguf import SCALE_DTYPE
    from targ_mlx.runtime.native import q4k_layout, q6k_layout

    st = os.stat(path)
    # the Q4_K tiles' nibble layout and the Q6_K form depend on the build (csrc/k4tiles.h, k6tiles.h)
    key = (f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{FORMAT}|{SCALE_DTYPE}|{sorted(_as_stored())}"
           f"|{q4k_layout()}" + ("|q6k-tiles" if q6k_layout() == "tiles" else ""))
    name = f"{Path(path).stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    return default_cache_path() / "repack" / name


def _fingerprint(path: Path) -> dict:
    size = path.stat().st_size
    with open(path, "rb") as f:
        crc = zlib.crc32(f.read(_EDGE))
        f.seek(max(0, size - _EDGE))
        crc = zlib.crc32(f.read(_EDGE), crc)
    return {"size": size, "crc32": crc}


def _valid(d: Path) -> bool:
    try:
        manifest = json.loads((d / "manifest.json").read_text())
        return manifest.get("format") == FORMAT and all(_fingerprint(d / f) == manifest["files"][f] for f in FILES)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _json_value(v):
    return v.tolist() if hasattr(v, "tolist") else str(v)


KEEP_OTHERS = 1  # entries kept for a file besides the newest: an A/B pair (TARG_MLX_Q4K_LAYOUT) stays cached


def prune(d: Path, source: str) -> list[Path]:
    """Remove older entries of the same GGUF file beside `d` (left by another format or kernel
    layout: 1-2.5 GB each for the 1.5B model), keeping the newest KEEP_OTHERS; entries written
    before manifests named their source count as the file's if they share its name. Returns
    what was removed."""
    stem = d.name.rsplit("-", 1)[0]
    mine = []
    for e in d.parent.glob(f"{stem}-*"):
        if e == d or e.suffix == ".tmp" or not e.is_dir() or e.name.rsplit("-", 1)[0] != stem:
            continue
        try:
            manifest = json.loads((e / "manifest.json").read_text())
            when = (e / "manifest.json").stat().st_mtime
        except (OSError, ValueError):
            continue  # being written, or not an entry: not ours to judge
        if manifest.get("source", source) == source:
            mine.append((when, e))
    removed = [e for _, e in sorted(mine, reverse=True)[KEEP_OTHERS:]]
    for e in removed:
        shutil.rmtree(e, ignore_errors=True)
        logger.info("removed an older repack cache entry of %s: %s", source, e)
    return removed


def save(d: Path, model_weights: dict[str, mx.array], native_state: dict[str, mx.array], meta: dict,
         source: str | None = None) -> None:
    """Write an entry (into a temporary folder renamed into place, so readers never see half of
    one); with `source` (the GGUF's path), older entries of that file are pruned."""
    source = os.path.abspath(source) if source else None
    tmp = d.with_name(f"{d.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        mx.save_safetensors(str(tmp / "native.safetensors"), native_state)
        mx.save_safetensors(str(tmp / "model.safetensors"), model_weights)
        (tmp / "meta.json").write_text(json.dumps(meta, default=_json_value))
        files = {f: _fingerprint(tmp / f) for f in FILES}
        manifest = {"format": FORMAT, "files": files}
        if source:
            manifest["source"] = source
        (tmp / "manifest.json").write_text(json.dumps(manifest))
        shutil.rmtree(d, ignore_errors=True)
        os.replace(tmp, d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if source:
        prune(d, source)


def load(d: Path) -> tuple[dict[str, mx.array], dict[str, mx.array], dict] | None:
    """(model weights, native state, meta) of a valid entry, all arrays lazy; None if there is
    no valid entry (a broken one is removed)."""
    if not d.exists():
        return None
    if not _valid(d):
        logger.warning("repack cache entry %s is incomplete or corrupt; rebuilding it", d)
        shutil.rmtree(d, ignore_errors=True)
        return None
    try:
        return (mx.load(str(d / "model.safetensors")), mx.load(str(d / "native.safetensors")),
                json.loads((d / "meta.json").read_text()))
    except (OSError, ValueError, RuntimeError) as e:
        logger.warning("repack cache entry %s is unreadable (%s); rebuilding it", d, e)
        shutil.rmtree(d, ignore_errors=True)
        return None


def load_gguf_native(path: str, ops):
    """(GGUFModel, NativeLM) for a GGUF file, from the cache when it holds a valid entry;
    NativeLM is None when the kernels cannot run the model (then nothing is cached)."""
    from mlx.utils import tree_flatten

    from targ_mlx.runtime.gguf import check_file, load_gguf, model_from
    from targ_mlx.runtime.native.model import NativeLM, unsupported

    check_file(path)
    d = entry_dir(path)
    hit = load(d)
    if hit is not None:
        weights, state, meta = hit
        g = model_from(path, weights, meta, "quantized", evaluate=False)
        mx.eval(list(state.values()))  # read now, not inside the first forward pass
        return g, NativeLM.from_state(g.model, ops, state)
    g = load_gguf(path, dtype="quantized")
    if unsupported(g.model):
        return g, None
    engine = NativeLM.build(g.model, ops, stored_weights(path))
    save(d, dict(tree_flatten(g.model.parameters())), engine.state(), g.metadata, source=path)
    # The model's own copy of the weights goes back to disk: read lazily, only if ever used.
    g.model.load_weights(list(mx.load(str(d / "model.safetensors")).items()))
    return g, engine
