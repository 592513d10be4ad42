"""The decision log: every gate decision, its scores, cost and outcome, in one SQLite file.

Tables (browse them with `sqlite-utils` or `datasette decisions.db`; README, "The decision log"):
  decisions  one row per answered question (chat, eval or ask)       -- this module
  feedback   user labels on a decision: correct | wrong | helpful | unhelpful  -- this module
  messages   the chat app's transcript, linked to the decision behind each answer -- transcript.py

The file handling (WAL, retries on a busy file, schema migrations) is in `store.py`; the
rows calibration reads are fetched in `targ_mlx/calibration/rows.py`. User text only ever goes in as
query parameters.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from targ_mlx.log.store import (  # noqa: F401  (re-exported: the log's public names)
    DEFAULT_LOCK_TIMEOUT,
    MIGRATIONS,
    SCHEMA_VERSION,
    DecisionLogError,
    DecisionLogLockedError,
    SchemaVersionError,
    UnknownDecisionError,
    filters,
    format_ts,
    utc_now,
)
from targ_mlx.log.transcript import ROLES, Message, SessionSummary, Transcript  # noqa: F401
from targ_mlx.records import Answer

# The paper's three scores have columns of their own (u_entropy, u_margin, u_variance); every other
# gate's score (evidence, one a user registers) and the search's signals go in `extra` as JSON.
SCORE_COLUMNS = ("entropy", "margin", "variance")
SOURCES = ("chat", "eval", "ask")
LABELS = ("correct", "wrong", "helpful", "unhelpful")
POSITIVE_LABELS = ("correct", "helpful")

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
_JSON_COLUMNS = ("passages", "gold", "branches", "extra")


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _float(x: Any) -> float | None:
    return None if x is None else float(x)


def _finite_or_none(x: float | None) -> float | None:
    # SQLite has no infinity literal in JSON and Datasette shows it oddly: never/always -> NULL.
    return None if x is None or x in (float("inf"), float("-inf")) else float(x)


class DecisionLog(Transcript):
    """Read and write the decision log: decisions and feedback here, the chat transcript from
    `Transcript`, the file (`DecisionLog(path_or_database, lock_timeout)`) from `LogStore`."""

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
            source: chat | eval | ask (the server logs as ask, session "serve-..").
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
            raise ValueError(f"source must be one of {', '.join(SOURCES)}; got {source!r}")
        # float(): numpy scalars (np.float32 from a gate) are not SQLite-bindable.
        scores = {g: _float(answer.scores.get(g)) for g in SCORE_COLUMNS}
        unknown = set(answer.scores) - set(SCORE_COLUMNS)
        if unknown:
            extra = {**(extra or {}), "scores": {g: _float(u) for g, u in answer.scores.items()}}
        if answer.searched or answer.reason:
            # what the gate looked at and said: the search's passages (read or not) and its reason
            extra = {**(extra or {}), "reason": answer.reason, "no_source": answer.no_source,
                     "confirmed": answer.confirmed, "support": answer.support,
                     "found": [[p.key, p.title, p.score] + ([p.bm25] if p.bm25 is not None else [])
                               for p in answer.found]}
        if answer.history_turns or (answer.search_query and answer.search_query != answer.question):
            # A chat turn: what retrieval searched and how many earlier turns the prompt held.
            extra = {**(extra or {}), "search_query": answer.search_query, "history_turns": answer.history_turns}
        if answer.note:
            extra = {**(extra or {}), "note": answer.note}
        if answer.calibration:
            extra = {**(extra or {}), "calibration": answer.calibration}
        ran = "always" if answer.retrieved else "never"
        branch = {name: dict((branches or {}).get(name) or {}) for name in ("never", "always")}
        for metric, value in (("em", em), ("f1", f1)):
            if value is not None:
                branch[ran].setdefault(metric, value)
        passages = [{"key": p.key, "title": p.title, "score": p.score, **({"bm25": p.bm25} if p.bm25 is not None else {})}
                    for p in answer.passages]
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
        return self._write(lambda: self.db.conn.execute(_INSERT_DECISION, row).lastrowid)

    def feedback(self, decision_id: int, label: str, note: str | None = None) -> int:
        """Attach a user label to a decision; returns the feedback row id."""
        if label not in LABELS:
            raise ValueError(f"label must be one of {', '.join(LABELS)}; got {label!r}")

        def insert() -> int:
            found = self.db.conn.execute("SELECT 1 FROM decisions WHERE id = ?", (decision_id,)).fetchone()
            if not found:
                raise UnknownDecisionError(f"No decision with id {decision_id} in {self.path}")
            return self.db.conn.execute(
                "INSERT INTO feedback (decision_id, label, note, ts) VALUES (?, ?, ?, ?)",
                (decision_id, label, note, utc_now()),
            ).lastrowid

        return self._write(insert)

    def get(self, decision_id: int) -> dict:
        """One decision row as a dict, JSON columns decoded."""
        rows = self._query("SELECT * FROM decisions WHERE id = ?", [decision_id])
        if not rows:
            raise UnknownDecisionError(f"No decision with id {decision_id} in {self.path}")
        return _decode(rows[0])

    def grounded(self, decision_id: int) -> bool:
        """Whether that decision's answer was read from a source it cites, or confirmed by the
        search (its draft's claim words in what was found): what a chat may search with next
        (`conversation.Turn.grounded`). A decision no longer in the log counts as grounded (its
        answer is used as it was before the log kept this)."""
        try:
            row = self.get(decision_id)
        except UnknownDecisionError:
            return True
        return bool(row.get("retrieved") and row.get("passages")) or bool((row.get("extra") or {}).get("confirmed"))

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
        where, params = filters(since=since, source=source, gate=gate, model=model, session=session)
        sql = f"SELECT * FROM decisions {where} ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return [_decode(r) for r in self._query(sql, params)]

    def count(self) -> int:
        return self._query("SELECT count(*) AS n FROM decisions")[0]["n"]


def _decode(row: dict) -> dict:
    return {k: json.loads(v) if k in _JSON_COLUMNS and v is not None else v for k, v in row.items()}
