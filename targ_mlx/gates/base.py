"""What a gate is: a named score over a question's signals, a threshold rule, and a reason.

A gate sees only `Signals` (short per-step lists from the draft, the search's titles and
similarities) and returns a `GateDecision`; it never sees the model, the index or the disk, so
the eval recomputes any gate's decision at any threshold from records, and property tests reach
it. Adding a gate is one module that subclasses `Gate` and calls `register`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Mapping, Sequence

from targ_mlx.defaults import DEFAULT_BETA

DRAFT, SAMPLES, SEARCH = "draft", "samples", "search"  # what a gate can ask the runner for


@dataclass(frozen=True)
class GateDecision:
    retrieve: bool  # read the passages (a search-first gate has searched either way)
    signal: float | None  # the gate's score; None for never/always
    threshold: float
    gate: str
    reason: str = ""  # one line a person reads: why it read or answered from memory
    no_source: bool = False  # the model is unsure and no passage is good enough to read


@dataclass(frozen=True)
class Evidence:
    """One passage the search found, as a gate sees it (the text stays with the runner)."""

    title: str
    similarity: float  # cosine of the query and passage vectors
    bm25: float | None = None  # its BM25 score, when the index has a BM25 part


@dataclass(frozen=True)
class Signals:
    """Everything a gate may look at for one question."""

    entropies: Sequence[float] = ()  # H_t of softmax(logits_t) per greedy draft step, nats
    gaps: Sequence[float] = ()  # top-1 minus top-2 logit per step, >= 0
    samples: Sequence[Sequence[int]] = ()  # N sampled prefixes, token ids
    evidence: Sequence[Evidence] | None = None  # the search's passages, best first; None: not searched
    model: str = ""  # the model key, for gates calibrated per model
    # The context reading would read already says what the draft says (`pipeline.confirms`): the
    # evidence says what the model would say anyway. None: not searched, or no draft.
    confirmed: bool | None = None
    # The selection's score over the same passages (`selection.support`): the largest share of the
    # question's words one of their sentences holds. None: not searched, or not computed.
    support: float | None = None


@dataclass(frozen=True)
class GateParams:
    k: int | None = None  # draft steps scored (all when None)
    beta: float = DEFAULT_BETA  # margin link exp(-g / beta)
    # a calibration for a gate fitted per model (the evidence gate's knots), chosen by the caller
    # from the user's config; None: the gate's shipped one for the signals' model
    calibration: Mapping | None = field(default=None, compare=False, repr=False)


class Gate:
    """A gate: `score(signals)` -> U (None for never/always) and `decide` -> read iff U > tau.

    Subclasses set `name`, `needs` (subset of draft / samples / search), `default_tau`, and
    implement `score`; `reason` may say more than the generic line.
    """

    name: ClassVar[str] = ""
    needs: ClassVar[frozenset[str]] = frozenset()
    default_tau: ClassVar[float | None] = None  # None: an unscored gate (never, always)
    recheck: ClassVar[bool] = False  # the optional re-check can recompute its running score
    paper: ClassVar[bool] = False  # one of the paper's three gates, kept exactly as it defines them

    @property
    def scored(self) -> bool:
        return self.default_tau is not None

    def score(self, sig: Signals, p: GateParams = GateParams()) -> float | None:
        raise NotImplementedError

    def model_tau(self, model: str) -> float | None:
        """A threshold this gate ships for `model` (None: the config's shipped or default tau)."""
        return None

    def decide(self, sig: Signals, tau: float, p: GateParams = GateParams(), u: float | None = None) -> GateDecision:
        """Read iff U > tau (strict), as in the paper; `u` skips recomputing a known score."""
        u = self.score(sig, p) if u is None else u
        if u is None:
            raise ValueError(f"gate {self.name!r} needs a score, got None")
        retrieve = bool(u > tau)
        return GateDecision(retrieve, float(u), float(tau), self.name, self.reason(sig, u, tau, retrieve, p))

    def reason(self, sig: Signals, u: float, tau: float, retrieve: bool, p: GateParams) -> str:
        return (f"model unsure ({self.name} U {u:.3f} > τ {tau:.3f}) → read" if retrieve
                else f"model sure enough ({self.name} U {u:.3f} ≤ τ {tau:.3f}) → answered from memory")


REGISTRY: dict[str, Gate] = {}


def register(gate: Gate) -> Gate:
    """Add a gate under its name (a later registration of the same name replaces it)."""
    if not gate.name or not gate.name.isidentifier():
        raise ValueError(f"a gate's name must be an identifier (it names a log column), got {gate.name!r}")
    if not gate.needs <= {DRAFT, SAMPLES, SEARCH}:
        raise ValueError(f"gate {gate.name!r} needs {sorted(gate.needs)}; a gate can need draft, samples, search")
    REGISTRY[gate.name] = gate
    return gate


def get(name: str) -> Gate:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown gate {name!r}; choose one of {', '.join(REGISTRY)}") from None


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def scored_names() -> tuple[str, ...]:
    return tuple(n for n, g in REGISTRY.items() if g.scored)


def draft_only_names() -> tuple[str, ...]:
    """Scored gates that need no search: what a draft alone (the paper's setting) can score."""
    return tuple(n for n, g in REGISTRY.items() if g.scored and SEARCH not in g.needs)


def _check_steps(name: str, values: Sequence) -> None:
    if len(values) == 0:
        raise ValueError(f"{name} needs at least one draft step, got an empty sequence")
