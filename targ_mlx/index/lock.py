"""One writer per index: an OS lock on DIR.lock, held for the whole of a build or an `add`.

`fcntl.flock` is released by the kernel when the holder exits, even after kill -9, so a stale
lock never needs deleting. The holder writes its pid, command and start time into the file; a
second writer either waits for it (`wait=True`, `--wait`) or stops with one line naming it.
Readers take no lock: they open finished folders only (see `retriever.open_retriever`).
"""

from __future__ import annotations

import fcntl
import functools
import inspect
import json
import logging
import os
import shlex
import sys
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

from targ_mlx.index.errors import IndexLockedError, IndexWriteError

logger = logging.getLogger(__name__)

_held: dict[Path, tuple[int, int]] = {}  # lock file -> (thread id, depth): re-entrant per thread
_held_guard = threading.Lock()
_POLL_S = 0.2  # how often a waiting writer retries, so it can also notice another thread's release


def lock_path(out: Path) -> Path:
    """DIR.lock beside DIR (not inside: DIR is replaced whole when an update is published)."""
    out = Path(out)
    return out.with_name(out.name + ".lock")


def _command() -> str:
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    return shlex.join([Path(argv[0]).name, *argv[1:]])


def holder(out: Path) -> dict:
    """{pid, command, since} of the last writer of `out` (the current one while it is locked)."""
    try:
        return json.loads(lock_path(out).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}


def _describe(info: dict) -> str:
    if not info:
        return "another process"
    return f"pid {info.get('pid')} (`{info.get('command')}`, since {info.get('since')})"


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise IndexWriteError(
            f"cannot write the lock file {path} ({e.strerror}); fix: make {path.parent} writable "
            "for this user, or choose an index folder you can write"
        ) from None


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _acquire(out: Path, fd: int, wait: bool) -> None:
    if _try_flock(fd):
        return
    who = _describe(holder(out))
    if not wait:
        raise IndexLockedError(
            f"{out} is being written by {who}; fix: wait for it to finish, or rerun with --wait"
        )
    logger.warning("%s is being written by %s; waiting for it to finish", out, who)
    while not _try_flock(fd):
        time.sleep(_POLL_S)


def _stamp(fd: int) -> None:
    info = {"pid": os.getpid(), "command": _command(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)


def _enter_thread(path: Path, out: Path, wait: bool) -> bool:
    """True when this thread already holds the lock (a build inside a build); waits or raises
    while another thread of this process holds it (flock alone would let both through)."""
    me = threading.get_ident()
    while True:
        with _held_guard:
            owner, depth = _held.get(path, (me, 0))
            if owner == me:
                _held[path] = (me, depth + 1)
                return depth > 0
        if not wait:
            raise IndexLockedError(
                f"{out} is being written by this process (pid {os.getpid()}, another thread); "
                "fix: wait for it to finish"
            )
        time.sleep(_POLL_S)


def _leave_thread(path: Path) -> None:
    with _held_guard:
        owner, depth = _held[path]
        if depth > 1:
            _held[path] = (owner, depth - 1)
        else:
            del _held[path]


@contextmanager
def index_lock(out: Path, wait: bool = False) -> Iterator[None]:
    """Hold the write lock of index folder `out`.

    Args:
        out: the index folder (it need not exist yet).
        wait: block until the current writer is done (logging who it is) instead of raising.

    Raises:
        IndexLockedError: another writer holds it and `wait` is False (one line naming it).
        IndexWriteError: the lock file cannot be created (e.g. a read-only folder).
    """
    path = lock_path(Path(out)).absolute()
    if _enter_thread(path, Path(out), wait):
        try:
            yield
        finally:
            _leave_thread(path)
        return
    fd, held = -1, False
    try:
        fd = _open(path)
        _acquire(Path(out), fd, wait)
        held = True
        _stamp(fd)
        yield
    finally:
        if held:
            with suppress(OSError):  # a writer that finds it locked next reads no stale holder
                os.ftruncate(fd, 0)
        if fd >= 0:
            os.close(fd)  # closing the only descriptor releases the flock
        _leave_thread(path)


def writes_index(fn):
    """Run `fn(..., out, ...)` holding the lock of its `out` folder; adds a `wait=False` keyword."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def locked(*args, wait: bool = False, **kwargs):
        out = sig.bind(*args, **kwargs).arguments["out"]
        with index_lock(Path(out), wait=wait):
            return fn(*args, **kwargs)

    return locked
