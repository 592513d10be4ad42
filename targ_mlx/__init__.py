"""targ-mlx: training-free adaptive retrieval gating (TARG) for local LLMs on MLX.

Importing the package does nothing beyond imports. On Linux a fast BLAS has to be bound into
MLX's CPU backend before `mlx.core` first loads (`bind_openblas`, see `_blas.py`): the entry
points (`targ`, `targ-chat`, `targ-eval`, the benchmarks, the tests) call it first thing;
a library user running MLX on CPU calls it before importing anything that loads `mlx.core`.
"""

from targ_mlx._blas import bind_openblas  # noqa: F401

__version__ = "0.1.0"
