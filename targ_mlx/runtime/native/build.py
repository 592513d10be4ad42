"""Compile the CPU kernels (`csrc/`) into an MLX extension module, once per machine.

The module is built against the installed MLX's own headers and library with the nanobind that
matches MLX's Python bindings, with `-march=native` (it only ever runs where it was built), into
a cache folder keyed by everything that changes the binary: sources, MLX, nanobind and Python
versions, compiler and CPU flags. Builds are locked, so concurrent processes build once.

    python -m targ_mlx.runtime.native build     # what `make setup` runs; later imports find it cached
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

MODULE = "_targ_native"
SRC = Path(__file__).resolve().parent / "csrc"


class BuildError(RuntimeError):
    pass


def _cxx() -> str:
    for cand in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if cand and shutil.which(cand):
            return cand
    raise BuildError("no C++ compiler found; install one (Debian: apt-get install g++) or set CXX")


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:  # no such file (a Mac)
        return []


def cpu_flags() -> set[str]:
    """This CPU's feature flags (/proc/cpuinfo's "flags" on x86, "Features" on Arm); empty where
    there is no such file (a Mac). The one reader of them (the kernels' build, the encoder's
    backend, OpenBLAS's kernels)."""
    for line in _cpuinfo():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def intel() -> bool:
    return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in _cpuinfo())


def _paths() -> dict[str, Path]:
    try:
        import mlx.core
        import nanobind
    except ImportError as e:
        raise BuildError(f"building the CPU kernels needs {e.name}: pip install nanobind 'mlx[cpu]'") from e
    # mlx is a namespace package (MLX's JIT cache /tmp/mlx can join it); mlx.core's file is unambiguous
    mlx_dir = Path(mlx.core.__file__).resolve().parent
    return {
        "mlx_include": mlx_dir / "include",
        "mlx_lib": mlx_dir / "lib",
        "nb": Path(nanobind.__file__).resolve().parent,
        "py_include": Path(sysconfig.get_paths()["include"]),
    }


def cache_key() -> str:
    h = hashlib.sha256()
    for f in sorted(SRC.iterdir()):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    for dist in ("mlx", "nanobind"):
        try:
            h.update(f"{dist}={md.version(dist)}".encode())
        except md.PackageNotFoundError:
            h.update(f"{dist}=?".encode())
    h.update(sys.version.encode())
    h.update((" ".join(sorted(cpu_flags())) or os.uname().machine).encode())
    h.update(os.environ.get("CXX", "").encode())
    h.update(_march().encode())
    h.update(" ".join(_defines()).encode())
    return h.hexdigest()[:16]


def _march() -> str:
    """-march for the kernels: this CPU's own instructions unless TARG_MLX_NATIVE_MARCH names
    a baseline (e.g. x86-64-v3 for AVX2 only, to test or to share a build between machines)."""
    return os.environ.get("TARG_MLX_NATIVE_MARCH", "native")


def _defines() -> list[str]:
    """-D flags from TARG_MLX_NATIVE_DEFINES (space-separated NAME=VALUE), to time a kernel's
    compile-time choice (e.g. TARG_Q8_VNNI_ROWS=8) on another CPU class without editing csrc/."""
    return [f"-D{d}" for d in os.environ.get("TARG_MLX_NATIVE_DEFINES", "").split()]


def cache_dir() -> Path:
    root = os.environ.get("TARG_MLX_CACHE")
    if root:
        return Path(root) / "native"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("targ-mlx")) / "native"


def module_path() -> Path:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return cache_dir() / cache_key() / f"{MODULE}{suffix}"


def _run(cmd: list[str], log: list[str]) -> None:
    log.append(" ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-15:]
        raise BuildError("compiling the CPU kernels failed:\n  " + "\n  ".join(tail))


def build(force: bool = False, verbose: bool = False) -> Path:
    """Build the module if it is not cached yet; returns its path."""
    out = module_path()
    if out.is_file() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same key
        if out.is_file() and not force:
            return out
        p = _paths()
        cxx = _cxx()
        nb = p["nb"]
        log: list[str] = []
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            nb_obj, ops_obj, so = Path(tmp) / "nb.o", Path(tmp) / "ops.o", Path(tmp) / out.name
            common = ["-fPIC", "-fvisibility=hidden", "-DNDEBUG", f"-I{p['py_include']}", f"-I{nb / 'include'}"]
            _run([cxx, "-std=c++17", "-O2", *common, "-DNB_BUILD", "-DNB_COMPACT_ASSERTIONS", "-fno-strict-aliasing",
                  "-ffunction-sections", "-fdata-sections", f"-isystem{nb / 'ext' / 'robin_map' / 'include'}",
                  "-c", str(nb / "src" / "nb_combined.cpp"), "-o", str(nb_obj)], log)
            _run([cxx, "-std=gnu++20", "-O3", f"-march={_march()}", *_defines(), *common, "-DNB_DOMAIN=mlx",
                  f"-isystem{p['mlx_include']}", "-c", str(SRC / "ops.cpp"), "-o", str(ops_obj)], log)
            _run([cxx, "-shared", "-o", str(so), str(ops_obj), str(nb_obj), f"-L{p['mlx_lib']}", "-lmlx",
                  f"-Wl,-rpath,{p['mlx_lib']}", "-Wl,--gc-sections", "-Wl,-s"], log)
            os.replace(so, out)  # atomic: a reader sees the old state or the finished module
        if verbose:
            print("\n".join(log), file=sys.stderr)
    return out
