"""The paper's three training-free gates, exactly as it defines them: entropy, margin, variance.

Each score is a small pure function over a draft's short per-step lists; the gate objects wrap
them for the registry. The per-step statistics themselves come from the runtime
(`runtime.sampling.step_entropy` / `step_gap`, computed on full-vocabulary logits).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

from targ_mlx.defaults import DEFAULT_BETA
from targ_mlx.gates.base import DRAFT, SAMPLES, Gate, GateParams, Signals, _check_steps, register


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


class EntropyGate(Gate):
    name, needs, default_tau, recheck, paper = "entropy", frozenset({DRAFT}), 0.80, True, True

    def score(self, sig: Signals, p: GateParams = GateParams()) -> float:
        return entropy_score(list(sig.entropies)[: p.k])


class MarginGate(Gate):
    name, needs, default_tau, recheck, paper = "margin", frozenset({DRAFT}), 0.35, True, True

    def score(self, sig: Signals, p: GateParams = GateParams()) -> float:
        return margin_score(list(sig.gaps)[: p.k], p.beta)


class VarianceGate(Gate):
    name, needs, default_tau, paper = "variance", frozenset({DRAFT, SAMPLES}), 0.60, True

    def score(self, sig: Signals, p: GateParams = GateParams()) -> float:
        return variance_score([list(s)[: p.k] for s in sig.samples], p.k)


# Default taus above are placeholders until calibrated: the median of the operating points the
# paper reports per gate (Qwen2.5-7B tables); shipped per-model values live in config.CALIBRATED_TAU.
for _g in (EntropyGate(), MarginGate(), VarianceGate()):
    register(_g)
