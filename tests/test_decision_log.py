import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from sqlite_utils import Database

from targ_mlx.calibration.rows import score_rows
from targ_mlx.log.decisions import (
    SCHEMA_VERSION,
    DecisionLog,
    DecisionLogLockedError,
    SchemaVersionError,
    UnknownDecisionError,
)
from targ_mlx.records import Answer, Latency, PassageRef, TokenCounts

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_db():
    return Database(memory=True)


@pytest.fixture
def log(fresh_db):
    return DecisionLog(fresh_db)


def answer(**overrides) -> Answer:
    fields = dict(
        question="who wrote 'Middlemarch'?",
        answer="George Eliot",
        model="smollm2-135m",
        gate="margin",
        tau=0.35,
        score=0.5,
        retrieved=True,
        scores={"margin": 0.5, "entropy": 1.25},
        passages=(PassageRef(17, "Middlemarch", 0.81, "Middlemarch is a novel..."),),
        tokens=TokenCounts(prompt=30, draft=20, context=400, output=5),
        latency=Latency(
            draft=0.2, gate=0.0001, retrieval=0.05, prefill=0.3, decode=0.1, total=0.65
        ),
    )
    fields.update(overrides)
    return Answer(**fields)


def test_record_round_trip(log):
    row_id = log.record(
        answer(),
        source="eval",
        session="run-1",
        index_id="wiki-2026",
        gold=["George Eliot", "Mary Ann Evans"],
        em=1.0,
        f1=1.0,
        branches={"never": {"answer": "Jane Austen", "em": 0.0, "f1": 0.0}},
        extra={"dataset": "nq"},
    )
    row = log.get(row_id)
    assert row["query"] == "who wrote 'Middlemarch'?"
    assert (row["source"], row["session"], row["index_id"]) == (
        "eval",
        "run-1",
        "wiki-2026",
    )
    assert (
        row["gate"],
        row["k"],
        row["beta"],
        row["n_samples"],
        row["temperature"],
    ) == ("margin", 20, 3.0, 5, 0.7)
    assert (
        row["tau"],
        row["u"],
        row["u_margin"],
        row["u_entropy"],
        row["u_variance"],
    ) == (0.35, 0.5, 0.5, 1.25, None)
    assert row["retrieved"] == 1
    assert row["passages"] == [{"key": 17, "title": "Middlemarch", "score": 0.81}]
    assert (
        row["tok_prompt"],
        row["tok_draft"],
        row["tok_context"],
        row["tok_output"],
    ) == (30, 20, 400, 5)
    assert (row["lat_draft"], row["lat_total"]) == (0.2, 0.65)
    assert row["gold"] == ["George Eliot", "Mary Ann Evans"]
    # The retrieved answer is the "always" branch; "never" came from the counterfactual run.
    assert (row["em"], row["em_always"], row["f1_always"], row["em_never"]) == (
        1.0,
        1.0,
        1.0,
        0.0,
    )
    assert row["branches"]["never"]["answer"] == "Jane Austen"
    assert row["extra"] == {"dataset": "nq"}
    assert row["ts"].endswith("Z")


def test_never_gate_stores_null_tau_and_score(log):
    row = log.get(
        log.record(
            answer(gate="never", tau=float("inf"), score=None, retrieved=False),
            source="ask",
        )
    )
    assert (row["tau"], row["u"], row["retrieved"]) == (None, None, 0)


def test_numpy_scores_are_stored_as_floats(log):
    u = np.float32(0.25)
    row = log.get(log.record(answer(score=u, scores={"margin": u}), source="ask"))
    assert (row["u"], row["u_margin"]) == (0.25, 0.25)


def test_user_text_is_stored_verbatim(log):
    nasty = "Robert'); DROP TABLE decisions;-- \u00e9\u4e2d\u6587 \x00?"
    row_id = log.record(answer(question=nasty, answer=nasty), source="chat")
    log.add_message("s", "user", nasty)
    assert log.get(row_id)["query"] == nasty
    assert log.messages("s")[0].text == nasty
    assert log.count() == 1


