"""What a face shows of one decision: built from a live answer's events, a finished `Answer`, or a
logged decision row, so an answer reloaded from history shows what it showed live.

`DecisionView.live()` starts empty; `.after(event)` folds in each runner event as it arrives, so a
face can show "searching… found Mona Lisa 0.65 · reading 5 passages" before the first answer token.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from targ_mlx import runner
from targ_mlx.gates import SCORED_GATES
from targ_mlx.records import Answer, PassageRef

STAGES = ("waiting", "drafted", "searched", "decided", "done")


@dataclass(frozen=True)
class DecisionView:
    decision_id: int | None = None
    model: str = ""
    gate: str = ""
    k: int | None = None
    tau: float | None = None  # None for never / always
    u: float | None = None
    retrieved: bool = False
    passages: tuple[PassageRef, ...] = ()  # read (cited)
    draft_s: float = 0.0
    retrieval_s: float = 0.0
    generation_s: float = 0.0
    total_s: float = 0.0
    tokens: dict = field(default_factory=dict)  # prompt, draft, context, output
    finish: str = ""
    searched: str = ""  # the standalone query retrieval searched, when it differs from the question
    history_turns: int = 0  # earlier turns in the prompt
    note: str = ""  # why a wanted retrieval did not happen, e.g. "index building 43%"
    reason: str = ""  # the gate's own why: "weak evidence (best 0.31) → answered from memory"
    no_source: bool = False  # unsure, and no passage good enough to read
    found: tuple[PassageRef, ...] = ()  # what the search found, read or not
    stage: str = "done"  # how far a live answer is (STAGES)
    draft_tokens: int = 0  # a live answer's draft length, before the answer's counts exist

    @property
    def live(self) -> bool:
        return self.stage != "done"

    @property
    def not_read(self) -> tuple[PassageRef, ...]:
        """Passages the search found that the answer did not read."""
        read = {p.key for p in self.passages}
        return tuple(p for p in self.found if p.key not in read)

    def progress(self) -> str:
        """One line of what a live answer has done so far."""
        parts = [f"drafted {self.draft_tokens} tokens"] if self.draft_tokens else []
        if self.found:
            best = self.found[0]
            parts.append(f"found {best.title} {best.score:.2f}")
        if self.stage == "decided":
            n = len(self.found)
            parts.append(f"reading {n} passages" if self.retrieved and n else "searching to read…" if self.retrieved
                         else "answering from memory")
        else:
            parts.append("deciding…" if self.found else "searching…" if self.draft_tokens else "drafting…")
        return " · ".join(parts)

    @classmethod
    def start(cls, gate: str, k: int | None, model: str = "") -> DecisionView:
        """The view of an answer about to start (nothing decided yet)."""
        return cls(model=model, gate=gate, k=k, stage="waiting")

    def after(self, ev: runner.Event, decision_id: int | None = None) -> DecisionView:
        """This view with one more runner event folded in."""
        if isinstance(ev, runner.Drafted):
            return replace(self, stage="drafted", draft_tokens=len(ev.tokens), draft_s=ev.seconds)
        if isinstance(ev, runner.Searched):
            return replace(self, stage="searched" if self.stage != "decided" else "decided", found=ev.passages,
                           retrieval_s=ev.seconds, passages=ev.passages if self.retrieved else ())
        if isinstance(ev, runner.Decided):
            d = ev.decision
            return replace(self, stage="decided", gate=d.gate, u=d.signal,
                           tau=d.threshold if d.gate in SCORED_GATES else None, retrieved=d.retrieve,
                           reason=d.reason, no_source=d.no_source,
                           passages=self.found if d.retrieve else ())
        if isinstance(ev, runner.Done):
            return DecisionView.from_answer(ev.answer, decision_id)
        return self

    @classmethod
    def from_answer(cls, ans: Answer, decision_id: int | None = None) -> DecisionView:
        lat, t = ans.latency, ans.tokens
        return cls(decision_id, ans.model, ans.gate, ans.k, ans.tau if ans.gate in SCORED_GATES else None,
                   ans.score, ans.retrieved, tuple(ans.passages), lat.draft + lat.gate, lat.retrieval,
                   lat.prefill + lat.decode, lat.total,
                   dict(prompt=t.prompt, draft=t.draft, context=t.context, output=t.output), ans.finish_reason,
                   ans.search_query if ans.search_query != ans.question else "", ans.history_turns, ans.note,
                   ans.reason, ans.no_source, tuple(ans.found))

    @classmethod
    def from_row(cls, row: dict) -> DecisionView:
        """From `DecisionLog.get(id)`; passages carry no text (the log keeps key, title, score)."""
        passages = tuple(PassageRef(p["key"], p["title"], p["score"], bm25=p.get("bm25"))
                         for p in row.get("passages") or [])
        f = lambda name: row.get(name) or 0.0  # noqa: E731
        extra = row.get("extra") or {}
        searched = extra.get("search_query") or ""
        return cls(row["id"], row["model"], row["gate"], row.get("k"),
                   row.get("tau") if row["gate"] in SCORED_GATES else None, row.get("u"),
                   bool(row["retrieved"]), passages, f("lat_draft") + f("lat_gate"), f("lat_retrieval"),
                   f("lat_prefill") + f("lat_decode"), f("lat_total"),
                   dict(prompt=row.get("tok_prompt") or 0, draft=row.get("tok_draft") or 0,
                        context=row.get("tok_context") or 0, output=row.get("tok_output") or 0),
                   row.get("finish_reason") or "", searched if searched != row["query"] else "",
                   extra.get("history_turns") or 0, extra.get("note", ""), extra.get("reason", ""),
                   bool(extra.get("no_source")), tuple(PassageRef(k, title, sim, bm25=rest[0] if rest else None)
                                                       for k, title, sim, *rest in extra.get("found") or []))
