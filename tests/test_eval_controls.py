"""The eval's controls on synthetic outcomes with known answers: random gate, oracle, AUROC, and
the verdict's three questions."""

import numpy as np
import pytest

from targ_mlx.eval import analysis as an
from targ_mlx.eval import controls as ctl
from targ_mlx.eval import sweep


def outcomes(n=400, seed=0):
    """Never right on 20%, Always right on 60%; retrieval helps on the questions Never gets wrong
    and Always gets right."""
    rng = np.random.default_rng(seed)
    never = (rng.random(n) < 0.2).astype(float)
    always = np.maximum(never, (rng.random(n) < 0.5).astype(float))
    return never, always


def test_gate_equal_to_the_oracle_scores_the_oracle_accuracy():
    never, always = outcomes()
    oracle = ctl.oracle_retrieve(never, always)
    rate = float(oracle.mean())
    score = float(ctl.gated(oracle, never, always).mean())
    assert score == pytest.approx(ctl.oracle_score(never, always, rate))
    assert score == pytest.approx(max(never.mean(), always.mean(), np.maximum(never, always).mean()))
    # no gate at that rate does better: the oracle is the ceiling
    rc = ctl.random_control(oracle, never, always, draws=500)
    assert rc.hi < score and rc.p_at_least == 0.0


def test_oracle_at_a_small_budget_takes_only_helped_questions():
    never = np.array([0, 0, 0, 1, 1.0])
    always = np.array([1, 1, 0, 0, 1.0])
    assert ctl.oracle_score(never, always, 0.2) == pytest.approx(0.4 + 0.2)  # one helped question
    assert ctl.oracle_score(never, always, 1.0) == pytest.approx(0.8)  # never retrieves where it hurts


def test_gate_independent_of_the_outcome_matches_random_within_its_band():
    never, always = outcomes(n=600, seed=1)
    coin = np.random.default_rng(7).random(600) < 0.3  # a gate that ignores the question
    rc = ctl.random_control(coin, never, always, draws=1000, seed=2)
    assert rc.lo <= rc.gate <= rc.hi
    assert 0.05 < rc.p_at_least < 0.95
    exp = float(ctl.random_expected(never, always, rc.rate).mean())
    assert rc.expected == pytest.approx(exp)


def test_random_expected_is_the_mean_over_draws():
    never, always = outcomes(n=50, seed=3)
    retrieve = np.zeros(50, bool)
    retrieve[:10] = True
    rc = ctl.random_control(retrieve, never, always, draws=20000, seed=4)
    assert (rc.lo + rc.hi) / 2 == pytest.approx(rc.expected, abs=0.02)


@pytest.mark.parametrize("score, label, want", [
    ([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1], 1.0),
    ([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1], 0.0),
    ([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1], 0.5),
    ([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1], 0.75),
])
def test_auroc_known_values(score, label, want):
    assert ctl.auroc(np.array(score), np.array(label, bool)) == pytest.approx(want)


def test_auroc_is_nan_without_both_classes_and_ci_brackets_estimate():
    assert np.isnan(ctl.auroc(np.array([0.1, 0.2]), np.array([True, True])))
    rng = np.random.default_rng(0)
    label = rng.random(300) < 0.4
    score = label + rng.normal(0, 1.0, 300)
    est, lo, hi = ctl.auroc_ci(score, label, n_boot=300)
    assert lo < est < hi and est > 0.6


def test_eval_budget_tau_is_the_calibrate_rule():
    from targ_mlx.calibration.thresholds import budget_threshold

    u = np.array([0.1, 0.2, 0.2, 0.2, 0.5, 0.7, 0.7, 0.9])
    for rho in (0.05, 0.1, 0.3, 0.5):
        assert sweep.tau_for_budget(u, rho) == budget_threshold(u, rho)


def records_for(u_margin, never_acc, always_acc):
    """Minimal records with one k and the fields Signals reads."""
    out = []
    for i, (u, nv, al) in enumerate(zip(u_margin, never_acc, always_acc)):
        out.append({"id": f"q{i}", "question": "who is q", "answers": ["a"], "tok_prompt": 10, "draft": [1, 2, 3],
                    "entropies": [1.0], "gaps": [1.0], "logprobs": [-0.1], "samples": [],
                    "scores": {"entropy": {"20": u}, "margin": {"20": u}, "variance": {}},
                    "never": {"answer": "", "em": 0.0, "f1": 0.0, "acc": nv, "tok_out": 3},
                    "always": {"answer": "", "em": 0.0, "f1": 0.0, "acc": al, "tok_out": 3, "tok_ctx": 100}})
    return out


def test_verdict_says_no_for_a_gate_that_only_matches_random():
    never, always = outcomes(n=600, seed=5)
    u = np.random.default_rng(9).random(600)  # U unrelated to the outcome
    sig = sweep.Signals(records_for(u, never, always))
    dev, test = sweep.split(sig.n, 0)
    v = an.verdict(sig, dev, test, "acc", 20, n_boot=300, seed=0)
    assert v.answers()["never"] == "yes"  # retrieving some questions beats never retrieving...
    assert v.answers()["random"] != "yes"  # ...but no better than a coin at the same rate
    assert v.random.lo <= v.gate <= v.random.hi


def test_verdict_says_yes_for_a_gate_that_ranks_helped_questions_first():
    never, always = outcomes(n=600, seed=6)
    u = (always > never) + np.random.default_rng(2).normal(0, 0.3, 600)
    sig = sweep.Signals(records_for(u, never, always))
    dev, test = sweep.split(sig.n, 0)
    v = an.verdict(sig, dev, test, "acc", 20, n_boot=300, seed=0)
    assert v.answers()["random"] == "yes" and v.gate <= v.oracle + 1e-12


def test_headline_metric_is_accuracy_when_em_is_uninformative():
    never, always = outcomes(n=100)
    sig = sweep.Signals(records_for(np.zeros(100), never, always))
    assert an.headline_metric(sig) == "acc"


def test_auroc_rows_split_retrieval_helps_into_rescued_and_covered():
    """A score that finds the questions the model gets wrong but the corpus does not cover ranks
    "retrieval helps" below chance; the (c) and (d) columns say why."""
    never, always = outcomes(n=400, seed=8)
    wrong = never < 0.5
    covered = always > 0.5  # the passages hold the answer exactly where Always is right
    u = wrong.astype(float) - 0.5 * covered + np.random.default_rng(1).normal(0, 0.05, 400)
    recs = records_for(u, never, always)
    for r, h in zip(recs, covered):
        r["always"]["hit"] = float(h)
    row = next(r for r in an.aurocs(sweep.Signals(recs), "acc", [20], n_boot=50, seed=0) if r.name == "margin k=20")
    assert row.never_wrong[0] > 0.9  # it knows when the model is wrong...
    assert row.covered[0] < 0.5 and row.rescued[0] < 0.1  # ...but prefers what the corpus lacks
    assert row.helps[0] < 0.5
    del recs[0]["always"]["hit"]  # older records without hit@K: no (d)
    row = an.aurocs(sweep.Signals(recs), "acc", [20], n_boot=20, seed=0)[0]
    assert np.isnan(row.covered[0])
