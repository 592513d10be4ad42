"""Controls that tell a working gate from a coin flip: pure numpy over per-question outcomes.

A gate is a choice of which questions retrieve; its score is the Always outcome where it
retrieves and the Never outcome elsewhere. Against that:

  random gate   retrieves the same number of questions, chosen uniformly. Its expected score
                is exact (never + rate * (always - never), averaged); its 95% band and the
                probability that it does at least as well as the gate come from resampling
                which questions retrieve.
  oracle gate   retrieves exactly where Always beats Never, the helped questions first: the best
                score any gate can reach at a retrieval rate (the ceiling).
  AUROC         how well a score ranks questions for a label ("the Never answer is wrong",
                "retrieval helps"): 0.5 is chance, with a bootstrap CI over questions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def gated(retrieve: np.ndarray, never: np.ndarray, always: np.ndarray) -> np.ndarray:
    """Per-question outcome of a gate: Always where it retrieves, Never elsewhere."""
    return np.where(retrieve, always, never)


def random_expected(never: np.ndarray, always: np.ndarray, rate: float) -> np.ndarray:
    """Per-question expected outcome of a gate that retrieves a random `rate` share of questions."""
    return rate * np.asarray(always, float) + (1.0 - rate) * np.asarray(never, float)


@dataclass(frozen=True)
class RandomControl:
    rate: float  # realised rate of the gate being controlled (m of n questions)
    expected: float  # exact mean score of a random gate retrieving m questions
    lo: float  # 2.5% / 97.5% quantiles over draws of which m questions retrieve
    hi: float
    p_at_least: float  # share of draws whose score >= the gate's (a permutation p-value)
    gate: float  # the gate's own score


def random_control(retrieve: np.ndarray, never: np.ndarray, always: np.ndarray, draws: int = 1000,
                   seed: int = 0) -> RandomControl:
    """The gate's score against random gates that retrieve as many questions (same n, same m)."""
    retrieve = np.asarray(retrieve, bool)
    never, always = np.asarray(never, float), np.asarray(always, float)
    n, m = len(never), int(retrieve.sum())
    gain = always - never
    base = float(never.mean()) if n else 0.0
    rng = np.random.default_rng(seed)
    # each draw: the sum of `gain` over m questions chosen without replacement
    picks = np.argsort(rng.random((draws, n)), axis=1)[:, :m]
    scores = base + gain[picks].sum(axis=1) / max(n, 1)
    gate = float(gated(retrieve, never, always).mean()) if n else 0.0
    return RandomControl(rate=m / max(n, 1), expected=base + m / max(n, 1) * float(gain.mean()) if n else 0.0,
                         lo=float(np.quantile(scores, 0.025)), hi=float(np.quantile(scores, 0.975)),
                         p_at_least=float(np.mean(scores >= gate - 1e-12)), gate=gate)


def oracle_score(never: np.ndarray, always: np.ndarray, rate: float) -> float:
    """Best mean score of any gate retrieving at most `rate` of the questions: retrieve the
    questions where Always beats Never, largest gain first, and none where it does not."""
    never, always = np.asarray(never, float), np.asarray(always, float)
    n = len(never)
    if n == 0:
        return 0.0
    gain = np.sort(always - never)[::-1]
    m = int(np.floor(rate * n + 1e-9))
    return float(never.mean() + np.clip(gain[:m], 0.0, None).sum() / n)


def oracle_retrieve(never: np.ndarray, always: np.ndarray) -> np.ndarray:
    """The oracle's decisions without a budget: retrieve exactly where Always beats Never."""
    return np.asarray(always, float) > np.asarray(never, float)


def auroc(score: np.ndarray, label: np.ndarray) -> float:
    """Area under the ROC curve of `score` for a binary `label` (ties count one half); NaN when
    one class is empty. Equals P(score of a positive > score of a negative)."""
    score, label = np.asarray(score, float), np.asarray(label, bool)
    pos, neg = int(label.sum()), int((~label).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    return float((ranks(score)[label].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, averaged over ties (as Mann-Whitney and Spearman use them)."""
    _, inv, counts = np.unique(np.asarray(x, float), return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2.0)[inv]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = ranks(a), ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1]) if ra.std() > 0 and rb.std() > 0 else float("nan")


def auroc_ci(score: np.ndarray, label: np.ndarray, n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """AUROC with a percentile bootstrap 95% CI over questions (resamples lacking a class are skipped)."""
    score, label = np.asarray(score, float), np.asarray(label, bool)
    est = auroc(score, label)
    if not np.isfinite(est):
        return est, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(score), len(score))
        v = auroc(score[idx], label[idx])
        if np.isfinite(v):
            vals.append(v)
    return est, float(np.quantile(vals, 0.025)), float(np.quantile(vals, 0.975))


def labels(never: np.ndarray, always: np.ndarray) -> dict[str, np.ndarray]:
    """The two outcomes a gate's U should predict, from 0/1 (or graded) correctness."""
    never, always = np.asarray(never, float), np.asarray(always, float)
    return {"never_wrong": never < 0.5, "helps": (always >= 0.5) & (never < 0.5)}


def retrieve_top(score: np.ndarray, rate: float) -> np.ndarray:
    """Retrieve for the `rate` share of questions with the highest score (stable on ties): how a
    trivial signal or a baseline's score is compared with a gate at that gate's own rate."""
    score = np.asarray(score, float)
    m = int(round(rate * len(score)))
    out = np.zeros(len(score), bool)
    out[np.argsort(-score, kind="stable")[:m]] = True
    return out
