"""mlx-lm's package without its eager `__init__` until something asks for it.

`import mlx_lm.models.cache` (the KV caches every path uses) first runs `mlx_lm/__init__.py`, which
imports `convert`, `generate` and `utils`, and through them `transformers` and `torch`: 2.8 of the
3.4 s a `targ ask` spent importing before it loaded the model, for names a GGUF model on the CPU
kernels never uses. `defer()` registers the package as a plain module over mlx-lm's own folder, so
its submodules import as usual, with a module `__getattr__` (PEP 562) that runs the real
`__init__` the first time one of its names is asked for (`from mlx_lm import load` for an MLX
model): what a user of mlx-lm sees is unchanged, only when it loads.
"""

from __future__ import annotations

import importlib.util
import sys
import types


def defer(name: str = "mlx_lm") -> None:
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # not installed (the import that needs it says so) or not a package
    pkg = types.ModuleType(name)
    pkg.__spec__, pkg.__path__, pkg.__file__ = spec, list(spec.submodule_search_locations), spec.origin
    pkg.__package__, pkg.__loader__ = name, spec.loader

    def __getattr__(attr: str):  # any name the package's own attributes above do not hold
        del pkg.__dict__["__getattr__"]  # once: the real __init__ now defines the names
        spec.loader.exec_module(pkg)
        return getattr(pkg, attr)

    pkg.__getattr__ = __getattr__
    sys.modules[name] = pkg