def test_record_rejects_unknown_source(log):
    with pytest.raises(
        ValueError, match="source must be one of chat, eval, ask; got 'cli'"
    ):
        log.record(answer(), source="cli")


def test_feedback(log):
    row_id = log.record(answer(), source="chat")
    log.feedback(row_id, "wrong")
    log.feedback(row_id, "correct", note="it was right after all")
    [row] = score_rows(log, "margin", 20)
    assert row.label == "correct"  # the latest label wins
    with pytest.raises(
        ValueError,
        match="label must be one of correct, wrong, helpful, unhelpful; got 'meh'",
    ):
        log.feedback(row_id, "meh")
    with pytest.raises(
        UnknownDecisionError, match="No decision with id 99 in :memory:"
    ):
        log.feedback(99, "correct")


def test_scores_filters(log, fresh_db):
    log.record(answer(), source="eval")  # margin row
    log.record(
        answer(gate="entropy", score=1.1, scores={"entropy": 1.1, "margin": 0.7}),
        source="chat",
    )
    log.record(answer(k=10, scores={"margin": 0.2}), source="eval")
    log.record(answer(model="qwen", scores={"margin": 0.3}), source="eval")
    log.record(answer(scores={"entropy": 0.4}), source="eval")  # no margin
    old = log.record(answer(scores={"margin": 0.9}), source="eval")
    fresh_db.execute(
        "UPDATE decisions SET ts = '2020-01-01T00:00:00.000000Z' WHERE id = ?", [old]
    )
    fresh_db.conn.commit()

    # Rows decided by another gate still count: they logged a margin score.
    assert [r.u for r in score_rows(log, "margin", 20)] == [0.5, 0.7, 0.3, 0.9]
    assert [r.u for r in score_rows(log, "margin", 10)] == [0.2]
    assert [r.u for r in score_rows(log, "margin", 20, model="qwen")] == [0.3]
    assert [r.u for r in score_rows(log, "margin", 20, source="chat")] == [0.7]
    since = datetime.now(timezone.utc) - timedelta(days=7)
    assert [r.u for r in score_rows(log, "margin", 20, since=since)] == [0.5, 0.7, 0.3]
    assert [r.gate for r in score_rows(log, "margin", 20, source="chat")] == ["entropy"]
    assert len(score_rows(log, "margin", 20, beta=2.0)) == 0
    with pytest.raises(
        ValueError, match="gate must be one of entropy, margin, variance, evidence; got 'never'"
    ):
        score_rows(log, "never", 20)


def test_rows_newest_first(log):
    ids = [log.record(answer(question=f"q{i}"), source="ask") for i in range(3)]
    assert [r["id"] for r in log.rows()] == ids[::-1]
    assert [r["query"] for r in log.rows(limit=1)] == ["q2"]


def test_messages_and_sessions(log):
    decision = log.record(answer(), source="chat", session="a")
    log.add_message("a", "user", "who wrote Middlemarch?")
    log.add_message("a", "assistant", "George Eliot", decision_id=decision)
    log.add_message("b", "user", "x" * 200)
    sessions = log.sessions()
    assert [s.session for s in sessions] == ["b", "a"]
    assert sessions[1].n_messages == 2 and sessions[1].title == "who wrote Middlemarch?"
    assert sessions[0].title == "x" * 80
    msgs = log.messages("a")
    assert [(m.role, m.text, m.decision_id) for m in msgs] == [
        ("user", "who wrote Middlemarch?", None),
        ("assistant", "George Eliot", decision),
    ]
    with pytest.raises(
        ValueError, match="role must be one of user, assistant, system; got 'bot'"
    ):
        log.add_message("a", "bot", "hi")
    with pytest.raises(
        UnknownDecisionError, match="No decision with id 999 in :memory:"
    ):
        log.add_message("a", "assistant", "hi", decision_id=999)


