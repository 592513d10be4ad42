"""Gate maths: hand-computed values and the paper's lemmas as hypothesis properties."""

import math

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from targ_mlx import gates
from targ_mlx.runtime.sampling import step_entropy, step_gap

finite = st.floats(min_value=-30, max_value=30, allow_nan=False, allow_infinity=False)
gaps_st = st.lists(st.floats(min_value=0, max_value=60, allow_nan=False), min_size=1, max_size=40)


def test_step_stats_hand_computed():
    probs = mx.array([[0.5, 0.25, 0.25, 0.0001]])
    logits = mx.log(probs)
    h = step_entropy(logits).item()
    p = [0.5, 0.25, 0.25, 0.0001]
    z = sum(p)
    expected = -sum(q / z * math.log(q / z) for q in p)
    assert h == pytest.approx(expected, rel=1e-5)
    assert step_gap(mx.array([[1.0, 4.0, 2.5, -1.0]])).item() == pytest.approx(1.5)


def test_scores_hand_computed():
    assert gates.entropy_score([0.5, 1.5]) == pytest.approx(1.0)
    assert gates.margin_score([0.0, 3.0], beta=3.0) == pytest.approx((1 + math.exp(-1)) / 2)
    # step 0: all agree (d=0); step 1: modal 3/5 (d=0.4)
    samples = [[1, 2], [1, 2], [1, 2], [1, 3], [1, 4]]
    assert gates.variance_score(samples) == pytest.approx(0.2)


def test_decide_strict_and_modes():
    assert gates.decide("margin", 0.5, 0.5).retrieve is False  # U > tau, strictly
    assert gates.decide("margin", 0.51, 0.5).retrieve is True
    assert gates.decide("never", None, 0.0).retrieve is False
    assert gates.decide("always", None, 0.0).retrieve is True
    with pytest.raises(ValueError, match="unknown gate 'bogus'"):
        gates.decide("bogus", 0.1, 0.1)
    with pytest.raises(ValueError, match="beta must be > 0"):
        gates.margin_score([1.0], beta=0)
    with pytest.raises(ValueError, match="empty"):
        gates.entropy_score([])


@given(gaps_st, st.floats(min_value=0.01, max_value=10))
def test_lemma1_margin_in_unit_interval_and_decreasing_under_shift(gaps, shift):
    u = gates.margin_score(gaps, 3.0)
    assert 0 < u <= 1
    assert gates.margin_score([g + shift for g in gaps], 3.0) < u


@given(gaps_st, gaps_st, st.floats(min_value=0.05, max_value=1))
def test_lemma1_order_equivalence_with_mean_gap_for_uniform_shifts(gaps, _, tau):
    # thresholding U_mar and thresholding the gap shift are the same decision (monotone map)
    shifted = [[g + c for g in gaps] for c in (0.0, 0.5, 1.0, 2.0, 4.0)]
    decisions = [gates.margin_score(s) > tau for s in shifted]
    assert decisions == sorted(decisions, reverse=True)  # once it stops retrieving, it stays stopped


@given(st.integers(min_value=1, max_value=8), st.integers(min_value=1, max_value=12), st.data())
def test_lemma2_variance_bounds(n, k, data):
    samples = data.draw(st.lists(st.lists(st.integers(0, 5), min_size=k, max_size=k), min_size=n, max_size=n))
    u = gates.variance_score(samples, k)
    assert -1e-12 <= u <= (n - 1) / n + 1e-12


@given(st.integers(min_value=1, max_value=8), st.integers(min_value=1, max_value=12))
def test_lemma2_equality_when_all_samples_differ(n, k):
    samples = [[i * 100 + t for t in range(k)] for i in range(n)]
    assert gates.variance_score(samples, k) == pytest.approx((n - 1) / n)


@settings(max_examples=50, deadline=None)
@given(st.lists(finite, min_size=2, max_size=64), finite)
def test_entropy_bounds_and_shift_invariance(row, c):
    logits = mx.array([row])
    h = step_entropy(logits).item()
    assert -1e-5 <= h <= math.log(len(row)) + 1e-4
    assert step_entropy(logits + c).item() == pytest.approx(h, abs=1e-4)
    g = step_gap(logits).item()
    assert step_gap(logits + c).item() == pytest.approx(g, abs=1e-4)
    assert g >= 0


@given(st.lists(st.floats(min_value=0, max_value=5), min_size=1, max_size=20), st.floats(0, 5), st.floats(0, 5))
def test_decision_monotone_in_threshold(values, t1, t2):
    lo, hi = sorted((t1, t2))
    u = gates.entropy_score(values)
    assert gates.decide("entropy", u, hi).retrieve <= gates.decide("entropy", u, lo).retrieve


