"""Fast CPU kernels for MLX, built on this machine the first time they are needed.

On a Mac (Metal) or an NVIDIA GPU (mlx[cuda]) mlx-lm's models run as they are. On a CPU-only
machine MLX runs a decode step of a small model as thousands of tiny ops (RoPE, RMSNorm and
attention fall back to their composite forms) and has no fast CPU kernel for quantized weights.
`csrc/` adds those kernels as MLX primitives: matmul over 4/8-bit weights (int8 activations
with VNNI dot products where the CPU has AVX512-VNNI, as llama.cpp does; float32 activations
elsewhere), fused RMSNorm, RoPE, attention over the KV cache, SwiGLU and one-pass token selection.

`ops()` returns the compiled module, or None with the reason in `status()`. Where they run is
decided by measurement (`choice.py`): the first use of a build times them against MLX's own
layers and keeps the faster. TARG_MLX_NATIVE=0 turns them off, =1 uses them regardless (even
where a GPU is present).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import warnings

logger = logging.getLogger(__name__)

_MODULE = None
_OPS = None
_STATUS = "not loaded"
_TRIED = _CHOSEN = False


def wanted() -> bool:
    """Whether the kernels should run here: a CPU-only MLX, unless TARG_MLX_NATIVE says otherwise."""
    flag = os.environ.get("TARG_MLX_NATIVE", "").strip()
    if flag == "0":
        return False
    if flag == "1":
        return True
    import mlx.core as mx

    return sys.platform != "darwin" and mx.default_device() == mx.cpu


def module():
    """The compiled kernel module (built and cached on first use) whatever the measured choice,
    or None if it cannot be built or loaded here. Models run on `ops()`; this is for callers
    that ask for the kernels by name (`load_backbone(kernels=True)`, benchmarks)."""
    global _MODULE, _STATUS, _TRIED
    if _TRIED:
        return _MODULE
    _TRIED = True
    from targ_mlx.runtime.native.build import BuildError, build

    try:
        path = build()
        spec = importlib.util.spec_from_file_location("_targ_native", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        import mlx.core as mx

        # An MLX built with another nanobind ABI would reject its own arrays here.
        mx.eval(mod.rms_norm(mx.ones((1, 32)), mx.ones((32,)), 1e-5))
    except (BuildError, ImportError, OSError, TypeError) as e:
        _STATUS = f"unavailable: {e}"
        warnings.warn(
            f"targ_mlx: fast CPU kernels unavailable, using MLX's own CPU ops (several times slower): {e}. "
            "Fix: install a C++ compiler and `pip install nanobind`, then `python -m targ_mlx.runtime.native build`.",
            stacklevel=2,
        )
        return None
    _MODULE = mod
    _STATUS = f"on ({mod.simd()}, {mod.threads()} threads)"
    return mod


def ops():
    """The kernel module where the kernels should run (a CPU-only MLX where they were measured
    faster than MLX's own layers, see `choice.py`), else None with the reason in `status()`."""
    global _OPS, _STATUS, _CHOSEN
    if _CHOSEN:
        return _OPS
    _CHOSEN = True
    if not wanted():
        _STATUS = "off (GPU present or TARG_MLX_NATIVE=0)"
        return None
    mod = module()
    if mod is None:
        return None
    if os.environ.get("TARG_MLX_NATIVE", "").strip() == "1":
        _STATUS += ", forced by TARG_MLX_NATIVE=1"
    else:
        from targ_mlx.runtime.native.choice import choice_path, load_or_measure

        choice = load_or_measure(mod, choice_path(mod))
        if not choice.use_kernels:
            _STATUS = (f"off: MLX's own layers are faster here ({choice.reason()}); "
                       "TARG_MLX_NATIVE=1 forces the kernels")
            return None
        _STATUS = f"on ({mod.simd()}, {mod.threads()} threads): {choice.reason()}"
    _OPS = mod
    return mod


def status() -> str:
    return _STATUS


def _choice_flag(name: str, choices: tuple[str, str]) -> str:
    """A flag that picks one of two kernels or forms ("" when unset), checked before the kernels
    read it (they take any other value as unset)."""
    flag = os.environ.get(name, "")
    if flag not in ("", *choices):
        raise ValueError(f"{name}={flag!r}: use {choices[0]} or {choices[1]}, or leave it unset")
    return flag


def q4k_layout() -> str:
    """The nibble layout of Q4_K tiles in this process: "k4" (csrc/k4tiles.h), unless
    TARG_MLX_Q4K_LAYOUT=tiles asks for the plain layout (pack.from_values) and its kernel, to
    time the two against each other."""
    flag = _choice_flag("TARG_MLX_Q4K_LAYOUT", ("k4", "tiles"))
    mod = module()
    return mod.q4k_layout() if mod is not None else (flag or "k4")


def q6k_kernel() -> str:
    """The kernel that multiplies Q6_K rows in this process: "avx512-vnni" (64 weights a
    register) where built, unless TARG_MLX_Q6K_KERNEL=avx2 asks for the 256-bit one (to time the
    two against each other); "avx2" or "portable" elsewhere."""
    _choice_flag("TARG_MLX_Q6K_KERNEL", ("avx2", "vnni"))
    mod = module()
    return mod.q6k_kernel() if mod is not None else "unavailable"


def q6k_layout() -> str:
    """The form of Q6_K matrices in this process: "tiles" (csrc/k6tiles.h) on AVX512-VNNI builds,
    where their kernel is, "rows" as the file stores them (csrc/kquant.h) elsewhere or when
    TARG_MLX_Q6K_LAYOUT=rows asks (to time the two against each other)."""
    _choice_flag("TARG_MLX_Q6K_LAYOUT", ("rows", "tiles"))
    mod = module()
    return mod.q6k_layout() if mod is not None else "rows"
