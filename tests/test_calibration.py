import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from targ_mlx.calibration.thresholds import (
    accuracy_threshold,
    budget_threshold,
    gated_accuracy,
    retrieval_rate,
    text_histogram,
)

# U values as logged: finite, often tied (variance U is a multiple of 1/(N*k)).
scores_st = st.lists(
    st.one_of(
        st.floats(0, 1, allow_nan=False),
        st.integers(0, 10).map(lambda i: i / 10),
    ),
    min_size=1,
    max_size=60,
)


def test_retrieval_rate_is_strict():
    assert retrieval_rate([0.1, 0.2, 0.2, 0.3], 0.2) == 0.25
    assert retrieval_rate([0.1, 0.2, 0.2, 0.3], 0.19) == 0.75


def test_budget_threshold_hand_computed():
    u = [0.1, 0.2, 0.3, 0.4]
    assert budget_threshold(u, 0.5) == 0.2  # 0.3 and 0.4 retrieve
    assert budget_threshold(u, 0.25) == 0.3
    assert budget_threshold(u, 0.0) == 0.4
    tau = budget_threshold(u, 1.0)
    assert tau < 0.1 and retrieval_rate(u, tau) == 1.0


def test_budget_threshold_with_ties():
    u = [0.5] * 8 + [0.9, 1.0]
    assert budget_threshold(u, 0.1) == 0.9
    # Achievable rates are 1.0, 0.2, 0.1, 0.0: 0.2 is the closest to 0.5.
    assert budget_threshold(u, 0.5) == 0.5
    assert retrieval_rate(u, budget_threshold(u, 0.5)) == 0.2


def test_budget_threshold_tie_between_rates_takes_lower_rate():
    # Rates 0.5 and 0.25 are both 0.125 from 0.375; a budget is a ceiling.
    assert budget_threshold([1, 2, 3, 4], 0.375) == 3.0


@pytest.mark.parametrize("rho", [-0.1, 1.5, float("nan")])
def test_budget_threshold_rejects_bad_rho(rho):
    with pytest.raises(ValueError, match="rho must be a retrieval rate in \\[0, 1\\]"):
        budget_threshold([0.1, 0.2], rho)


def test_scores_must_be_present_and_finite():
    with pytest.raises(ValueError, match="scores is empty"):
        budget_threshold([], 0.1)
    with pytest.raises(ValueError, match="scores must be finite; got inf"):
        budget_threshold([0.1, math.inf], 0.1)


def test_accuracy_threshold_hand_computed():
    u = [0.1, 0.2, 0.3, 0.4]
    never = [1, 1, 0, 0]
    always = [0, 1, 1, 1]
    tau = accuracy_threshold(u, never, always)
    assert tau == 0.2
    assert gated_accuracy(u, tau, never, always) == 1.0


def test_accuracy_threshold_prefers_fewer_retrievals_on_tie():
    u = [0.1, 0.2, 0.3, 0.4]
    assert accuracy_threshold(u, [1, 1, 1, 1], [1, 1, 1, 1]) == 0.4  # retrieve nothing
    # Retrieving the top row or not gives the same accuracy: do not retrieve.
    assert accuracy_threshold(u, [0, 0, 1, 1], [0, 0, 1, 1]) == 0.4


def test_accuracy_threshold_can_retrieve_everything():
    u = [0.1, 0.2, 0.2, 0.4]
    tau = accuracy_threshold(u, [0, 0, 0, 0], [1, 1, 1, 1])
    assert retrieval_rate(u, tau) == 1.0


def test_accuracy_threshold_with_ties_and_f1():
    u = [0.2, 0.2, 0.5, 0.5]
    never = [0.9, 0.8, 0.1, 0.3]
    always = [0.5, 0.5, 0.7, 0.6]
    assert accuracy_threshold(u, never, always) == 0.2


def test_accuracy_threshold_checks_lengths():
    with pytest.raises(ValueError, match="one value per row; got 3, 2 and 3"):
        accuracy_threshold([0.1, 0.2, 0.3], [1, 0], [1, 0, 1])


@given(scores_st, st.floats(0, 1))
def test_budget_threshold_is_the_closest_achievable_rate(scores, rho):
    tau = budget_threshold(scores, rho)
    best = abs(retrieval_rate(scores, tau) - rho)
    for candidate in [min(scores) - 1, *scores]:
        assert best <= abs(retrieval_rate(scores, candidate) - rho) + 1e-12


@given(scores_st, st.data())
def test_accuracy_threshold_beats_every_candidate(scores, data):
    n = len(scores)
    never = data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    always = data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    tau = accuracy_threshold(scores, never, always)
    best = gated_accuracy(scores, tau, never, always)
    for candidate in [min(scores) - 1, *scores]:
        acc = gated_accuracy(scores, candidate, never, always)
        assert best >= acc - 1e-12
        # A candidate as good as the chosen tau must not retrieve less than it.
        if acc >= best - 1e-12:
            assert retrieval_rate(scores, candidate) >= retrieval_rate(scores, tau)


@given(scores_st, st.floats(-1, 2), st.floats(-1, 2))
def test_retrieval_rate_is_monotone_in_tau(scores, a, b):
    lo, hi = sorted((a, b))
    assert retrieval_rate(scores, hi) <= retrieval_rate(scores, lo)


def test_text_histogram_marks_tau_and_counts_every_row():
    rng = np.random.default_rng(0)
    u = rng.uniform(0, 1, 200)
    text = text_histogram(u, 0.42, width=30, bins=10)
    lines = text.splitlines()
    assert len(lines) == 11
    assert sum(int(line.split("|")[2].split()[0]) for line in lines[:10]) == 200
    marked = [line for line in lines if "<- tau = 0.42" in line]
    assert len(marked) == 1
    lo, hi = (float(x) for x in marked[0].split("|")[0].split())
    assert lo <= 0.42 < hi
    # Bins wholly above tau are drawn as retrieving, wholly below as not.
    assert "." not in lines[-2].split("|")[1] and "#" not in lines[0].split("|")[1]


def test_text_histogram_handles_constant_scores():
    text = text_histogram([0.3] * 5, 0.3, bins=4)
    assert "<- tau = 0.3" in text


def test_isotonic_gives_tied_x_one_value():
    """Tied x values are one point of their mean y: a discrete signal's last tie (here x = 1.0, whose
    questions are right 1 time in 3) does not leave its last row as a knot of its own at y = 1."""
    from targ_mlx.calibration.thresholds import isotonic

    kx, ky = isotonic([0.2, 0.5, 1.0, 1.0, 1.0], [0, 0, 0, 0, 1])
    assert kx == pytest.approx([0.35, 1.0]) and ky == pytest.approx([0, 1 / 3])  # (equal means pool too)
    # weights count within a tie: x = 1.0 is right 1 time in 4, below x = 0.0's 1, so the two pool
    kx, ky = isotonic([1.0, 1.0, 0.0], [1, 0, 1], weights=[1, 3, 1])
    assert kx == pytest.approx([0.8]) and ky == pytest.approx([0.4])
