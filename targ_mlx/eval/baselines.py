"""The paper's expanded baselines under its strict budget (<= 1 retrieval, <= 1 reflection per
query), priced from the one-pass records like the gates:

  Self-Eval      ask the model whether it needs to look something up; retrieve iff P(yes) > theta
  FLARE          retrieve once iff some generated token has p < theta, regenerate with context
  Self-RAG-lite  answer, self-check support; retrieve once iff P(supported) < theta
  CRAG-lite      always retrieve; the model grades the passages; answer without them iff
                 P(relevant) <= theta
  SKR            kNN over question embeddings of a labelled split (did retrieval help?)

Simplifications (all "lite"): FLARE's regeneration is the Always answer (context retrieved by the
question, not by the tentative sentence); CRAG-lite grades the head of the packed context (first
CRAG_CONTEXT_TOKENS tokens) in one probe and has no web-search fallback.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from targ_mlx.eval.sweep import Point, Signals, _dlat, evaluate

THETAS = {"selfeval": (0.3, 0.5, 0.7), "flare": (0.3, 0.5), "selfrag": (0.3, 0.5, 0.7), "crag": (0.3, 0.5, 0.7),
          "skr": (-0.2, 0.0, 0.2)}
DEFAULT_THETA = {"selfeval": 0.5, "flare": 0.5, "selfrag": 0.5, "crag": 0.5, "skr": 0.0}
LABELS = {"selfeval": "Self-Eval gate", "flare": "FLARE", "selfrag": "Self-RAG-lite", "crag": "CRAG-lite", "skr": "SKR"}
SKR_NEIGHBOURS = 10
SKR_DECIMALS = 4


def _rag(sig, rows):
    return sig.lat("retrieval") + sig.lat("rag")


def selfeval(sig: Signals, theta: float) -> Point:
    r = sig.p_need > theta
    dl = _dlat(sig, lambda rows: sig.lat("p_need") + np.where(r[rows], _rag(sig, rows), sig.lat("never")))
    return evaluate(sig, r, "selfeval", None, theta, dlat=dl)


def flare(sig: Signals, theta: float) -> Point:
    r = sig.min_p < theta
    dl = _dlat(sig, lambda rows: sig.lat("never") + np.where(r[rows], _rag(sig, rows), 0.0))
    return evaluate(sig, r, "flare", None, theta, dlat=dl)


def selfrag(sig: Signals, theta: float) -> Point:
    r = sig.p_supported < theta
    dl = _dlat(sig, lambda rows: sig.lat("never") + sig.lat("p_supported") + np.where(r[rows], _rag(sig, rows), 0.0))
    return evaluate(sig, r, "selfrag", None, theta, dlat=dl)


def crag(sig: Signals, theta: float) -> Point:
    use = sig.p_relevant > theta
    dl = _dlat(sig, lambda rows: sig.lat("retrieval") + sig.lat("p_relevant")
               + np.where(use[rows], sig.lat("rag"), sig.lat("never")))
    return evaluate(sig, np.ones(sig.n, bool), "crag", None, theta, dlat=dl, used_ctx=use)


def skr_scores(train_vecs: np.ndarray, train_delta: np.ndarray, vecs: np.ndarray,
               neighbours: int = SKR_NEIGHBOURS) -> np.ndarray:
    """Mean label (+1 retrieval helped, -1 hurt, 0 neither) over each query's nearest labelled
    questions by cosine similarity (vectors are normalised)."""
    if len(train_vecs) == 0:
        return np.zeros(len(vecs))
    # rounded: encoders differ in the last float bits across CPUs (AVX2 / AVX-512), and near-ties
    # would otherwise pick other neighbours, so a report rebuilt elsewhere would differ
    sims = np.round(vecs @ train_vecs.T, SKR_DECIMALS)
    nn = np.argsort(-sims, axis=1, kind="stable")[:, : min(neighbours, len(train_vecs))]
    return np.sign(train_delta)[nn].mean(axis=1)


def skr(sig: Signals, scores: np.ndarray, theta: float) -> Point:
    r = scores > theta
    # the kNN lookup's cost is one query encoding, about the retrieval stage's
    dl = _dlat(sig, lambda rows: sig.lat("retrieval") + np.where(r[rows], _rag(sig, rows), sig.lat("never")))
    return evaluate(sig, r, "skr", None, theta, dlat=dl)


def baseline_points(sig: Signals, skr_score: np.ndarray | None = None, have_probes: bool = True) -> list[Point]:
    out = [flare(sig, t) for t in THETAS["flare"]]
    if have_probes and np.isfinite(sig.p_need).all():
        out += [selfeval(sig, t) for t in THETAS["selfeval"]]
        out += [selfrag(sig, t) for t in THETAS["selfrag"]]
        out += [crag(sig, t) for t in THETAS["crag"]]
    if skr_score is not None:
        out += [skr(sig, skr_score, t) for t in THETAS["skr"]]
    return out


def default_rows(points: Sequence[Point]) -> list[Point]:
    """One row per baseline at its default theta (FLARE at both of the paper's thetas)."""
    rows = []
    for name in LABELS:
        for p in points:
            if p.method == name and (p.tau == DEFAULT_THETA[name] or (name == "flare" and p.tau == 0.3)):
                rows.append(p)
    return rows
