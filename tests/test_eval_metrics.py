"""SQuAD normalisation, EM/F1 best over aliases, containment (STR-EM) and the bootstrap: hand-computed."""

import numpy as np
import pytest

from targ_mlx.eval.metrics import bootstrap_ci, contains, exact_match, f1_score, normalize, score_all


@pytest.mark.parametrize("text, expected", [
    ("The Beatles!", "beatles"),
    ("  A  tale of Two   Cities. ", "tale of two cities"),
    ("Washington, D.C.", "washington dc"),
    ("an apple an day", "apple day"),
    ("theatre", "theatre"),  # 'the' only as a word
])
def test_normalize_squad_cases(text, expected):
    assert normalize(text) == expected


def test_exact_match_best_over_aliases():
    assert exact_match("the Beatles", ["Rolling Stones", "Beatles"]) == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0


def test_f1_hand_computed():
    # pred "john lennon" vs gold "john winston lennon": overlap 2, P = 1, R = 2/3, F1 = 0.8
    assert f1_score("John Lennon", ["John Winston Lennon"]) == pytest.approx(0.8)
    # best over aliases
    assert f1_score("John Lennon", ["Paul", "John Lennon"]) == 1.0
    assert f1_score("", ["x"]) == 0.0


def test_contains_word_boundaries():
    assert contains("It was written by Jane Austen in 1813.", ["jane austen"]) == 1.0
    assert contains("1969s", ["1969"]) == 0.0  # a token boundary, not a substring
    assert score_all("Canberra", ["Canberra"]) == {"em": 1.0, "f1": 1.0, "acc": 1.0}


def test_bootstrap_ci_brackets_mean_and_is_seeded():
    v = np.array([1, 0, 1, 1, 0, 0, 1, 0, 1, 1], float)
    est, lo, hi = bootstrap_ci(v, n=500, seed=3)
    assert est == pytest.approx(0.6)
    assert lo <= est <= hi and 0.0 <= lo and hi <= 1.0
    assert bootstrap_ci(v, n=500, seed=3) == (est, lo, hi)
    assert bootstrap_ci(np.ones(5), n=50)[1:] == (1.0, 1.0)
