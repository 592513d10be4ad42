"""targ-mlx: training-free adaptive retrieval gating (TARG) for local LLMs on MLX.

Importing the package binds OpenBLAS into MLX's CPU backend on Linux (see `_blas.py`): the one
import-time side effect, because it only works before `mlx.core` is first loaded.
"""

from targ_mlx._blas import bind_openblas as _bind_openblas

_bind_openblas()

__version__ = "0.1.0"
