"""The chat app's transcript: the `messages` table, one row per turn, linked to its decision."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from targ_mlx.log.store import LogStore, UnknownDecisionError, utc_now

ROLES = ("user", "assistant", "system")


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


class Transcript(LogStore):
    """Chat messages in the log file; `DecisionLog` adds the decisions they point at."""

    def add_message(self, session: str, role: str, text: str, decision_id: int | None = None) -> int:
        """Append one chat message to a session's transcript; returns its id."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
        sql = "INSERT INTO messages (session, role, text, decision_id, ts) VALUES (?, ?, ?, ?, ?)"
        try:
            return self._write(
                lambda: self.db.conn.execute(sql, (session, role, text, decision_id, utc_now())).lastrowid
            )
        except sqlite3.IntegrityError:  # the foreign key: decision_id is not in the log
            raise UnknownDecisionError(f"No decision with id {decision_id} in {self.path}") from None

    def sessions(self, source: str | None = None) -> list[SessionSummary]:
        """Chat sessions, most recently active first; with `source`, only those whose answers were
        logged from that front end (the chat's own, not a `targ ask --chat` one)."""
        where = ("WHERE EXISTS (SELECT 1 FROM decisions d WHERE d.session = m.session AND d.source = ?)"
                 if source else "")
        sql = f"""
            SELECT session, min(ts) AS started, max(ts) AS last, count(*) AS n_messages,
                   (SELECT text FROM messages m2 WHERE m2.session = m.session AND m2.role = 'user'
                    ORDER BY m2.id LIMIT 1) AS title
            FROM messages m {where} GROUP BY session ORDER BY max(id) DESC"""
        rows = self._query(sql, [source] if source else [])
        return [SessionSummary(**{**r, "title": (r["title"] or "")[:80]}) for r in rows]

    def messages(self, session: str) -> list[Message]:
        """One session's transcript in order."""
        sql = "SELECT * FROM messages WHERE session = ? ORDER BY id"
        return [Message(**r) for r in self._query(sql, [session])]
