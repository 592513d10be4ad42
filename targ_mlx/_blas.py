"""Bind a fast BLAS into MLX's CPU backend before `mlx.core` loads.

The Linux `mlx[cpu]` wheel links the netlib reference BLAS (~5 GFLOP/s sgemm). Loading
OpenBLAS with RTLD_GLOBAL first makes the dynamic linker resolve MLX's `cblas_*`/`sgemm_`
symbols to it (~175 GFLOP/s on 2 cores). This has to run before the first `import mlx.core`
in the process, so the entry points call `bind_openblas()` first thing (importing `targ_mlx`
does not); it does nothing on macOS (Accelerate) or when disabled with TARG_MLX_NO_OPENBLAS=1.
The same first call sets glibc's allocator to keep freed large buffers (`keep_freed_buffers`).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import warnings

# Debian/Ubuntu: `apt-get install libopenblas0-pthread`; Fedora: openblas-threads.
_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblasp.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)

#: Path of the BLAS bound into MLX, or None (macOS, disabled, not found, or too late).
BLAS_PATH: str | None = None
BLAS_STATUS = "not attempted"


def find_openblas() -> str | None:
    explicit = os.environ.get("TARG_MLX_OPENBLAS")
    if explicit:
        return explicit if os.path.exists(explicit) else None
    for path in _CANDIDATES:
        if os.path.exists(path):
            return path
    # A pip-installed scipy-openblas wheel is a fallback on machines without the system package.
    for site in sys.path:
        hits = glob.glob(os.path.join(site, "scipy_openblas*", "lib", "libscipy_openblas*.so"))
        if hits:
            return hits[0]
    return None


def _coretype() -> str | None:
    """The kernel set OpenBLAS should take on an Intel CPU with AVX-512, unless the user chose one.

    OpenBLAS picks its kernels by CPU model, and a release older than the CPU falls back to its
    oldest (Debian 12's 0.3.21 takes the Xeon family 6 model 207 for a "Prescott", SSE3): float32
    products ran 3.5x slower there (the encoder's `mlx` backend: 20 passages 2.6-4.0 s against
    0.8-1.0 s with SkylakeX's, BENCHMARKS.md, row "OpenBLAS on a CPU newer than it"). Every Intel
    CPU with these flags runs SkylakeX's kernels, which OpenBLAS itself gives the ones it knows
    (Cooper Lake's float32 kernels are SkylakeX's), so the bits there do not change; AMD CPUs are
    left to OpenBLAS (it knows Zen 4 by family, not model).
    """
    if os.environ.get("OPENBLAS_CORETYPE"):
        return None
    from targ_mlx.runtime.native.build import cpu_flags, intel  # (stdlib only: loads no MLX)

    return "SkylakeX" if intel() and {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= cpu_flags() else None


#: Bytes up to which glibc serves allocations from its heap and keeps them there once freed.
KEEP_BUFFERS_UP_TO = 256 << 20
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TOP_PAD_")


def keep_freed_buffers() -> bool:
    """Keep freed buffers of up to 256 MiB in the process for the next allocation (glibc only).

    glibc serves an allocation above its mmap threshold (which it raises as buffers are freed, to
    32 MiB at most) with fresh pages from the kernel and unmaps it when freed, so each one is
    page-faulted in again, 4 KiB at a time. MLX's CPU arrays are malloc'd and freed per op: the
    encoder's up product of a 32-chunk batch (5,952 rows x 1,536 floats, 36.6 MB) took ~15,000
    faults, half its time, in each of the 6 layers; with the thresholds at 256 MiB none, and a
    build encodes 1.26-1.28x the chunks a second (BENCHMARKS.md, row "freed buffers kept"). The
    cost: up to 256 MiB freed at the heap's top stays with the process. Left alone where the user
    set glibc's malloc variables or tunables, or TARG_MLX_KEEP_BUFFERS=0; returns whether set.
    """
    if not sys.platform.startswith("linux") or os.environ.get("TARG_MLX_KEEP_BUFFERS") == "0":
        return False
    if any(v in os.environ for v in _MALLOC_ENV) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl)
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    # the trim threshold first: setting either turns off glibc's own adjustment of both
    return bool(mallopt(m_trim_threshold, KEEP_BUFFERS_UP_TO)) and bool(mallopt(m_mmap_threshold, KEEP_BUFFERS_UP_TO))


def bind_openblas() -> str | None:
    """Load OpenBLAS globally if MLX's CPU backend would otherwise use reference BLAS (and keep
    freed buffers: `keep_freed_buffers`)."""
    global BLAS_PATH, BLAS_STATUS
    if BLAS_PATH is not None:  # bound already (an entry point imported after another one)
        return BLAS_PATH
    keep_freed_buffers()
    if sys.platform != "linux" or os.environ.get("TARG_MLX_NO_OPENBLAS") == "1":
        BLAS_STATUS = "skipped (not Linux or TARG_MLX_NO_OPENBLAS=1)"
        return None
    if "mlx.core" in sys.modules:
        BLAS_STATUS = "mlx.core was imported before bind_openblas(); reference BLAS in use"
        warnings.warn(
            "targ_mlx: mlx.core was imported before targ_mlx.bind_openblas(), so OpenBLAS could not be "
            "bound and MLX runs ~30x slower matmuls on CPU; call it before anything imports mlx.core.",
            stacklevel=3,
        )
        return None
    path = find_openblas()
    if path is None:
        BLAS_STATUS = "OpenBLAS not found"
        warnings.warn(
            "targ_mlx: OpenBLAS not found, MLX uses the slow reference BLAS on CPU. "
            "Fix: `sudo apt-get install libopenblas0-pthread` (or set TARG_MLX_OPENBLAS=/path/libopenblas.so).",
            stacklevel=3,
        )
        return None
    coretype = _coretype()
    if coretype:
        os.environ["OPENBLAS_CORETYPE"] = coretype
    try:
        ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
    except OSError as e:
        BLAS_STATUS = f"failed to load {path}: {e}"
        warnings.warn(f"targ_mlx: could not load OpenBLAS from {path}: {e}", stacklevel=3)
        return None
    BLAS_PATH, BLAS_STATUS = path, f"OpenBLAS bound from {path}"
    return path


def set_blas_threads(n: int) -> bool:
    """Set OpenBLAS's thread count at run time (returns False when no OpenBLAS is bound)."""
    if BLAS_PATH is None:
        return False
    lib = ctypes.CDLL(BLAS_PATH)
    for name in ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn(int(n))
            return True
    return False
