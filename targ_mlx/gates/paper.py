"""The paper's three training-free gates, exactly as it defines them: entropy, margin, variance.

Each score is a small pure function over a draft's short per-step lists; the gate objects wrap
them for the registry. The per-step statistics themselves come from the runtime
(`runtime.sampling.step_entropy` / `step_gap`, computed on full-vocabulary logits).
"""

from __future__ import annotations

import math
from collections import Counter
from types import MappingProxyType
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


# Shipped thresholds per offline model key (`model_spec.model_key`: the alias for aliases): tau for
# a 30% retrieval budget, `calibration.budget_threshold(U, 0.3)` per gate over the U at k=20 of the
# committed eval records results/smollm2-135m/seeded/nq_open/records.jsonl (1,000 NQ-Open dev
# questions, extended from 500; `python -m targ_mlx.eval`, prompt `short`, k=20,
# beta=3, N=5, T=0.7). `settings.resolve_tau` reads them after the user's own `[tau."key"]`. Computed with
#   python scripts/analysis/ship_tau.py results/smollm2-135m/seeded/nq_open/records.jsonl --budget 0.3
# (retrieval rate on those questions: entropy 0.300, margin 0.300, variance 0.291: U ties; from
# the first 500 they were 2.658 / 0.668 / 0.710).
# Those records were drafted with the eval's `short` prompt (few-shot short answers) on the
# AVX-512 VNNI int8 kernels; the assistant's default prompt is `paper`. Checked on the first 100
# of those questions through `pipeline.prepare`/`draft_for` on an AVX2 machine (float32): with
# `short` the prompt is token for token the records' and the rate at these tau is margin 0.31,
# entropy 0.31 (records: 0.30, 0.35); with `paper`, margin 0.26, entropy 0.29.
# Values are kept at full precision: budget_threshold returns an observed U.
CALIBRATED_TAU = MappingProxyType({
    "smollm2-135m": MappingProxyType({
        "entropy": 2.6357327086851, "margin": 0.6647815143244878, "variance": 0.7200000000000002,
    }),
    # From its 1,000 TriviaQA records over the clean index (results/README.md), prompt `short`:
    #   python scripts/analysis/ship_tau.py results/qwen2.5-coder-1.5b/clean/triviaqa/records.jsonl --budget 0.3
    # (retrieval rate on those 1,000: entropy 0.300, margin 0.300, variance 0.301).
    "qwen2.5-coder-1.5b": MappingProxyType({
        "entropy": 2.272527015209198, "margin": 0.571522055413182, "variance": 0.15,
    }),
})


class _PaperGate(Gate):
    def model_tau(self, model: str) -> float | None:
        value = CALIBRATED_TAU.get(model, {}).get(self.name)
        return None if value is None else float(value)


class EntropyGate(_PaperGate):
    name, needs, default_tau, recheck, paper = "entropy", frozenset({DRAFT}), 0.80, True, True

    def score(self, sig: Signals, p: GateParams = GateParams()) -> float:
        return entropy_score(list(sig.entropies)[: p.k])


class MarginGate(_PaperGate):
    name, needs, default_tau, recheck, paper = "margin", frozenset({DRAFT}), 0.35, True, True

    def score(self, sig: Signals, p: GateParams = GateParams()) -> float:
        return margin_score(list(sig.gaps)[: p.k], p.beta)


class VarianceGate(_PaperGate):
    name, needs, default_tau, paper = "variance", frozenset({DRAFT, SAMPLES}), 0.60, True

    def score(self, sig: Signals, p: GateParams = GateParams()) -> float:
        return variance_score([list(s)[: p.k] for s in sig.samples], p.k)


# Default taus above are placeholders until calibrated: the median of the operating points the
# paper reports per gate (Qwen2.5-7B tables); shipped per-model values are CALIBRATED_TAU.
for _g in (EntropyGate(), MarginGate(), VarianceGate()):
    register(_g)
