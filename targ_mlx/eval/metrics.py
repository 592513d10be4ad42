"""Answer scoring (SQuAD normalisation EM/F1 best over aliases, containment accuracy, ASQA STR-EM)
and the bootstrap; pure functions over strings and arrays.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

import numpy as np

from targ_mlx.matching import contains, normalize  # noqa: F401  (accuracy is the core's containment)


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    p = normalize(prediction)
    return float(any(p == normalize(g) for g in golds))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: Sequence[str]) -> float:
    p = normalize(prediction).split()
    return max((_f1(p, normalize(g).split()) for g in golds), default=0.0)


def score_all(prediction: str, golds: Sequence[str]) -> dict[str, float]:
    return {"em": exact_match(prediction, golds), "f1": f1_score(prediction, golds), "acc": contains(prediction, golds)}


def bootstrap_ci(values: np.ndarray, n: int = 1000, seed: int = 0, stat: Callable = np.mean,
                 alpha: float = 0.05) -> tuple[float, float, float]:
    """(estimate, low, high) of `stat` over resampled rows; values (Q,) or (Q, ...) paired columns."""
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n, len(values)))
    stats = np.array([stat(values[i]) for i in idx])
    lo, hi = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    return float(stat(values)), float(lo), float(hi)
