"""The BM25 part at Wikipedia scale: a build in bounded memory, and a build killed -9 that resumes.

Each build runs in a process of its own (tests/lexical_worker.py) over real sentences of the
Simple English Wikipedia slice recombined into chunks, so a memory cap or a kill -9 hits it alone.
"""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lexical_worker import chunk_rows
from targ_mlx.index.lexical import build_lexical, lexical_dir, open_lexical

WORKER = Path(__file__).with_name("lexical_worker.py")
CAP_MB, HEAP_MB = 120, 30  # data memory a build may add; Tantivy's writer heap under it


def _build(engine: str, out: Path, n: int, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(WORKER), engine, str(out), str(n), *flags],
                          capture_output=True, text=True, timeout=600)


def test_a_tantivy_build_stays_under_a_memory_cap_that_the_bm25s_build_exceeds(tmp_path):
    cap = ("--cap-mb", str(CAP_MB))
    # bm25s holds every token of the corpus until its matrix is built: 40,000 chunks pass the cap
    old = _build("bm25s", tmp_path / "bm25s", 40_000, *cap)
    assert old.returncode != 0 and "MemoryError" in old.stderr, old.stderr[-500:]
    # Tantivy flushes a segment whenever its heap fills: twice the chunks under the same cap
    new = _build("tantivy", lexical_dir(tmp_path / "tantivy"), 80_000, *cap, "--heap-mb", str(HEAP_MB))
    assert new.returncode == 0, new.stderr[-500:]
    assert json.loads(new.stdout.splitlines()[-1])["passages"] == 80_000
    lex = open_lexical(tmp_path / "tantivy")
    assert len(lex) == 80_000 and lex.search(["river city history"], 5)[0]


def test_a_build_killed_9_between_commits_resumes_after_the_last_one_and_matches_a_whole_build(tmp_path):
    n, every = 60_000, 5_000
    out = lexical_dir(tmp_path / "killed")
    child = subprocess.Popen([sys.executable, str(WORKER), "tantivy", str(out), str(n), "--heap-mb", str(HEAP_MB),
                              "--commit-every", str(every)], stdout=subprocess.PIPE, text=True)
    committed = 0
    for line in child.stdout:
        if line.startswith("committed"):
            committed = int(line.split()[1])
            if committed >= 2 * every:  # two segments durable, the third being written: kill it now
                child.send_signal(signal.SIGKILL)
                break
    child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL and committed >= 2 * every
    assert out.with_name(out.name + ".tmp").is_dir() and not out.exists()  # nothing published half-built

    rows = chunk_rows(n)
    meta = build_lexical(rows, out, {"chunks": n})  # the same build again: it goes on
    assert committed <= meta["resumed_at"] < n and meta["passages"] == n
    whole = build_lexical(rows, lexical_dir(tmp_path / "whole"), {"chunks": n})
    assert whole["resumed_at"] == 0
    a, b = open_lexical(tmp_path / "killed"), open_lexical(tmp_path / "whole")
    assert len(a) == len(b) == n
    queries = [text[:80] for _, _, text in rows(n - 40)] + ["the history of the city", "what is a river"]
    for q in queries:
        assert a.search([q], 10) == b.search([q], 10)  # every chunk once: the same rankings, the same scores


def test_a_partial_build_of_other_rows_is_started_afresh(tmp_path):
    out = lexical_dir(tmp_path / "idx")
    rows = chunk_rows(3_000)
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True)
    (tmp / "source.json").write_text(json.dumps({"chunks": 999}))  # a stopped build of something else
    meta = build_lexical(rows, out, {"chunks": 3_000})
    assert meta["resumed_at"] == 0 and meta["passages"] == 3_000
    with pytest.raises(ValueError, match="ascending key order"):
        build_lexical(lambda after: [(5, "a", "b"), (4, "c", "d")], lexical_dir(tmp_path / "bad"), {"x": 1})
