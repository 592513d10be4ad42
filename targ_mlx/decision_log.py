"""The decision log: every gate decision, its scores, cost and outcome, in one SQLite file.

Tables (browse them with `sqlite-utils` or `datasette decisions.db`; see docs/decision_log.md):
  decisions  one row per answered question (chat, eval or ask)
  feedback   user labels on a decision: correct | wrong | helpful | unhelpful
  messages   the chat app's transcript, linked to the decision behind each answer

Several processes may write one file at once (the chat app and an eval run), so the file is
in WAL mode, each write is one short `BEGIN IMMEDIATE` transaction, and a busy database is
retried with backoff instead of surfacing "database is locked". User text only ever goes in
as query parameters. Threshold maths is in `calibration.py`; this module only stores rows.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from sqlite_utils import Database

from targ_mlx.errors import TargError
from targ_mlx.records import Answer

logger = logging.getLogger(__name__)

SOURCES = ("chat", "eval", "ask")
LABELS = ("correct", "wrong", "helpful", "unhelpful")
POSITIVE_LABELS = ("correct", "helpful")
ROLES = ("user", "assistant", "system")
SCORE_GATES = ("entropy", "margin", "variance")

DEFAULT_LOCK_TIMEOUT = (
    60.0  # seconds a write keeps retrying a locked file before giving up
)
_BUSY_TIMEOUT_MS = (
    2000  # SQLite's own wait per attempt, before our retry loop backs off
)

T = TypeVar("T")


class DecisionLogError(TargError):
    """Base class for decision log errors."""


class DecisionLogLockedError(DecisionLogError):
    """Another process held the write lock for longer than the timeout."""


class SchemaVersionError(DecisionLogError):
    """The file was written by a newer targ-mlx than this one."""


class UnknownDecisionError(DecisionLogError):
    """A decision id that is not in the log."""


# Each migration is a list of statements, applied in one transaction; the index + 1 is the
# schema version it produces (stored in PRAGMA user_version). Append, never edit.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE decisions (
            id INTEGER PRIMARY KEY,
            ts TEXT NOT NULL,                 -- UTC, ISO 8601 with microseconds and Z
            source TEXT NOT NULL CHECK (source IN ('chat', 'eval', 'ask')),
            session TEXT,
            model TEXT NOT NULL,
            index_id TEXT,                    -- manifest id of the index used
            query TEXT NOT NULL,
            gate TEXT NOT NULL,
            k INTEGER, beta REAL, n_samples INTEGER, temperature REAL,
            tau REAL,                         -- NULL for never (+inf) / always (-inf)
            u REAL,                           -- U of the deciding gate
            u_entropy REAL, u_margin REAL, u_variance REAL,  -- every score the draft gave
            retrieved INTEGER NOT NULL,
            rechecked_at INTEGER,
            passages TEXT,                    -- JSON [{key, title, score}]
            tok_prompt INTEGER, tok_draft INTEGER, tok_context INTEGER,
            tok_output INTEGER, tok_samples INTEGER,
            lat_draft REAL, lat_gate REAL, lat_retrieval REAL,
            lat_prefill REAL, lat_decode REAL, lat_total REAL,
            answer TEXT,
            finish_reason TEXT,
            gold TEXT,                        -- JSON list of gold answers (eval)
            em REAL, f1 REAL,                 -- of the answer given
            em_never REAL, f1_never REAL,     -- counterfactual branches (eval)
            em_always REAL, f1_always REAL,
            branches TEXT,                    -- JSON {"never": {...}, "always": {...}}
            extra TEXT                        -- JSON, anything else the caller wants kept
        )""",
        "CREATE INDEX idx_decisions_ts ON decisions (ts)",
        "CREATE INDEX idx_decisions_gate ON decisions (gate, k, model)",
        "CREATE INDEX idx_decisions_source_ts ON decisions (source, ts)",
        "CREATE INDEX idx_decisions_session ON decisions (session)",
        """CREATE TABLE feedback (
            id INTEGER PRIMARY KEY,
            decision_id INTEGER NOT NULL REFERENCES decisions (id),
            label TEXT NOT NULL
                CHECK (label IN ('correct', 'wrong', 'helpful', 'unhelpful')),
            note TEXT,
            ts TEXT NOT NULL
        )""",
        "CREATE INDEX idx_feedback_decision ON feedback (decision_id)",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            session TEXT NOT NULL,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
            text TEXT NOT NULL,
            decision_id INTEGER REFERENCES decisions (id),
            ts TEXT NOT NULL
        )""",
        "CREATE INDEX idx_messages_session ON messages (session, id)",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)

_DECISION_COLUMNS = (
    "ts source session model index_id query gate k beta n_samples temperature tau u "
    "u_entropy u_margin u_variance retrieved rechecked_at passages tok_prompt tok_draft "
    "tok_context tok_output tok_samples lat_draft lat_gate lat_retrieval lat_prefill "
    "lat_decode lat_total answer finish_reason gold em f1 em_never f1_never em_always "
    "f1_always branches extra"
).split()
_INSERT_DECISION = (
    f"INSERT INTO decisions ({', '.join(_DECISION_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_DECISION_COLUMNS))})"
)


def utc_now() -> str:
    """Timestamp in the log's format; its string order is time order."""
    return format_ts(datetime.now(timezone.utc))


