"""The paper's three training-free gates as small pure functions, plus Never and Always.

Per-step statistics (`step_entropy`, `step_gap`) run in MLX on full-vocabulary logits so the
draft never copies a vocabulary-sized row to Python; the scores (`entropy_score`,
`margin_score`, `variance_score`) take the resulting short per-step lists. Gates never see the
model, the index or the disk.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import mlx.core as mx

from targ_mlx.defaults import DEFAULT_BETA, GATES, SCORED_GATES  # noqa: F401  (the gates' vocabulary)


@dataclass(frozen=True)
class GateDecision:
    retrieve: bool
    signal: float | None  # U for the scored gates, None for never/always
    threshold: float
    gate: str


@dataclass(frozen=True)
class DraftSignals:
    """What a draft exposes to a gate: per-step statistics and sampled prefixes."""

    entropies: Sequence[float] = ()  # H_t of softmax(logits_t), nats
    gaps: Sequence[float] = ()  # top-1 minus top-2 logit, >= 0
    samples: Sequence[Sequence[int]] = ()  # N sampled prefixes, token ids


def step_entropy(logits: mx.array) -> mx.array:
    """Entropy of softmax(logits) along the last axis.

    H = log Z - E_p[l - max l], with one exp pass: MLX's CPU exp is scalar (~1.8 ms per
    49k-token row here), so the logsumexp-then-exp form cost twice as much per draft step.
    """
    shifted = logits - mx.max(logits, axis=-1, keepdims=True)
    e = mx.exp(shifted)
    z = mx.sum(e, axis=-1)
    return mx.log(z) - mx.sum(e * shifted, axis=-1) / z


def step_gap(logits: mx.array) -> mx.array:
    """Top-1 minus top-2 logit along the last axis (mx.topk does not sort its output)."""
    top2 = mx.topk(logits, 2, axis=-1)
    return mx.max(top2, axis=-1) - mx.min(top2, axis=-1)


@mx.compile
def step_stats(logits: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """(greedy token, entropy, gap) of each row of (B, V) logits, fused into one compiled graph."""
    return mx.argmax(logits, axis=-1), step_entropy(logits), step_gap(logits)


def _check_steps(name: str, values: Sequence) -> None:
    if len(values) == 0:
        raise ValueError(f"{name} needs at least one draft step, got an empty sequence")


def entropy_score(entropies: Sequence[float]) -> float:
    """U_ent = mean_t H_t, in [0, log V]."""
    _check_steps("entropy_score", entropies)
    return math.fsum(entropies) / len(entropies)


def margin_score(gaps: Sequence[float], beta: float = DEFAULT_BETA) -> float:
    """U_mar = mean_t exp(-g_t / beta), in (0, 1]; larger means less confident."""
    if not beta > 0:
        raise ValueError(f"margin beta must be > 0, got {beta}")
    _check_steps("margin_score", gaps)
    return math.fsum(math.exp(-max(float(g), 0.0) / beta) for g in gaps) / len(gaps)


def variance_score(samples: Sequence[Sequence[int]], k: int | None = None) -> float:
    """U_var = mean_t (1 - modal-token frequency among N samples), in [0, (N-1)/N].

    Samples shorter than the longest (stopped at EOS) count as repeating a sentinel after
    their end, so "stopped" is one more outcome the samples can agree on.
    """
    if len(samples) == 0:
        raise ValueError("variance_score needs N >= 1 sampled prefixes, got none")
    steps = k if k is not None else max(len(s) for s in samples)
    if steps <= 0:
        raise ValueError(f"variance_score needs at least one step, got k={steps}")
    n = len(samples)
    total = 0.0
    for t in range(steps):
        column = Counter(s[t] if t < len(s) else -1 for s in samples)
        total += 1.0 - max(column.values()) / n
    return total / steps


def score(gate: str, signals: DraftSignals, k: int | None = None, beta: float = DEFAULT_BETA) -> float:
    """U for one scored gate over the first k draft steps (all steps when k is None)."""
    if gate == "entropy":
        return entropy_score(list(signals.entropies)[:k])
    if gate == "margin":
        return margin_score(list(signals.gaps)[:k], beta)
    if gate == "variance":
        return variance_score([list(s)[:k] for s in signals.samples], k)
    raise ValueError(f"gate {gate!r} has no score; scored gates: {', '.join(SCORED_GATES)}")


def decide(gate: str, signal: float | None, tau: float) -> GateDecision:
    """Retrieve iff U > tau (strict), as in the paper; never/always ignore U."""
    if gate not in GATES:
        raise ValueError(f"unknown gate {gate!r}; choose one of {', '.join(GATES)}")
    if gate == "never":
        return GateDecision(False, None, tau, gate)
    if gate == "always":
        return GateDecision(True, None, tau, gate)
    if signal is None:
        raise ValueError(f"gate {gate!r} needs a score, got None")
    return GateDecision(bool(signal > tau), float(signal), float(tau), gate)


def make_gate(gate: str, tau: float, k: int | None = None, beta: float = DEFAULT_BETA
              ) -> Callable[[DraftSignals], GateDecision]:
    """Compose score and threshold into one callable over a draft's signals."""
    if gate not in GATES:
        raise ValueError(f"unknown gate {gate!r}; choose one of {', '.join(GATES)}")

    def gate_fn(signals: DraftSignals) -> GateDecision:
        u = score(gate, signals, k, beta) if gate in SCORED_GATES else None
        return decide(gate, u, tau)

    return gate_fn
