"""Sweep maths over hand-made records: no model."""

from pathlib import Path

import numpy as np
import pytest

from targ_mlx.eval import baselines as bl
from targ_mlx.eval import sweep


def rec(i, u, never_em, always_em, p_need=0.5):
    sc = {"margin": {"20": u}, "entropy": {"20": u * 2}, "variance": {"20": u / 2}}
    return {"id": str(i), "question": f"q{i}", "answers": ["a"], "draft": [1, 2, 3], "logprobs": [-0.1, -2.0],
            "scores": sc, "never": {"em": never_em, "f1": never_em, "acc": never_em, "tok_out": 3},
            "always": {"em": always_em, "f1": always_em, "acc": always_em, "tok_out": 4, "tok_ctx": 100},
            "probes": {"p_need": p_need, "p_supported": 0.9, "p_relevant": 0.2}}


RECS = [rec(0, 0.1, 1, 0), rec(1, 0.2, 1, 1), rec(2, 0.6, 0, 1), rec(3, 0.9, 0, 1, p_need=0.9)]


def test_gate_point_mixes_branches():
    sig = sweep.Signals(RECS)
    p = sweep.gate_point(sig, "margin", 20, 0.5)  # retrieves rows 2, 3 -> all correct
    assert p.rate == 0.5 and p.em == 1.0
    assert p.tok_ctx == pytest.approx(50.0) and p.tok_draft == 3.0 and p.tok_out == pytest.approx(3.5)
    assert sweep.never_point(sig).em == 0.5 and sweep.always_point(sig).em == 0.75
    assert sweep.gate_point(sig, "margin", 20, 1.0).rate == 0.0  # strict U > tau


def test_thresholds_cover_rates_zero_to_one():
    u = np.array([0.1, 0.2, 0.6, 0.9])
    taus = sweep.thresholds(u, fixed=(0.5,), n_quantiles=4)
    assert 0.5 in taus and min(taus) == pytest.approx(0.1) and max(taus) == pytest.approx(0.9)
    rates = [float(np.mean(u > t)) for t in taus]
    assert max(rates) == 0.75 and min(rates) == 0.0


def test_budget_tau_and_calibration():
    u = np.arange(100) / 100.0
    tau = sweep.tau_for_budget(u, 0.1)
    assert np.mean(u > tau) == pytest.approx(0.1, abs=0.011)
    with pytest.raises(ValueError, match="rho"):
        sweep.tau_for_budget(u, 1.5)


def test_quadrants_sum_to_100():
    q = sweep.quadrants(np.array([0.1, 0.2, 0.6, 0.9]), np.array([1, 0, -1, 1]), 0.5)
    assert q == {"a": 25.0, "b": 25.0, "c": 25.0, "d": 25.0, "e": 0.0}


def test_deciles_low_u_first():
    dec = sweep.deciles(np.array([0.9, 0.1, 0.5, 0.3]), np.array([0, 1, 1, 0]), bins=2)
    assert [m for _, _, m in dec] == [0.5, 0.5] and dec[0][1] <= dec[1][0]


def test_baselines_from_probes():
    sig = sweep.Signals(RECS)
    assert bl.selfeval(sig, 0.7).rate == 0.25  # only p_need 0.9
    assert bl.flare(sig, 0.5).rate == 1.0  # exp(-2) < 0.5 on every row
    c = bl.crag(sig, 0.5)
    assert c.rate == 1.0 and c.used_ctx == 0.0 and c.em == 0.5  # graded irrelevant -> Never answers
    s = bl.skr_scores(np.eye(2), np.array([1.0, -1.0]), np.array([[1.0, 0.0]]), neighbours=1)
    assert s.tolist() == [1.0]


def test_skr_neighbours_ignore_float_noise_between_cpus():
    """Two labelled questions whose similarities to the query differ by ~1e-8, and two encodings of
    the query that differ by float noise (what another CPU's encoder gives) and swap which is nearer:
    the near-tie goes to the first either way, so a report rebuilt on another machine is the same."""
    d = 1e-4
    train = np.array([[1.0, 0.0], [np.cos(d), np.sin(d)]])
    delta = np.array([1.0, -1.0])
    here, there = np.array([[1.0, -2e-4]]), np.array([[1.0, 2e-4]])
    assert np.sign((here @ train.T)[0, 1] - (here @ train.T)[0, 0]) != np.sign((there @ train.T)[0, 1] - (there @ train.T)[0, 0])
    assert bl.skr_scores(train, delta, here, neighbours=1).tolist() == [1.0]
    assert bl.skr_scores(train, delta, there, neighbours=1).tolist() == [1.0]


def test_latency_prices_stages():
    lat = {r["id"]: {"never": 1.0, "draft": 0.5, "skip": 1.1, "draft_var": 0.8, "skip_var": 1.4, "retrieval": 0.2,
                     "rag": 2.0, "p_need": 0.3, "p_supported": 0.3, "p_relevant": 0.6} for r in RECS}
    sig = sweep.Signals(RECS, lat)
    assert sweep.never_point(sig).dlat == 1.0
    assert sweep.always_point(sig).dlat == pytest.approx(1.2)
    p = sweep.gate_point(sig, "margin", 20, 0.5)  # half skip (1.1), half draft+ret+rag (2.7)
    assert p.dlat == pytest.approx((1.1 + 2.7) / 2 - 1.0)


def test_report_keeps_the_throughput_of_the_run_that_made_records():
    """A later run that only timed latency (or filled hit@K) made no records: the report's
    throughput line stays the one of the run that did."""
    from targ_mlx.eval.report import _record_run

    made = {"records_new": 396, "records_seconds": 1090.0}
    timed = {"records_new": 0, "latency_new": 50}
    assert _record_run({"run": timed, "runs": [made, timed]}) == made
    assert _record_run({"run": made}) == made
    assert _record_run({"run": timed}) == timed  # nothing better to show


def test_the_report_names_a_gate_registered_after_import(tmp_path):
    """A gate registered by a user (not in the report's own names) gets a row under its name, not a
    KeyError; the records are the first 24 committed SmolLM2 NQ-Open records."""
    import json as _json

    from targ_mlx import gates
    from targ_mlx.eval import report
    from targ_mlx.gates.base import DRAFT, REGISTRY, Gate, GateParams
    from targ_mlx.gates.paper import margin_score

    class SharpMargin(Gate):
        name, needs, default_tau = "sharp_margin", frozenset({DRAFT}), 0.5

        def score(self, sig, p=GateParams()):
            return margin_score(list(sig.gaps)[: p.k], 2 * p.beta)

    records = Path(__file__).resolve().parents[1] / "results/smollm2-135m/seeded/nq_open/records.jsonl"
    with open(records, encoding="utf-8") as f:
        rows = [_json.loads(next(f)) for _ in range(24)]
    gates.register(SharpMargin())
    try:
        report.write_all("t", rows, {}, tmp_path, n_boot=20, plots=False)
    finally:
        del REGISTRY["sharp_margin"]
    assert "| Sharp margin |" in (tmp_path / "summary.md").read_text(encoding="utf-8")
