"""`python -m tui` in a real pseudo-terminal: it exits once that terminal is gone, even when no
SIGHUP reaches it (nohup, a dropped multiplexer), instead of polling a dead stdin forever."""

import fcntl
import os
import pty
import select
import signal
import struct
import sys
import termios
import time

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX pseudo-terminals")


def _read_until(fd: int, marker: bytes, seconds: float) -> bytes:
    seen, end = b"", time.monotonic() + seconds
    while marker not in seen and time.monotonic() < end:
        if select.select([fd], [], [], 0.5)[0]:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
    return seen


def test_chat_app_exits_when_its_terminal_closes_without_a_hangup(tmp_path, small_index_dir):
    pid, master = pty.fork()
    if pid == 0:  # the app, on the pty's slave side, deaf to SIGHUP as under nohup
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        os.execv(sys.executable, [sys.executable, "-m", "tui", "--index", str(small_index_dir),
                                  "--db", str(tmp_path / "decisions.db"), "--new"])
    try:
        screen = _read_until(master, b"ask (Enter", 120)
        assert b"ask (Enter" in screen, screen[-500:]
        _read_until(master, b"\0never", 3)  # the app at work a moment, its output drained
        os.close(master)  # the terminal goes away
        end = time.monotonic() + 30
        while time.monotonic() < end:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the app was still running 30 s after its terminal closed")
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
