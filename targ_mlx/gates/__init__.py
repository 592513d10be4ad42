"""Gates as objects in a registry: the paper's three, Never and Always, and the evidence gate.

    gate = gates.get("margin")
    decision = gate.decide(gates.Signals(gaps=d.gaps), tau, gates.GateParams(k=20))

A gate is one module: subclass `Gate`, set what it `needs` (draft, samples, search), implement
`score`, `register` it. The runner (`targ_mlx.runner`) gathers what the chosen gate needs and
asks it; the eval scores every registered gate from records. Nothing here imports MLX.
"""

from types import MappingProxyType
from typing import Callable

from targ_mlx.gates.base import (  # noqa: F401
    DRAFT,
    REGISTRY,
    SAMPLES,
    SEARCH,
    Evidence,
    Gate,
    GateDecision,
    GateParams,
    Signals,
    draft_only_names,
    get,
    names,
    register,
    scored_names,
)
from targ_mlx.gates.paper import entropy_score, margin_score, variance_score  # noqa: F401
from targ_mlx.gates import fixed, evidence  # noqa: F401,E402  (registers never/always and evidence)
from targ_mlx.gates.evidence import EvidenceGate  # noqa: F401

# The built-in vocabulary, fixed at import (the CLI's choices, the config's and log's columns);
# a gate registered later is still reachable through `get`/`names()`.
GATES = names()
SCORED_GATES = scored_names()
DEFAULT_TAU = MappingProxyType({n: g.default_tau for n, g in REGISTRY.items() if g.scored})


def decide(gate: str, signal: float | None, tau: float) -> GateDecision:
    """Retrieve iff U > tau (strict) for a score already computed; never/always ignore it."""
    g = get(gate)
    if not g.scored:
        return g.decide(Signals(), tau)
    if signal is None:
        raise ValueError(f"gate {gate!r} needs a score, got None")
    return GateDecision(bool(signal > tau), float(signal), float(tau), gate)


def score_all(sig: Signals, p: GateParams) -> dict[str, float]:
    """U of every registered scored gate the signals allow (variance needs samples, evidence a
    search)."""
    out: dict[str, float] = {}
    for name, g in REGISTRY.items():
        if not g.scored:
            continue
        if (DRAFT in g.needs and not sig.gaps) or (SAMPLES in g.needs and not sig.samples) or \
                (SEARCH in g.needs and sig.evidence is None):
            continue
        out[name] = g.score(sig, p)
    return out


DraftSignals = Signals  # the name a draft-only caller knows


def make_gate(gate: str, tau: float, k: int | None = None, beta: float | None = None) -> Callable[[Signals], GateDecision]:
    """Compose a registered gate and its threshold into one callable over signals (mlx-lm's
    `make_sampler` shape)."""
    g = get(gate)
    p = GateParams(k, beta) if beta is not None else GateParams(k)
    return lambda sig: g.decide(sig, tau, p)
