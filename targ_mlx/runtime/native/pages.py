"""2 MB pages under the kernels' weights (Linux transparent huge pages).

A batch-1 decode step streams every weight once (~1.1 GB for the 1.5B, ~270,000 pages of 4 KB):
on 2 MB pages the same step ran 5-20% faster on an AVX512-VNNI Zen 4 (BENCHMARKS.md, row "huge
pages"). The weights are many MLX arrays, but allocated one after another they lie in a few
runs of adjacent memory, so whole 2 MB pages cover all but a few MB of them.

Modes: "advise" marks that memory MADV_HUGEPAGE, which costs nothing now (the kernel's
khugepaged moves it to 2 MB pages in the background, over minutes); "collapse" also asks for it
at once (MADV_COLLAPSE, Linux 6.1+; ~2-3 s for the 1.5B), which the long-running apps (eval,
server, chat) do at load; "off" keeps 4 KB pages (MADV_NOHUGEPAGE: benchmarks' control). Where
the OS has no such thing (not Linux, THP set to `never`, an older kernel) nothing changes, and
nothing fails: the pages only change how fast the same bytes are read.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Iterable

import mlx.core as mx
import numpy as np

MODES = ("advise", "collapse", "off")
HUGE = 2 << 20
MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_COLLAPSE = 14, 15, 25
# arrays closer than this are one run: the allocator puts a small header between neighbours
_GAP = 64 << 10


def spans(ranges: Iterable[tuple[int, int]], gap: int = _GAP) -> list[tuple[int, int]]:
    """(start, end) address ranges merged where they touch or nearly so, cut inward to whole
    2 MB pages (a page outside the arrays would be made huge too); empty runs dropped."""
    runs: list[list[int]] = []
    for s, e in sorted(ranges):
        if runs and s - runs[-1][1] <= gap:
            runs[-1][1] = max(runs[-1][1], e)
        else:
            runs.append([s, e])
    out = []
    for s, e in runs:
        a, b = (s + HUGE - 1) & ~(HUGE - 1), e & ~(HUGE - 1)
        if b > a:
            out.append((a, b))
    return out


def _address(a: mx.array) -> int | None:
    try:
        return int(np.frombuffer(memoryview(a), dtype=np.uint8).ctypes.data)
    except (TypeError, ValueError, BufferError):  # a dtype numpy cannot view (bfloat16): left as it is
        return None


def huge_pages(arrays: Iterable[mx.array], mode: str = "advise") -> int:
    """Put the arrays' memory on 2 MB pages (see the module docstring); returns the bytes the OS
    accepted the request for (0 where it has no huge pages)."""
    if mode not in MODES:
        raise ValueError(f"huge pages mode {mode!r}: use one of {', '.join(MODES)}")
    if not sys.platform.startswith("linux"):
        return 0
    arrays = list(arrays)
    mx.eval(arrays)
    ranges = [(p, p + a.nbytes) for a in arrays if a.nbytes and (p := _address(a)) is not None]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = 0
    for s, e in spans(ranges):
        if libc.madvise(s, e - s, MADV_NOHUGEPAGE if mode == "off" else MADV_HUGEPAGE) != 0:
            continue
        if mode != "collapse":
            done += e - s
            continue
        # a page at a time: one the kernel cannot move now (EAGAIN) leaves the others collapsed
        done += sum(HUGE for a in range(s, e, HUGE) if libc.madvise(a, HUGE, MADV_COLLAPSE) == 0)
    return done


def anon_huge_bytes() -> int | None:
    """This process's memory on transparent huge pages now (None where the OS does not say)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