def test_make_gate_composes_score_and_threshold():
    sig = gates.DraftSignals(entropies=[1.0, 3.0], gaps=[0.0, 0.0], samples=[[1], [2]])
    assert gates.make_gate("entropy", 1.9)(sig).retrieve is True
    assert gates.make_gate("margin", 0.99)(sig).signal == pytest.approx(1.0)
    assert gates.make_gate("variance", 0.4)(sig).retrieve is True
    assert gates.make_gate("never", 0.0)(sig).signal is None


def test_the_evidence_gate_reads_the_model_apart_where_the_passages_say_its_draft():
    """Where the packed context says what the draft says, P(Never right | U_mar) comes from the
    confirmed fit (such answers are right far more often: reading changes little); otherwise from
    the unconfirmed one; unknown (None), from the fit over every question. A model whose dev records
    had too few confirmed questions ships one fit, and the flag changes nothing."""
    from targ_mlx.gates.evidence import calibrations, interp, memory_fit

    gaps = [2.0] * 20
    ev = (gates.Evidence("Mona Lisa", 0.62), gates.Evidence("Louvre", 0.41))
    cal = calibrations()["qwen2.5-coder-1.5b"]
    assert "memory_confirmed" in cal and "memory_unconfirmed" in cal
    u_mar, p_read = gates.margin_score(gaps), interp(cal["read"]["x"], cal["read"]["y"], 0.62)
    g = gates.get("evidence")
    for confirmed, fit in ((True, "memory_confirmed"), (False, "memory_unconfirmed"), (None, "memory")):
        sig = gates.Signals(gaps=gaps, evidence=ev, model="qwen2.5-coder-1.5b", confirmed=confirmed)
        p_mem = interp(cal[fit]["x"], cal[fit]["y"], u_mar)
        assert g.score(sig, gates.GateParams(20)) == pytest.approx(p_read * (1 - p_mem))
    sure = gates.Signals(gaps=gaps, evidence=ev, model="qwen2.5-coder-1.5b", confirmed=True)
    unsure = gates.Signals(gaps=gaps, evidence=ev, model="qwen2.5-coder-1.5b", confirmed=False)
    assert g.score(sure, gates.GateParams(20)) < g.score(unsure, gates.GateParams(20))
    # declining, it says why, and a confirmed answer is never "no good source"
    d = g.decide(sure, 1e9, gates.GateParams(20))
    assert not d.retrieve and not d.no_source
    assert d.reason.startswith("the passages say what the model would say (0.62, Mona Lisa)")
    one = {"read": cal["read"], "memory": cal["memory"]}  # what fit_evidence ships under 30 confirmed
    assert memory_fit(one, True) is memory_fit(one, False) is memory_fit(one, None) is cal["memory"]


def test_the_evidence_gate_reads_the_mean_of_its_two_search_calibrations():
    """With a support calibration (what fit_calibration makes from records that hold the support),
    P(Always right) is the mean of P(A | s_1) and P(A | support); without one (a fit made before it,
    or a runner that gave no support) it is P(A | s_1) alone. More support never lowers U."""
    from targ_mlx.gates.evidence import fit_calibration, interp, read_probability

    rng = __import__("numpy").random.default_rng(0)
    s1 = rng.uniform(0.2, 0.8, 400)
    sup = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], 400)
    always = (rng.uniform(size=400) < 0.2 + 0.5 * sup).astype(float)  # the support carries the signal here
    never = (rng.uniform(size=400) < 0.1).astype(float)
    cal = fit_calibration(s1, rng.uniform(0, 1, 400), always, never, [False] * 400, support=sup)
    assert "read_support" in cal and "read_support" not in fit_calibration(s1, s1, always, never, [False] * 400)
    p_s1 = interp(cal["read"]["x"], cal["read"]["y"], 0.5)
    p_sup = interp(cal["read_support"]["x"], cal["read_support"]["y"], 1.0)
    assert read_probability(cal, 0.5, 1.0) == pytest.approx((p_s1 + p_sup) / 2)
    assert read_probability(cal, 0.5, None) == p_s1
    assert read_probability({k: v for k, v in cal.items() if k != "read_support"}, 0.5, 1.0) == p_s1
    g = gates.get("evidence")
    ev = (gates.Evidence("Mona Lisa", 0.5),)
    u = [g.score(gates.Signals(gaps=[2.0] * 20, evidence=ev, support=x), gates.GateParams(20, calibration=cal))
         for x in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert u == sorted(u) and u[-1] > u[0]
    # its reason names what the best sentence holds, read or not
    for tau in (0.0, 1e9):
        d = g.decide(gates.Signals(gaps=[2.0] * 20, evidence=ev, support=0.75), tau, gates.GateParams(20, calibration=cal))
        assert "Mona Lisa; one sentence holds 75% of the question)" in d.reason