def test_file_is_wal_with_schema_and_indexes(tmp_path):
    path = tmp_path / "new" / "decisions.db"
    with DecisionLog(path) as log:
        log.record(answer(), source="ask")
    db = Database(path)
    assert db.journal_mode == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert {"decisions", "feedback", "messages"} <= set(db.table_names())
    indexed = {tuple(i.columns) for i in db["decisions"].indexes}
    assert ("ts",) in indexed and ("gate", "k", "model") in indexed
    # Reopening keeps the rows and does not migrate again.
    with DecisionLog(path) as log:
        assert log.count() == 1 and log.schema_version == SCHEMA_VERSION


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "d.db"
    DecisionLog(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(
        SchemaVersionError, match=f"has schema version {SCHEMA_VERSION + 1}, newer"
    ):
        DecisionLog(path)


def hold_write_lock(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def test_locked_file_waits_then_writes(tmp_path):
    path = tmp_path / "d.db"
    log = DecisionLog(path, lock_timeout=30)
    other = hold_write_lock(path)
    threading.Timer(
        3.0, lambda: other.execute("COMMIT")
    ).start()  # longer than busy_timeout
    start = time.monotonic()
    row_id = log.record(answer(), source="chat")
    assert time.monotonic() - start >= 2.5
    assert log.get(row_id)["id"] == row_id


def test_locked_file_gives_one_clear_error(tmp_path):
    path = tmp_path / "d.db"
    log = DecisionLog(path, lock_timeout=0.5)
    other = hold_write_lock(path)
    try:
        with pytest.raises(DecisionLogLockedError) as e:
            log.record(answer(), source="chat")
        assert str(e.value).startswith(f"Decision log {path} stayed locked for 0.5 s")
    finally:
        other.execute("ROLLBACK")
    assert log.count() == 0


# Runs in a child process: writes N decisions, printing each id once it is committed.
WRITER = """
import sys
from targ_mlx.log.decisions import DecisionLog
from targ_mlx.records import Answer
path, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
log = DecisionLog(path)
for i in range(n):
    a = Answer(question=f"{tag} q{i}", answer="a", model="m", gate="margin", tau=0.3,
               score=i / n, retrieved=i % 3 == 0, scores={"margin": i / n})
    row_id = log.record(a, source="eval", session=tag)
    print(row_id, flush=True)
"""


def spawn_writer(path: Path, n: int, tag: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(n), tag],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_four_processes_write_2000_rows(tmp_path):
    path = tmp_path / "shared.db"  # not created yet: the writers race on the schema too
    writers = [spawn_writer(path, 500, f"w{i}") for i in range(4)]
    results = [w.communicate(timeout=120) for w in writers]
    for w, (out, err) in zip(writers, results):
        assert "locked" not in err.lower(), err
        assert w.returncode == 0, err
        assert len(out.split()) == 500
    ids = [int(x) for out, _ in results for x in out.split()]
    assert len(set(ids)) == 2000
    db = Database(path)
    assert db.execute("SELECT count(*) FROM decisions").fetchone()[0] == 2000
    per_writer = dict(
        db.execute(
            "SELECT session, count(*) FROM decisions GROUP BY session"
        ).fetchall()
    )
    assert per_writer == {f"w{i}": 500 for i in range(4)}


def test_kill_9_mid_stream_keeps_every_committed_row(tmp_path):
    path = tmp_path / "crash.db"
    writer = spawn_writer(path, 1_000_000, "doomed")
    committed = []
    for line in writer.stdout:  # wait until it is well into its stream
        committed.append(int(line))
        if len(committed) >= 300:
            break
    os.kill(writer.pid, signal.SIGKILL)
    # Read through the same buffered file: communicate() would skip lines already buffered.
    rest = writer.stdout.read()
    writer.stderr.read()
    writer.wait(timeout=30)
    committed += [int(x) for x in rest.split()]
    assert writer.returncode == -signal.SIGKILL

    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    stored = {row[0] for row in conn.execute("SELECT id FROM decisions")}
    assert set(committed) <= stored
    assert (
        len(stored) - len(committed) <= 1
    )  # at most the row committed but not yet printed
    conn.close()
    with DecisionLog(path) as log:  # and it is still writable
        log.record(answer(), source="chat")
        assert log.count() == len(stored) + 1


def test_a_log_written_before_the_split_opens_unchanged(tmp_path):
    """tests/data/decisions_v1.db was written by the one-module decision_log (commit 896a883) and
    decisions_v1.json holds what that code read back; the split modules read the same."""
    import dataclasses
    import json
    import shutil

    data = REPO / "tests" / "data"
    path = tmp_path / "decisions.db"
    shutil.copy(data / "decisions_v1.db", path)
    want = json.loads((data / "decisions_v1.json").read_text(encoding="utf-8"))
    with DecisionLog(path) as old:
        assert old.schema_version == SCHEMA_VERSION == 1
        assert old.rows() == want["rows"]
        assert [dataclasses.asdict(m) for m in old.messages("s1")] == want["messages"]
        assert [dataclasses.asdict(s) for s in old.sessions()] == want["sessions"]
        assert [dataclasses.asdict(r) for r in score_rows(old, "margin", 20)] == want["scores"]
        # and it still takes writes of every kind
        new_id = old.record(answer(), source="ask")
        old.feedback(new_id, "wrong")
        old.add_message("s1", "assistant", "again", new_id)
        assert old.count() == len(want["rows"]) + 1


def test_chat_turn_keeps_searched_query_and_history(log):
    ans = answer(question="when was he born?", search_query="who painted the mona lisa when was he born?",
                 history_turns=1)
    row = log.get(log.record(ans, source="chat", session="s"))
    assert row["extra"] == {"search_query": "who painted the mona lisa when was he born?", "history_turns": 1}
    plain = log.get(log.record(answer(search_query="who wrote 'Middlemarch'?"), source="chat", session="s"))
    assert plain["extra"] is None  # a single-turn answer searched as asked adds nothing


def test_every_signal_of_a_search_first_decision_round_trips(log):
    """The evidence gate's score, what the search found (read or not), the reason and 'no good
    source' come back from the log, and its scores recalibrate like a paper gate's."""
    found = (PassageRef(3, "Mona Lisa", 0.63), PassageRef(9, "Louvre", 0.41))
    for i in range(3):
        ans = answer(gate="evidence", tau=0.2, score=0.1 * i, retrieved=False, passages=(), found=found, searched=True,
                     scores={"margin": 0.5, "entropy": 1.25, "evidence": 0.1 * i}, no_source=i == 0,
                     reason="weak evidence (best 0.63, Mona Lisa) → answered from memory", confirmed=i == 2)
        row = log.get(log.record(ans, source="ask"))
    assert row["extra"]["scores"] == {"margin": 0.5, "entropy": 1.25, "evidence": pytest.approx(0.2)}
    assert row["extra"]["found"] == [[3, "Mona Lisa", 0.63], [9, "Louvre", 0.41]]
    assert row["extra"]["reason"].startswith("weak evidence") and row["extra"]["no_source"] is False
    assert row["extra"]["confirmed"] is True  # the passages held the draft's answer
    assert row["u"] == pytest.approx(0.2) and row["u_margin"] == 0.5 and row["passages"] == []
    assert [r.u for r in score_rows(log, "evidence", 20)] == pytest.approx([0.0, 0.1, 0.2])


def test_the_log_loads_sqlite_utils_without_pandas_and_pandas_still_imports_after(tmp_path):
    """sqlite-utils imports pandas whenever it is installed (0.23 s of every `targ ask` start,
    for a type this log never stores): the log loads it with pandas hidden; a decision is written
    and read back, and pandas imports as usual afterwards."""
    pytest.importorskip("pandas")
    code = """
import sys
from targ_mlx.log.decisions import DecisionLog
from targ_mlx.records import Answer
log = DecisionLog(sys.argv[1])
log.record(Answer(question="q", answer="a", model="m", gate="margin", tau=0.3, score=0.1, retrieved=False,
                  scores={"margin": 0.1}), source="eval", session="s")
print("pandas" in sys.modules, log.count())
import pandas
print(pandas.DataFrame({"a": [1, 2]}).shape)
"""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "log.db")], capture_output=True, text=True,
                         env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == ["False 1", "(2, 1)"]
