"""A fork server for the fault suite: `python tests/fault_worker.py`, driven by JSON lines on stdin.

Each trial of tests/test_index_faults.py runs the real CLI, `targ_mlx.index.__main__.main(argv)`,
in a process of its own that the test may kill -9. Starting Python, torch and the encoder takes
~7 s a process on 2 cores, so this server pays it once and forks a child per request instead
(~0.7 s for a tiny build); MLX, whose threads would not survive a fork, loads in each child.
torch runs on one thread here: a child forked after OpenMP started its pool hangs, so the pool
is never started.

Requests (one JSON object a line), each answered with one JSON line on stdout:
  {"argv": [...], "stdout": PATH, "stderr": PATH, "uid": 65534?, "fsize": BYTES?} -> {"pid": N}
  {"wait": N} -> {"pid": N, "rc": exit code, or -signal when killed}
"""

from __future__ import annotations

import json
import os
import resource
import sys


def _child(req: dict) -> int:
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    if req.get("fsize"):  # a disk that fills up: writes past this size fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (req["fsize"], req["fsize"]))
    if req.get("uid") is not None:  # root ignores file modes: a read-only folder needs another user
        os.setgid(req["uid"])
        os.setuid(req["uid"])
    from targ_mlx.index.__main__ import main

    return main(req["argv"])


def serve() -> None:
    # Children are forked from this process: no thread pool may be running (or hold a lock) when
    # one is. Rust tokenizers' pool is one (a child hung on a futex once in 30 trials without this).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # tqdm's monitor thread takes tqdm's write locks every few seconds, and one of them is shared
    # across fork: a child forked while it held them hung in bm25s's progress bar, and took the
    # parent's monitor down with it (seen once, in test_kill_9_during_add...). No monitor here.
    import tqdm
    from tqdm.std import TqdmDefaultWriteLock

    tqdm.tqdm.monitor_interval = 0
    # tqdm's write lock also holds a multiprocessing RLock, a semaphore every forked child shares:
    # a child killed -9 while holding it (the suite kills at random moments) left it held for all
    # later children, and one hung in bm25s's tokenizer bar (a fresh clone's `make test`).
    # With no such lock each child has its own copy of the thread lock.
    TqdmDefaultWriteLock.mp_lock = None  # create_mp_lock makes none while the attribute exists
    tqdm.tqdm.set_lock(TqdmDefaultWriteLock())
    import torch

    torch.set_num_threads(1)
    import targ_mlx.index.__main__  # noqa: F401  (imported once, not in every child)
    from targ_mlx.index import load_encoder

    load_encoder(backend="torch").encode_passages(["warm"], ["up"])  # for children that search torch indexes
    # MLX is not imported here: its stream threads and the kernels' pool would not survive the
    # fork, so each child imports it (and binds OpenBLAS first, as the CLI does) for the mlx encoder
    assert "mlx.core" not in sys.modules
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if "wait" in req:
            _, status = os.waitpid(req["wait"], 0)
            rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            print(json.dumps({"pid": req["wait"], "rc": rc}), flush=True)
            continue
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            rc = 1
            try:
                rc = _child(req)
            except BaseException as e:  # an escaped exception is a failure the test reads
                import traceback

                traceback.print_exc()
                rc = 3 if not isinstance(e, SystemExit) else (e.code or 0)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)
        print(json.dumps({"pid": pid}), flush=True)


if __name__ == "__main__":
    serve()
