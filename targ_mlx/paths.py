"""Where targ-mlx keeps files, by one rule each, for modules that must not import the config
(the model files sit below the config in the import graph: the config asks them which default
model is installed)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "targ-mlx"


def default_cache_path() -> Path:
    """TARG_MLX_CACHE, else the user cache dir: joined and repacked models (and, by the same
    rule in `native.build`, which imports nothing from targ_mlx, the built kernels)."""
    env = os.environ.get("TARG_MLX_CACHE")
    if env:
        return Path(env)
    return platformdirs.user_cache_path(APP_NAME)
