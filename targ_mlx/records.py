"""The result record of one answered question, shared by the CLI, the log, eval and the TUI.

Plain floats and strings only, so `dataclasses.asdict()` goes straight to JSON or SQLite.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


def verdict(retrieved: bool, cited: int) -> str:
    """What was done, as every face says it: "answered from memory", "read N passages", or "read,
    answered from memory" where nothing read holds the answer given (`--read each` choosing the
    draft, or the answer-form guard keeping it: nothing is cited)."""
    if not retrieved:
        return "answered from memory"
    return f"read {cited} passages" if cited else "read, answered from memory"


@dataclass(frozen=True)
class PassageRef:
    key: int
    title: str
    score: float
    text: str = ""  # the passage as it went into the prompt (possibly cut to the budget)
    bm25: float | None = None  # its BM25 score, when the index has a BM25 part (`score` stays the cosine)


@dataclass(frozen=True)
class TokenCounts:
    prompt: int = 0  # tokens of B(q)
    draft: int = 0  # tokens decoded by the gate's greedy draft (<= k)
    context: int = 0  # tokens of retrieved context C that went into the prompt
    output: int = 0  # tokens of the final answer
    samples: int = 0  # tokens decoded for the variance gate's N sampled prefixes (all rows)


@dataclass(frozen=True)
class Latency:
    """Wall-clock seconds per stage of Algorithm 1."""

    draft: float = 0.0  # prefill of B(q) + k greedy draft steps (+ sampled prefixes for variance)
    gate: float = 0.0  # score arithmetic and decision
    retrieval: float = 0.0  # query encoding + index search + formatting
    prefill: float = 0.0  # prefill of B(q)+C when retrieving (0 when continuing the draft)
    decode: float = 0.0  # decoding after the draft / after the context prefill
    total: float = 0.0
    # seconds the search ran beside the draft (a search-first gate: `runner.OVERLAP_SEARCH`),
    # counted in both `draft` and `retrieval`: the stages' wall time is their sum less this
    overlap: float = 0.0

    def busy(self) -> float:
        """Wall seconds the stages account for (what is left of `total` was opening things)."""
        return self.draft + self.gate + self.retrieval + self.prefill + self.decode - self.overlap


@dataclass(frozen=True)
class Answer:
    """Everything about one answered question: the answer, the decision and its cost."""

    question: str
    answer: str
    model: str
    gate: str  # a registered gate's name: entropy | margin | variance | evidence | never | always
    tau: float
    score: float | None  # U of the chosen gate (None for never/always)
    retrieved: bool  # the passages were read (a search-first gate searches either way)
    k: int = 20
    beta: float = 3.0
    n_samples: int = 5
    temperature: float = 0.7
    scores: dict = field(default_factory=dict)  # every score the signals allowed, by gate name
    passages: tuple[PassageRef, ...] = ()  # the passages read (cited); empty when answered from memory
    tokens: TokenCounts = TokenCounts()
    latency: Latency = Latency()
    finish_reason: str = "stop"  # stop (EOS) | length | cancelled
    rechecked_at: int | None = None  # token index at which an optional re-check triggered retrieval
    search_query: str = ""  # what retrieval searched: the question, or its standalone form in a chat
    history_turns: int = 0  # earlier turns of the conversation in the prompt
    note: str = ""  # why a retrieval the gate wanted did not happen, e.g. "index building 43%"
    found: tuple[PassageRef, ...] = ()  # what the search found (titles, similarities; no text), read or not
    searched: bool = False  # the index was searched (a search-first gate, or a read)
    reason: str = ""  # the gate's one-line why: "weak evidence (best 0.31) → answered from memory"
    no_source: bool = False  # the model is unsure and the index had no passage good enough to read
    confirmed: bool | None = None  # the found context says what the draft says (None: no draft or no search)
    support: float | None = None  # the largest share of the question one found sentence holds (None: no search)
    calibration: str = ""  # the evidence gate's calibration: shipped | default (pooled) | user, N questions, date

    def to_dict(self) -> dict:
        return asdict(self)
