"""One writer per index (targ_mlx/index/lock.py): the holder is named, a second writer stops or
waits, the same thread may nest, and the lock is free again once the holder is done."""

import os
import threading
import time

import pytest

from targ_mlx.index.errors import IndexLockedError
from targ_mlx.index.lock import holder, index_lock, lock_path


def test_the_holder_is_named_and_a_second_writer_stops_with_one_line(tmp_path):
    out = tmp_path / "idx"
    errors = []
    with index_lock(out):
        info = holder(out)
        assert info["pid"] == os.getpid() and info["since"].endswith("Z") and info["command"]
        with index_lock(out):  # the same thread nests (a build inside ensure_default_index)
            pass
        t = threading.Thread(target=lambda: errors.append(_try(out)))
        t.start()
        t.join()
    [e] = errors
    assert isinstance(e, IndexLockedError) and "\n" not in str(e)
    assert f"{out} is being written by this process (pid {os.getpid()}" in str(e)
    assert lock_path(out) == tmp_path / "idx.lock" and holder(out) == {}  # released, nothing stale
    with index_lock(out):  # free again
        pass


def _try(out):
    try:
        with index_lock(out):
            return None
    except IndexLockedError as e:
        return e


def test_wait_blocks_until_the_holder_is_done(tmp_path):
    out = tmp_path / "idx"
    order = []
    release = threading.Event()

    def first():
        with index_lock(out):
            order.append("first in")
            release.wait(5)
            order.append("first out")

    t = threading.Thread(target=first)
    t.start()
    while not order:
        time.sleep(0.01)
    def second():
        with index_lock(out, wait=True):
            order.append("second in")

    waiter = threading.Thread(target=second)
    waiter.start()
    time.sleep(0.5)
    assert order == ["first in"]  # still waiting
    release.set()
    t.join()
    waiter.join(5)
    assert order == ["first in", "first out", "second in"]


def test_an_unwritable_lock_file_is_one_line(tmp_path):
    from targ_mlx.index.errors import IndexWriteError

    with pytest.raises(IndexWriteError, match="cannot write the lock file .*fix: "):
        with index_lock(tmp_path / "no-such-folder" / "idx"):
            pass
