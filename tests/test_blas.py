"""The OpenBLAS bound into MLX runs kernels for this CPU (targ_mlx/_blas.py)."""

from __future__ import annotations

import os
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



# A 40 MiB buffer malloc'd, written and freed twice; prints the page faults of the second time.
# Left to glibc (above its mmap threshold) it is a fresh mapping each time: ~10,000 faults.
REFAULTS = """
import ctypes, resource, sys
from targ_mlx import _blas
if sys.argv[1] == "bind":
    _blas.bind_openblas()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
def touch(n=40 << 20):
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    libc.free(p)
touch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
touch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def second_touch_faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", REFAULTS, mode], capture_output=True, text=True, env=env, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_the_entry_points_first_call_keeps_a_freed_large_buffer_for_the_next_one():
    """The encoder's up product (36.6 MB a batch) was page-faulted in afresh in every layer."""
    left_to_glibc = second_touch_faults("none")
    if left_to_glibc < 5000:
        pytest.skip(f"glibc or the kernel here already reuses it ({left_to_glibc} faults): nothing to show")
    assert second_touch_faults("bind") < 500


def test_a_malloc_setting_the_user_made_is_kept(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    assert _blas.keep_freed_buffers() is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setenv("TARG_MLX_KEEP_BUFFERS", "0")
    assert _blas.keep_freed_buffers() is False