def format_ts(when: datetime) -> str:
    if when.tzinfo is None:
        raise ValueError(
            f"timestamp {when!r} has no timezone; pass an aware datetime (UTC)"
        )
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _is_busy(error: sqlite3.OperationalError) -> bool:
    msg = str(error).lower()
    return "locked" in msg or "busy" in msg


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _float(x: Any) -> float | None:
    return None if x is None else float(x)


def _finite_or_none(x: float | None) -> float | None:
    # SQLite has no infinity literal in JSON and Datasette shows it oddly: never/always -> NULL.
    return None if x is None or x in (float("inf"), float("-inf")) else float(x)


@dataclass(frozen=True)
class ScoreRow:
    """What calibration needs from one logged decision."""

    id: int
    source: str
    model: str
    gate: str  # the gate that made this row's decision
    u: float  # U of the gate asked for in `scores()`, not necessarily the deciding one
    retrieved: bool
    em_never: float | None
    em_always: float | None
    f1_never: float | None
    f1_always: float | None
    label: str | None  # latest feedback label, if any


@dataclass(frozen=True)
class Message:
    id: int
    session: str
    role: str
    text: str
    decision_id: int | None
    ts: str


@dataclass(frozen=True)
class SessionSummary:
    session: str
    started: str  # ts of the first message
    last: str  # ts of the latest message
    n_messages: int
    title: str  # first user message, cut to 80 characters


