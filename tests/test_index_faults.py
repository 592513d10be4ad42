"""Fault injection: your documents and their index survive kill -9, a second writer, readers
during an update, corrupt files, a read-only folder, a full disk and a shared decision log.

Every trial runs the real CLI (`targ_mlx.index.__main__.main`) with the real MiniLM encoder on a
tiny folder of real passages, each in a process of its own forked by tests/fault_worker.py (so a
kill costs no interpreter start), and ends either in a clean state or a one-line error; the
index is then resumed and compared with one built without a fault: the same passages rows and
the same vectors. The default form takes well under a minute on 2 cores;
TARG_FAULTS_LONG=1 runs many more kill trials.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from targ_mlx.index import open_retriever
from targ_mlx.index.lock import holder
from targ_mlx.index.store import PASSAGES, partial_dir
from targ_mlx.index.unfinished import resume_unfinished
from tests.conftest import _gold_rows, _write_pdf

REPO = Path(__file__).resolve().parents[1]
LONG = os.environ.get("TARG_FAULTS_LONG") == "1"
BUILD_KILLS = 60 if LONG else 12  # kill -9 trials of `index build`
ADD_KILLS = 40 if LONG else 8  # and of `index add`
ADDS_READ = 12 if LONG else 3  # `index add` runs while a reader opens and searches the index
SEED = int(os.environ.get("TARG_FAULTS_SEED", "26"))
FIGURES: dict[str, object] = {}  # printed at the end (-s): BENCHMARKS.md, row "fault injection"


class Worker:
    """Client of tests/fault_worker.py: start the CLI in a forked child, kill it, read its exit."""

    def __init__(self, scratch: Path):
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.scratch = scratch
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "fault_worker.py")], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}
        self._n = 0
        self._io = threading.Lock()

    def _ask(self, req: dict) -> dict:
        with self._io:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            return json.loads(self.proc.stdout.readline())

    def start(self, argv: list[str], **limits) -> dict:
        self._n += 1
        run = {"stdout": str(self.scratch / f"{self._n}.out"), "stderr": str(self.scratch / f"{self._n}.err")}
        run["pid"] = self._ask({"argv": [str(a) for a in argv], **run, **limits})["pid"]
        return run

    def wait(self, run: dict) -> tuple[int, str, str]:
        # waiting is the server's only blocking request: ask it without holding the pipe meanwhile
        rc = self._ask({"wait": run["pid"]})["rc"]
        return rc, Path(run["stdout"]).read_text(), Path(run["stderr"]).read_text()

    def run(self, argv: list[str], **limits) -> tuple[int, str, str]:
        return self.wait(self.start(argv, **limits))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = Worker(tmp_path_factory.mktemp("fault-io"))
    yield w
    w.close()
    if FIGURES:
        print("\nfault figures:", json.dumps(FIGURES, sort_keys=True))


def _notes(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(rows):
        (folder / f"n{i:02d}.md").write_text(r["passages"][0]["text"], encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def rows():
    return _gold_rows(24)


def _rows(index: Path) -> dict:
    with closing(sqlite3.connect(f"file:{index / PASSAGES}?mode=ro", uri=True)) as db:
        return {k: rest for k, *rest in db.execute("SELECT key, title, text, article, source, start, end FROM passages")}


def _vectors(index: Path) -> np.ndarray:
    from usearch.index import Index

    keys = np.asarray(sorted(_rows(index)), dtype=np.uint64)
    return np.stack(Index.restore(str(index / "vectors.usearch"), view=True).get(keys))


def _same_index(got: Path, want: Path) -> None:
    assert _rows(got) == _rows(want)
    np.testing.assert_array_equal(_vectors(got), _vectors(want))
    assert not partial_dir(got).exists()


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith(("WARNING", "Loading"))]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def _phase(out: Path) -> str:
    """Where a kill landed, read from what it left on disk."""
    part = partial_dir(out)
    if (out / "manifest.json").is_file():
        return "after publish"
    if not part.exists():
        return "before the first write"
    try:
        with closing(sqlite3.connect(f"file:{part / PASSAGES}?mode=ro", uri=True)) as db:
            tables = {t for (t,) in db.execute("SELECT name FROM sqlite_master")}
            if "pending" not in tables:
                return "graph built, finishing"
            return f"encoding ({db.execute('SELECT consumed FROM state').fetchone()[0]} chunks committed)"
    except sqlite3.Error:
        return "creating the partial"


def _kill_at_random(worker: Worker, argv: list[str], delay: float) -> int:
    run = worker.start(argv)
    time.sleep(delay)
    try:
        os.kill(run["pid"], signal.SIGKILL)
    except ProcessLookupError:
        pass
    rc, _, err = worker.wait(run)
    assert rc in (0, -signal.SIGKILL), err  # finished first, or killed: never a failure of its own
    return rc


def _timed(worker: Worker, argv: list[str]) -> float:
    t0 = time.perf_counter()
    rc, _, err = worker.run(argv)
    assert rc == 0, err
    return time.perf_counter() - t0


def test_kill_9_during_build_then_resume_gives_the_clean_index(worker, rows, tmp_path):
    notes = _notes(tmp_path / "notes", rows[:10])
    argv = lambda out: ["build", "--corpus", notes, "--out", out, "--commit-every", "1", "--quiet"]  # noqa: E731
    clean = tmp_path / "clean"
    span = _timed(worker, argv(clean))
    rng = random.Random(SEED)
    phases: dict[str, int] = {}
    for i in range(BUILD_KILLS):
        out = tmp_path / f"b{i}"
        _kill_at_random(worker, argv(out), rng.uniform(0, 1.15 * span))
        phase = _phase(out).split(" (")[0]
        phases[phase] = phases.get(phase, 0) + 1
        if (out / "manifest.json").is_file():
            open_retriever(out).close()  # what a kill leaves is never a torn index
        rc, _, err = worker.run(argv(out))  # the same command resumes
        assert rc == 0, err
        _same_index(out, clean)
        shutil.rmtree(out)
    FIGURES["build kills"] = {"trials": BUILD_KILLS, "failures": 0, "landed": phases}


def _docs_change(folder: Path, rows: list[dict]) -> None:
    """What each `add` trial brings in: one file edited, one removed, four new."""
    (folder / "n00.md").write_text(rows[10]["passages"][0]["text"], encoding="utf-8")
    (folder / "n01.md").unlink()
    for r in rows[11:15]:
        (folder / f"new-{r['qid']}.md").write_text(r["passages"][0]["text"], encoding="utf-8")


def test_kill_9_during_add_then_resume_gives_the_clean_update(worker, rows, tmp_path):
    notes = _notes(tmp_path / "notes", rows[:6])
    base = tmp_path / "base"
    assert worker.run(["build", "--corpus", notes, "--out", base, "--quiet"])[0] == 0
    _docs_change(notes, rows)
    add = lambda out: ["add", out, "--corpus", notes, "--commit-every", "1", "--quiet"]  # noqa: E731
    clean = shutil.copytree(base, tmp_path / "clean")
    span = _timed(worker, add(clean))
    rng = random.Random(SEED + 1)
    phases: dict[str, int] = {}
    for i in range(ADD_KILLS):
        out = shutil.copytree(base, tmp_path / f"a{i}")
        _kill_at_random(worker, add(out), rng.uniform(0, 1.15 * span))
        mid_swap = not out.exists()
        open_retriever(resume_unfinished(out)).close()  # a reader finds a whole index (old or new)
        kind = "published" if _rows(out) == _rows(clean) else "old index served"
        kind += " (killed mid-swap)" if mid_swap else ""
        phases[kind] = phases.get(kind, 0) + 1
        rc, _, err = worker.run(add(out))
        assert rc == 0, err
        _same_index(out, clean)
        shutil.rmtree(out)
    FIGURES["add kills"] = {"trials": ADD_KILLS, "failures": 0, "landed": phases}


def test_two_concurrent_adds_one_stops_with_one_line_one_waits(worker, rows, tmp_path):
    notes = _notes(tmp_path / "notes", rows[:4])
    out = tmp_path / "idx"
    assert worker.run(["build", "--corpus", notes, "--out", out, "--quiet"])[0] == 0
    clean = shutil.copytree(out, tmp_path / "clean")
    for r in rows[4:14]:
        (notes / f"new-{r['qid']}.md").write_text(r["passages"][0]["text"], encoding="utf-8")
    # one chunk per encode call in both: batching changes the vectors in the last bits
    assert worker.run(["add", clean, "--corpus", notes, "--commit-every", "1", "--quiet"])[0] == 0

    first = worker.start(["add", out, "--corpus", notes, "--commit-every", "1", "--quiet"])
    deadline = time.monotonic() + 30
    while holder(out).get("pid") != first["pid"]:  # the first add holds the lock
        assert time.monotonic() < deadline
        time.sleep(0.005)
    second = worker.start(["add", out, "--corpus", notes, "--quiet"])
    third = worker.start(["add", out, "--corpus", notes, "--quiet", "--wait"])
    rc2, _, err2 = worker.wait(second)
    rc1, out1, err1 = worker.wait(first)
    rc3, out3, err3 = worker.wait(third)
    assert rc1 == 0 and "10 new or changed file(s)" in out1, err1
    line = _one_line(err2)
    assert rc2 == 2 and f"is being written by pid {first['pid']}" in line and "add" in line and "--wait" in line
    assert "Errno" not in err2
    assert rc3 == 0 and "up to date" in out3 and "waiting" in err3, err3
    _same_index(out, clean)


def test_readers_answer_throughout_repeated_adds(worker, rows, tmp_path):
    from targ_mlx.index import load_encoder

    notes = _notes(tmp_path / "notes", rows[:4])
    out = tmp_path / "idx"
    assert worker.run(["build", "--corpus", notes, "--out", out, "--quiet"])[0] == 0
    query = load_encoder().encode_queries([rows[0]["question"]])
    held = open_retriever(out)  # opened before every add: its mapped files stay valid after the swap
    titles = {f"notes/n{i:02d}.md" for i in range(4)} | {f"notes/extra{k}.md" for k in range(ADDS_READ)}
    reads = 0
    for k in range(ADDS_READ):
        (notes / f"extra{k}.md").write_text(rows[5 + k]["passages"][0]["text"], encoding="utf-8")
        if k:
            (notes / f"extra{k - 1}.md").unlink()
        run = worker.start(["add", out, "--corpus", notes, "--commit-every", "1", "--quiet"])
        result = {}
        waiter = threading.Thread(target=lambda: result.update(rc=worker.wait(run)))
        waiter.start()
        while waiter.is_alive() or not reads:
            r = open_retriever(out)  # opening during the swap: the old or the new index, whole
            for found in (r.search_vectors(query, 3)[0], held.search_vectors(query, 3)[0]):
                assert found and {p.title for p in found} <= titles
            r.close()
            reads += 1
        waiter.join()
        assert result["rc"][0] == 0, result["rc"][2]
    assert open_retriever(out).search_vectors(query, 10)[0]
    FIGURES["reads during adds"] = {"adds": ADDS_READ, "reads": reads, "failures": 0}


def test_a_corrupt_file_of_each_type_is_skipped_or_a_one_line_error(worker, rows, tmp_path):
    notes = _notes(tmp_path / "notes", rows[:2])
    _write_pdf(tmp_path / "whole.pdf", [rows[2]["passages"][0]["text"], rows[3]["passages"][0]["text"]])
    whole = (tmp_path / "whole.pdf").read_bytes()
    (notes / "truncated.pdf").write_bytes(whole[: len(whole) // 2])
    (notes / "garbage.pdf").write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 8)
    (notes / "latin1.txt").write_bytes("d\xe9j\xe0 vu, cr\xe8me br\xfbl\xe9e. ".encode("latin-1") * 20)
    (notes / "utf16.md").write_bytes(("# Notes\n\n" + rows[2]["passages"][0]["text"]).encode("utf-16"))
    (notes / "binary.html").write_bytes(b"<html><body>\xff\xfe\x00\x81" + bytes(range(256)) * 4)
    out = tmp_path / "idx"
    rc, shown, err = worker.run(["build", "--corpus", notes, "--out", out, "--quiet"])
    assert rc == 0, err
    skipped = {line.split("/")[-1].split(":")[0] for line in shown.splitlines() if line.startswith("skipped")}
    assert {"garbage.pdf", "latin1.txt", "utf16.md"} <= skipped
    # a PDF cut in half may still give its first page; a page with stray bytes is still a page
    assert skipped <= {"garbage.pdf", "truncated.pdf", "latin1.txt", "utf16.md", "binary.html"}
    r = open_retriever(out)
    assert {"notes/n00.md", "notes/n01.md"} <= {t for t, *_ in _rows(out).values()} and len(r)

    rc, _, err = worker.run(["build", "--corpus", notes, "--out", tmp_path / "strict", "--strict", "--quiet"])
    line = _one_line(err)
    assert rc == 2 and line.startswith("error: --strict: ") and "garbage.pdf" in line and "latin1.txt" in line
    assert not (tmp_path / "strict").exists() and not partial_dir(tmp_path / "strict").exists()

    for good in ("n00.md", "n01.md"):
        (notes / good).unlink()
    for bad in set(skipped) ^ {"garbage.pdf", "latin1.txt", "utf16.md", "truncated.pdf", "binary.html"}:
        (notes / bad).unlink()  # only unreadable files left
    rc, _, err = worker.run(["build", "--corpus", notes, "--out", tmp_path / "empty", "--quiet"])
    assert rc == 2 and "yielded no passages" in _one_line(err)
    assert not (tmp_path / "empty").exists() and not partial_dir(tmp_path / "empty").exists()


@pytest.fixture
def readonly_root(tmp_path):
    """A folder this process's writers cannot write: chmod for a user, another uid for root."""
    root = Path(tempfile.mkdtemp(prefix="targ-ro-"))
    root.chmod(0o755)
    yield root
    for p in [root, *root.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(root)


def test_a_read_only_index_folder_is_a_one_line_error(worker, rows, readonly_root):
    notes = _notes(readonly_root / "notes", rows[:3])
    for p in [notes, *notes.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    out = readonly_root / "idx"
    assert worker.run(["build", "--corpus", notes, "--out", out, "--quiet"])[0] == 0
    before = _rows(out)
    (notes / "new.md").write_text(rows[3]["passages"][0]["text"], encoding="utf-8")
    (notes / "new.md").chmod(0o644)
    as_other = {"uid": 65534} if os.geteuid() == 0 else {}
    if not as_other:
        for p in (readonly_root, out):
            p.chmod(0o555)
    for argv in (["add", out, "--corpus", notes, "--quiet"],
                 ["build", "--corpus", notes, "--out", readonly_root / "other", "--quiet"]):
        rc, _, err = worker.run(argv, **as_other)
        line = _one_line(err)
        assert rc == 2 and "cannot write" in line and "fix:" in line, err
    assert _rows(out) == before and len(open_retriever(out)) == len(before)  # still served


def test_a_write_failure_mid_build_leaves_a_resumable_state(worker, rows, tmp_path):
    notes = _notes(tmp_path / "notes", rows[:8])
    argv = lambda out: ["build", "--corpus", notes, "--out", out, "--commit-every", "1", "--quiet"]  # noqa: E731
    clean = tmp_path / "clean"
    assert worker.run(argv(clean))[0] == 0
    outcomes = {}
    for limit in (4 << 10, 208 << 10, 256 << 10):  # the disk fills at each size
        out, line = tmp_path / f"f{limit}", None
        rc, _, err = worker.run(argv(out), fsize=limit)
        if rc:
            line = _one_line(err)
            assert rc == 2 and "cannot write" in line and "fix:" in line, err
            assert not (out / "manifest.json").exists()
        rc, _, err = worker.run(argv(out))
        assert rc == 0, err
        _same_index(out, clean)
        outcomes[f"{limit >> 10} KiB"] = "one-line error, resumed" if line else "fit"
    assert any(v.startswith("one-line") for v in outcomes.values())
    FIGURES["disk full (RLIMIT_FSIZE)"] = outcomes


LOG_WRITER = """
import sys
from targ_mlx.log.decisions import DecisionLog
from targ_mlx.records import Answer
path, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
log = DecisionLog(path)
for i in range(n):
    a = Answer(question=f"{tag} q{i}", answer="a", model="m", gate="margin", tau=0.3, score=i / n,
               retrieved=i % 2 == 0, scores={"margin": i / n})
    print(log.record(a, source="eval", session=tag), flush=True)
"""


def test_three_processes_write_the_decision_log_and_no_row_is_lost(tmp_path):
    """Three writers at once, one of them killed -9 mid-way: every committed row is there."""
    from targ_mlx.log.decisions import DecisionLog

    path = tmp_path / "decisions.db"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    spawn = lambda n, tag: subprocess.Popen([sys.executable, "-c", LOG_WRITER, str(path), str(n), tag],  # noqa: E731
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    writers = {tag: spawn(300, tag) for tag in ("w0", "w1", "w2")}
    killed = writers["w2"]
    seen = [killed.stdout.readline() for _ in range(60)]  # 60 rows committed, then kill -9
    killed.send_signal(signal.SIGKILL)
    out2 = killed.stdout.read()  # not communicate(): it would skip lines readline() buffered
    killed.wait()
    written = {"w2": [int(x) for x in seen + out2.split() if x.strip()]}
    for tag in ("w0", "w1"):
        out, err = writers[tag].communicate(timeout=120)
        assert writers[tag].returncode == 0 and "Traceback" not in err, err
        written[tag] = [int(x) for x in out.split()]
    after = spawn(20, "w3")  # the log is not left locked by the killed writer
    out, err = after.communicate(timeout=60)
    assert after.returncode == 0, err
    written["w3"] = [int(x) for x in out.split()]

    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        read = {tag: [i for (i,) in db.execute("SELECT id FROM decisions WHERE session = ? ORDER BY id", (tag,))]
                for tag in written}
    for tag in ("w0", "w1", "w3"):
        assert read[tag] == written[tag]
    # the killed writer may have committed one row it had not yet printed
    assert read["w2"][: len(written["w2"])] == written["w2"] and len(read["w2"]) - len(written["w2"]) in (0, 1)
    assert DecisionLog(path).count() == sum(map(len, read.values()))
    FIGURES["decision log"] = {"processes": 3, "killed": 1, "rows written": sum(map(len, written.values())),
                               "rows read": sum(map(len, read.values()))}


def test_an_add_killed_between_its_two_renames_is_published_by_the_next_reader(worker, rows, tmp_path):
    """kill -9 between `DIR -> DIR.old` and `DIR.partial -> DIR` (a window too short for the random
    kills to hit reliably): the folder is missing; the next entry point finishes the swap."""
    from targ_mlx.index import ensure_index

    notes = _notes(tmp_path / "notes", rows[:3])
    out = tmp_path / "idx"
    assert worker.run(["build", "--corpus", notes, "--out", out, "--quiet"])[0] == 0
    new = shutil.copytree(out, tmp_path / "new")
    (notes / "more.md").write_text(rows[3]["passages"][0]["text"], encoding="utf-8")
    assert worker.run(["add", new, "--corpus", notes, "--quiet"])[0] == 0
    os.replace(out, tmp_path / "idx.old")  # what the killed publish left
    shutil.copytree(new, partial_dir(out))
    r = open_retriever(ensure_index(out))  # as ask, chat and the eval open it
    assert len(r) == len(_rows(new)) and _rows(out) == _rows(new)
    assert not (tmp_path / "idx.old").exists() and not partial_dir(out).exists()
    rc, shown, err = worker.run(["add", out, "--corpus", notes, "--quiet"])
    assert rc == 0 and "up to date" in shown, err
