"""The decision log's SQLite plumbing: one connection, WAL, retries on a busy file, migrations.

Several processes may write one file at once (the chat app and an eval run), so the file is
in WAL mode, each write is one short `BEGIN IMMEDIATE` transaction, and a busy database is
retried with backoff instead of surfacing "database is locked". What the tables hold is in
`decisions.py` (decisions, feedback) and `transcript.py` (chat messages).
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from targ_mlx import _sqlite_utils
from targ_mlx.errors import TargError

Database = _sqlite_utils.load().Database

logger = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT = 60.0  # seconds a write keeps retrying a locked file before giving up
_BUSY_TIMEOUT_MS = 2000  # SQLite's own wait per attempt, before our retry loop backs off

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


def utc_now() -> str:
    """Timestamp in the log's format; its string order is time order."""
    return format_ts(datetime.now(timezone.utc))


def format_ts(when: datetime) -> str:
    if when.tzinfo is None:
        raise ValueError(f"timestamp {when!r} has no timezone; pass an aware datetime (UTC)")
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def filters(**conditions: Any) -> tuple[str, list[Any]]:
    """A WHERE clause (column = ?, `since` as ts >= ?) over the conditions that are not None."""
    clauses, params = [], []
    for column, value in conditions.items():
        if value is None:
            continue
        if column == "since":
            clauses.append("ts >= ?")
            params.append(format_ts(value) if isinstance(value, datetime) else str(value))
        else:
            clauses.append(f"{column} = ?")  # column names are ours; values are parameters
            params.append(value)
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), params


def _is_busy(error: sqlite3.OperationalError) -> bool:
    msg = str(error).lower()
    return "locked" in msg or "busy" in msg


class LogStore:
    """One SQLite connection to the log file, migrated to `SCHEMA_VERSION`, with retried I/O.

    Args:
        db: a path (created with its parent folder if missing) or an open sqlite-utils
            `Database` (e.g. `Database(memory=True)` in tests), which the caller owns.
        lock_timeout: seconds a write retries a locked file before raising
            `DecisionLogLockedError` (default `DEFAULT_LOCK_TIMEOUT`).
    """

    def __init__(self, db: str | os.PathLike | Database, lock_timeout: float = DEFAULT_LOCK_TIMEOUT):
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
            raise sqlite3.OperationalError(f"database is locked (journal_mode stayed {mode})")

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

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[dict]:
        def read() -> list[dict]:
            with self._lock:
                return list(self.db.query(sql, list(params)))

        return self._retry(read)


def _db_file(db: Database) -> str:
    row = db.conn.execute("PRAGMA database_list").fetchone()
    return row[2] or ":memory:"