class DecisionLog:
    """Read and write the decision log.

    Args:
        db: a path (created with its parent folder if missing) or an open sqlite-utils
            `Database` (e.g. `Database(memory=True)` in tests), which the caller owns.
        lock_timeout: seconds a write retries a locked file before raising
            `DecisionLogLockedError` (default `DEFAULT_LOCK_TIMEOUT`).
    """

    def __init__(
        self,
        db: str | os.PathLike | Database,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ):
        self.lock_timeout = lock_timeout
        # One connection shared by the TUI's UI and worker threads, serialised by this lock.
        self._lock = threading.RLock()
        if isinstance(db, Database):
            self.db = db
            self.path = _db_file(db)
        else:
            self.path = str(db)
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False)
            self.db = Database(conn)
        self._configure()
        self._migrate()

    # -- setup ---------------------------------------------------------------------------

    def _configure(self) -> None:
        conn = self.db.conn
        busy_ms = int(min(_BUSY_TIMEOUT_MS, self.lock_timeout * 1000))
        conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
        conn.execute("PRAGMA foreign_keys = ON")
        if self.path == ":memory:":
            return
        # WAL lets readers (Datasette, calibrate) run beside a writer. Switching needs an
        # exclusive lock, and SQLite answers the old mode instead of an error while another
        # connection holds one, so loop until it sticks (the mode persists in the file).
        self._retry(lambda: self._enable_wal(conn))
        # NORMAL in WAL mode survives a killed process (only power loss can drop the last
        # commits) and keeps a write well under a millisecond: no fsync per commit.
        conn.execute("PRAGMA synchronous = NORMAL")

    @staticmethod
    def _enable_wal(conn: sqlite3.Connection) -> None:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise sqlite3.OperationalError(
                f"database is locked (journal_mode stayed {mode})"
            )

    def _migrate(self) -> None:
        def step() -> None:
            version = self.db.conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"Decision log {self.path} has schema version {version}, newer than this "
                    f"targ-mlx understands ({SCHEMA_VERSION}); upgrade targ-mlx or use another --db"
                )
            for number in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[number]:
                    self.db.conn.execute(statement)
                self.db.conn.execute(f"PRAGMA user_version = {number + 1}")

        # Checked again inside the write transaction: another process may migrate first.
        if self._retry(lambda: self.schema_version) != SCHEMA_VERSION:
            self._write(step)

    @property
    def schema_version(self) -> int:
        return self.db.conn.execute("PRAGMA user_version").fetchone()[0]

    def close(self) -> None:
        self.db.conn.close()

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------

    def _retry(self, fn: Callable[[], T]) -> T:
        """Run fn, retrying with jittered exponential backoff while the file is locked."""
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.005
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as e:
                if not _is_busy(e):
                    raise
                if time.monotonic() >= deadline:
                    raise DecisionLogLockedError(
                        f"Decision log {self.path} stayed locked for {self.lock_timeout:g} s; "
                        "another process holds it (close it, or log to another --db)"
                    ) from None
                logger.debug("decision log busy (%s); retrying in %.3f s", e, delay)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.5)

    def _write(self, fn: Callable[[], T]) -> T:
        """Run fn in one BEGIN IMMEDIATE transaction, retried as a whole while locked."""
        conn = self.db.conn

        def attempt() -> T:
            with self._lock:
                # IMMEDIATE takes the write lock up front, so the transaction never has to
                # upgrade a read lock (which SQLite fails at once instead of waiting).
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = fn()
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return result

        return self._retry(attempt)

    def record(
        self,
        answer: Answer,
        *,
        source: str,
        session: str | None = None,
        index_id: str | None = None,
        gold: list[str] | None = None,
        em: float | None = None,
        f1: float | None = None,
        branches: dict | None = None,
        extra: dict | None = None,
    ) -> int:
        """Log one answered question and return its row id.

        Args:
            answer: the result record.
            source: chat | eval | ask.
            session: chat session id (the TUI's), or an eval run id.
            index_id: manifest id of the index the passages came from.
            gold, em, f1: gold answers and the scores of `answer.answer` (eval).
            branches: counterfactual results, `{"never": {"em": 1.0, "f1": 1.0, "answer":
                "..."}, "always": {...}}`; kept whole as JSON, and em/f1 also as columns.
                The branch that actually ran is filled from `em`/`f1` when missing, since a
                gated greedy answer equals that branch's answer.
            extra: any other JSON-serialisable details.
        """
        if source not in SOURCES:
            raise ValueError(
                f"source must be one of {', '.join(SOURCES)}; got {source!r}"
            )
        # float(): numpy scalars (np.float32 from a gate) are not SQLite-bindable.
        scores = {g: _float(answer.scores.get(g)) for g in SCORE_GATES}
        unknown = set(answer.scores) - set(SCORE_GATES)
        if unknown:
            extra = {**(extra or {}), "scores": dict(answer.scores)}
        if answer.history_turns or (answer.search_query and answer.search_query != answer.question):
            # A chat turn: what retrieval searched and how many earlier turns the prompt held.
            extra = {**(extra or {}), "search_query": answer.search_query, "history_turns": answer.history_turns}
        ran = "always" if answer.retrieved else "never"
        branch = {
            name: dict((branches or {}).get(name) or {}) for name in ("never", "always")
        }
        for metric, value in (("em", em), ("f1", f1)):
            if value is not None:
                branch[ran].setdefault(metric, value)
        passages = [
            {"key": p.key, "title": p.title, "score": p.score} for p in answer.passages
        ]
        t, lat = answer.tokens, answer.latency
        row = (
            utc_now(), source, session, answer.model, index_id, answer.question, answer.gate,
            answer.k, answer.beta, answer.n_samples, answer.temperature,
            _finite_or_none(answer.tau), _float(answer.score),
            scores["entropy"], scores["margin"], scores["variance"],
            int(answer.retrieved), answer.rechecked_at, _json(passages),
            t.prompt, t.draft, t.context, t.output, t.samples,
            lat.draft, lat.gate, lat.retrieval, lat.prefill, lat.decode, lat.total,
            answer.answer, answer.finish_reason, _json(gold), em, f1,
            branch["never"].get("em"), branch["never"].get("f1"),
            branch["always"].get("em"), branch["always"].get("f1"),
            _json(branches), _json(extra),
        )  # fmt: skip
        return self._write(
            lambda: self.db.conn.execute(_INSERT_DECISION, row).lastrowid
        )

    def feedback(self, decision_id: int, label: str, note: str | None = None) -> int:
        """Attach a user label to a decision; returns the feedback row id."""
        if label not in LABELS:
            raise ValueError(f"label must be one of {', '.join(LABELS)}; got {label!r}")

        def insert() -> int:
            found = self.db.conn.execute(
                "SELECT 1 FROM decisions WHERE id = ?", (decision_id,)
            ).fetchone()
            if not found:
                raise UnknownDecisionError(
                    f"No decision with id {decision_id} in {self.path}"
                )
            return self.db.conn.execute(
                "INSERT INTO feedback (decision_id, label, note, ts) VALUES (?, ?, ?, ?)",
                (decision_id, label, note, utc_now()),
            ).lastrowid

        return self._write(insert)

    def add_message(
        self, session: str, role: str, text: str, decision_id: int | None = None
    ) -> int:
        """Append one chat message to a session's transcript; returns its id."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
        sql = "INSERT INTO messages (session, role, text, decision_id, ts) VALUES (?, ?, ?, ?, ?)"
        try:
            return self._write(
                lambda: self.db.conn.execute(
                    sql, (session, role, text, decision_id, utc_now())
                ).lastrowid
            )
        except sqlite3.IntegrityError:  # the foreign key: decision_id is not in the log
            raise UnknownDecisionError(
                f"No decision with id {decision_id} in {self.path}"
            ) from None

    # -- reading -------------------------------------------------------------------------

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[dict]:
        def read() -> list[dict]:
            with self._lock:
                return list(self.db.query(sql, list(params)))

        return self._retry(read)

    def get(self, decision_id: int) -> dict:
        """One decision row as a dict, JSON columns decoded."""
        rows = self._query("SELECT * FROM decisions WHERE id = ?", [decision_id])
        if not rows:
            raise UnknownDecisionError(
                f"No decision with id {decision_id} in {self.path}"
            )
        return _decode(rows[0])

    def rows(
        self,
        *,
        since: datetime | str | None = None,
        source: str | None = None,
        gate: str | None = None,
        model: str | None = None,
        session: str | None = None,
        limit: int | None = None,
    ) -> list[dict]:
        """Decision rows, newest first, JSON columns decoded."""
        where, params = _filters(
            since=since, source=source, gate=gate, model=model, session=session
        )
        sql = f"SELECT * FROM decisions {where} ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return [_decode(r) for r in self._query(sql, params)]

    def count(self) -> int:
        return self._query("SELECT count(*) AS n FROM decisions")[0]["n"]

    def scores(
        self,
        gate: str,
        k: int,
        model: str | None = None,
        since: datetime | str | None = None,
        source: str | None = None,
        beta: float | None = None,
    ) -> list[ScoreRow]:
        """Rows that logged a U for `gate` at prefix length k, oldest first.

        Any row carries every score its draft computed, so a margin calibration also uses
        rows decided by another gate. `beta` narrows to one margin link (U depends on it).
        """
        if gate not in SCORE_GATES:
            raise ValueError(
                f"gate must be one of {', '.join(SCORE_GATES)}; got {gate!r}"
            )
        where, params = _filters(
            since=since, source=source, model=model, k=k, beta=beta
        )
        column = f"u_{gate}"  # from the fixed SCORE_GATES, never from user text
        where += (
            f" AND {column} IS NOT NULL" if where else f"WHERE {column} IS NOT NULL"
        )
        sql = f"""
            SELECT d.id, d.source, d.model, d.gate, d.{column} AS u, d.retrieved,
                   d.em_never, d.em_always, d.f1_never, d.f1_always,
                   (SELECT label FROM feedback f WHERE f.decision_id = d.id
                    ORDER BY f.id DESC LIMIT 1) AS label
            FROM decisions d {where} ORDER BY d.id"""
        return [
            ScoreRow(**{**r, "retrieved": bool(r["retrieved"])})
            for r in self._query(sql, params)
        ]

    def sessions(self) -> list[SessionSummary]:
        """Chat sessions, most recently active first."""
        sql = """
            SELECT session, min(ts) AS started, max(ts) AS last, count(*) AS n_messages,
                   (SELECT text FROM messages m2 WHERE m2.session = m.session AND m2.role = 'user'
                    ORDER BY m2.id LIMIT 1) AS title
            FROM messages m GROUP BY session ORDER BY max(id) DESC"""
        return [
            SessionSummary(**{**r, "title": (r["title"] or "")[:80]})
            for r in self._query(sql)
        ]

    def messages(self, session: str) -> list[Message]:
        """One session's transcript in order."""
        sql = "SELECT * FROM messages WHERE session = ? ORDER BY id"
        return [Message(**r) for r in self._query(sql, [session])]


def _db_file(db: Database) -> str:
    row = db.conn.execute("PRAGMA database_list").fetchone()
    return row[2] or ":memory:"


def _filters(**conditions: Any) -> tuple[str, list[Any]]:
    clauses, params = [], []
    for column, value in conditions.items():
        if value is None:
            continue
        if column == "since":
            clauses.append("ts >= ?")
            params.append(
                format_ts(value) if isinstance(value, datetime) else str(value)
            )
        else:
            clauses.append(
                f"{column} = ?"
            )  # column names are ours; values are parameters
            params.append(value)
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), params


_JSON_COLUMNS = ("passages", "gold", "branches", "extra")


def _decode(row: dict) -> dict:
    return {
        k: json.loads(v) if k in _JSON_COLUMNS and v is not None else v
        for k, v in row.items()
    }
