"""The OpenBLAS bound into MLX runs kernels for this CPU (targ_mlx/_blas.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from targ_mlx import _blas
from targ_mlx.runtime.native.build import cpu_flags

# OpenBLAS's kernel sets for CPUs without AVX2: what an OpenBLAS older than the CPU falls back to
PRE_AVX2 = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Sandybridge", "Atom", "Katmai", "Northwood"}

CORENAME = """
import ctypes
from targ_mlx import _blas
path = _blas.bind_openblas()
lib = ctypes.CDLL(path)
lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())
"""


def bound_corename(env: dict | None = None) -> str:
    out = subprocess.run([sys.executable, "-c", CORENAME], capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(_blas.find_openblas() is None or "avx2" not in cpu_flags(), reason="no OpenBLAS, or no AVX2 here")
def test_the_bound_openblas_runs_kernels_of_this_cpus_class():
    """On the Xeon family 6 model 207 Debian's OpenBLAS picked Prescott's SSE3 kernels by itself."""
    assert bound_corename() not in PRE_AVX2


def test_a_coretype_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    assert _blas._coretype() is None

