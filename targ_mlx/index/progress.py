"""A one-line terminal progress bar for index builds: `build_index(..., progress=ProgressBar())`.

The library only calls `progress(done, total)`; this bar is for CLIs (ours and the app's first-use
build). It writes to stderr and needs no extra package.
"""

from __future__ import annotations

import sys
import time


class ProgressBar:
    """One stderr line: done/total, percent, passages/s, ETA (the library only calls back)."""

    def __init__(self, stream=None, every: float = 0.5):
        self._stream, self.every = stream, every
        self.t0 = self.first = None
        self.last = 0.0

    @property
    def stream(self):
        # sys.stderr as it is when the bar writes, not when this module was imported (a test's
        # captured stream, or a caller's redirect, may have replaced and closed that one)
        return self._stream if self._stream is not None else sys.stderr

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if self.t0 is None:
            self.t0, self.first = now, done  # a resumed build starts counting from here
            return
        if now - self.last < self.every and done != total:
            return
        self.last = now
        rate = (done - self.first) / max(now - self.t0, 1e-9)
        if total:
            eta = (total - done) / rate if rate > 0 else float("inf")
            eta_s = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta != float("inf") else "--:--:--"
            width = 30
            fill = int(width * done / total)
            line = f"[{'#' * fill}{'.' * (width - fill)}] {done:,}/{total:,} chunks {100 * done / total:5.1f}% "
            line += f"{rate:6.1f} passages/s ETA {eta_s}"
        else:
            line = f"{done:,} chunks {rate:6.1f} passages/s"
        self.stream.write("\r" + line)
        if done == total:
            self.stream.write("\n")
        self.stream.flush()
