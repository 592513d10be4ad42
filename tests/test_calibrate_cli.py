import re

import numpy as np
import pytest
from sqlite_utils import Database

from targ_mlx.calibration.cli import main as calibrate_main
from targ_mlx.calibration.cli import parse_since


def main(argv):
    """`targ-calibrate` on the margin gate's rows (these logs were made by it), unless a test names
    the gate: the config's default gate is the evidence gate, which these rows do not score."""
    return calibrate_main(argv if "--gate" in argv or "--help" in argv else ["--gate", "margin", *argv])
from targ_mlx.config import load_config
from targ_mlx.log.decisions import DecisionLog
from targ_mlx.records import Answer
from targ_mlx.settings import resolve_tau


def margin_scores(rng, n):
    """U_margin as the gate computes it: mean over k=20 tokens of exp(-gap / beta), beta = 3."""
    confidence = rng.beta(2, 2, size=(n, 1))
    gaps = rng.exponential(scale=0.5 + 12 * confidence, size=(n, 20))
    return np.exp(-gaps / 3.0).mean(axis=1)


def variance_scores(rng, n):
    """U_variance for N=5 samples, k=20: multiples of 0.01, so many rows tie."""
    agree = rng.beta(6, 1.2, size=(n, 1))
    top_count = 1 + rng.binomial(
        4, np.broadcast_to(agree, (n, 20))
    )  # samples agreeing on the mode
    return np.round((1 - top_count / 5).mean(axis=1), 2)


def eval_answer(u_margin, u_variance, tau=0.35, model="smollm2-135m", k=20):
    return Answer(
        question="q",
        answer="a",
        model=model,
        gate="margin",
        tau=tau,
        score=float(u_margin),
        retrieved=bool(u_margin > tau),
        k=k,
        scores={"margin": float(u_margin), "variance": float(u_variance)},
    )


@pytest.fixture
def eval_db(tmp_path):
    """An eval run's log: 400 questions gated by margin at tau = 0.35."""
    rng = np.random.default_rng(7)
    path = tmp_path / "eval.db"
    with DecisionLog(path) as log:
        for um, uv in zip(margin_scores(rng, 400), variance_scores(rng, 400)):
            log.record(eval_answer(um, uv), source="eval", session="run-1")
    return path


def run_cli(capsys, *argv):
    main(list(argv))
    return capsys.readouterr().out


def tau_of(out: str) -> float:
    return float(re.search(r"^tau = (\S+)", out, re.M)[1])


def realised_rate(path, gate, tau):
    return (
        Database(path)
        .execute(
            f"SELECT avg(u_{gate} > ?) FROM decisions WHERE u_{gate} IS NOT NULL", [tau]
        )
        .fetchone()[0]
    )


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--db",
        "--gate",
        "--k",
        "--since",
        "--source",
        "--budget",
        "--objective",
        "--write",
        "--config",
    ):
        assert flag in out


@pytest.mark.parametrize("gate", ["margin", "variance"])
@pytest.mark.parametrize("rho", [0.05, 0.1, 0.2, 0.3])
def test_budget_reproduces_the_rate_on_the_same_data(eval_db, capsys, gate, rho):
    out = run_cli(capsys, "--db", str(eval_db), "--gate", gate, "--budget", str(rho))
    tau = tau_of(out)
    # Variance U ties in blocks of up to ~2% of rows near these rates: +-1 point is the bound.
    assert abs(realised_rate(eval_db, gate, tau) - rho) <= 0.01 + 1e-9
    predicted = float(re.search(r"predicted retrieval rate = ([\d.]+)%", out)[1]) / 100
    assert abs(predicted - realised_rate(eval_db, gate, tau)) < 0.001
    assert "400 rows with u_" + gate in out
    assert "<- tau" in out


def test_budget_matches_the_eval_runs_own_rate(eval_db, capsys):
    # The run gated at tau = 0.35; asking for its realised rate gives that rate back.
    realised = (
        Database(eval_db).execute("SELECT avg(retrieved) FROM decisions").fetchone()[0]
    )
    out = run_cli(capsys, "--db", str(eval_db), "--budget", str(realised))
    assert abs(realised_rate(eval_db, "margin", tau_of(out)) - realised) <= 0.01 + 1e-9


def test_accuracy_objective_uses_both_branches(tmp_path, capsys):
    rng = np.random.default_rng(3)
    path = tmp_path / "eval.db"
    with DecisionLog(path) as log:
        for u in rng.uniform(0, 1, 300):
            # Retrieval helps exactly when the model is unsure (U > 0.6), with some noise.
            helps = u > 0.6
            never = float(not helps if rng.random() > 0.1 else helps)
            always = float(helps if rng.random() > 0.1 else not helps)
            log.record(
                eval_answer(u, 0.1),
                source="eval",
                em=always if u > 0.35 else never,
                branches={"never": {"em": never}, "always": {"em": always}},
            )
    out = run_cli(capsys, "--db", str(path), "--objective", "accuracy")
    assert 0.5 < tau_of(out) < 0.7
    assert "300 labelled rows (300 with both branches scored, 0 with feedback)" in out
    gated, never, always = (
        float(x)
        for x in re.search(
            r"gated em = (\S+)\s+\(never (\S+), always (\S+)\)", out
        ).groups()
    )
    assert gated > max(never, always)


def test_accuracy_objective_reads_chat_feedback_as_votes(tmp_path, capsys):
    path = tmp_path / "chat.db"
    with DecisionLog(path) as log:
        for i in range(40):
            u = i / 40
            row = log.record(eval_answer(u, 0.1, tau=0.5), source="chat")
            # Unretrieved answers went wrong from U = 0.3 up: retrieval should start there.
            if u <= 0.5:
                log.feedback(row, "wrong" if u >= 0.3 else "correct")
            else:
                log.feedback(row, "helpful")
        log.record(eval_answer(0.9, 0.1), source="chat")  # no feedback: not used
    out = run_cli(
        capsys, "--db", str(path), "--objective", "accuracy", "--source", "chat"
    )
    assert (
        "40 labelled rows (0 with both branches scored, 40 with feedback) of 41" in out
    )
    assert 0.27 <= tau_of(out) < 0.3


def test_too_few_rows_is_refused(tmp_path, capsys):
    path = tmp_path / "small.db"
    with DecisionLog(path) as log:
        for u in np.linspace(0, 1, 29):
            log.record(eval_answer(u, 0.1), source="eval")
    assert main(["--db", str(path), "--budget", "0.1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("error: Only 29 usable rows for gate margin, k=20 in")
    assert "(need 30)" in err
    # Labels are counted separately: 29 rows and none labelled.
    assert main(["--db", str(path), "--objective", "accuracy"]) == 2
    assert "Only 0 usable rows" in capsys.readouterr().err


def test_filters_narrow_the_rows(eval_db, capsys):
    with DecisionLog(eval_db) as log:
        for u in np.linspace(0, 1, 50):
            log.record(eval_answer(u, 0.1, model="qwen", k=10), source="chat")
    db = Database(eval_db)
    db.execute(
        "UPDATE decisions SET ts = '2020-01-01T00:00:00.000000Z' WHERE id <= 100"
    )
    db.conn.commit()
    out = run_cli(capsys, "--db", str(eval_db), "--budget", "0.1", "--since", "30d")
    assert "300 rows with u_margin" in out  # k=20 rows only, minus the 100 old ones
    out = run_cli(
        capsys, "--db", str(eval_db), "--budget", "0.1", "--k", "10", "--model", "qwen"
    )
    assert "50 rows with u_margin" in out
    assert main(["--db", str(eval_db), "--budget", "0.1", "--k", "10", "--source", "eval"]) == 2
    assert "Only 0 usable rows" in capsys.readouterr().err


def test_write_stores_tau_per_model_and_gate(eval_db, tmp_path, capsys):
    config = tmp_path / "cfg" / "config.toml"
    out = run_cli(
        capsys,
        "--db",
        str(eval_db),
        "--budget",
        "0.2",
        "--write",
        "--config",
        str(config),
    )
    tau = tau_of(out)
    assert f'wrote [tau."smollm2-135m"] margin = {tau!r} to {config}' in out
    assert resolve_tau("margin", None, "smollm2-135m", load_config(config)) == tau
    # The stored value gives the same decisions as the printed one: no rounding on the way.
    assert (
        abs(
            realised_rate(
                eval_db, "margin", resolve_tau("margin", None, "smollm2-135m", load_config(config))
            )
            - 0.2
        )
        <= 0.01 + 1e-9
    )


def test_write_needs_a_model_when_rows_mix_models(eval_db, tmp_path, capsys):
    with DecisionLog(eval_db) as log:
        log.record(eval_answer(0.5, 0.1, model="qwen"), source="eval")
    assert (
        main(
            [
                "--db",
                str(eval_db),
                "--budget",
                "0.2",
                "--write",
                "--config",
                str(tmp_path / "c.toml"),
            ]
        )
        == 2
    )
    assert (
        "several models (qwen, smollm2-135m); pass --model" in capsys.readouterr().err
    )
    out = run_cli(capsys, "--db", str(eval_db), "--budget", "0.2", "--model", "qwen", "--min-rows", "1",
                  "--write", "--config", str(tmp_path / "c.toml"))  # fmt: skip
    assert 'wrote [tau."qwen"] margin' in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--budget", "1.5"],
            "error: --budget must be a retrieval rate in [0, 1]; got 1.5",
        ),
        (
            ["--budget", "0.1", "--since", "last week"],
            "error: --since 'last week' is neither",
        ),
    ],
)
def test_bad_arguments_give_one_line(eval_db, capsys, argv, message):
    assert main(["--db", str(eval_db), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1


def test_missing_db(tmp_path, capsys):
    assert main(["--db", str(tmp_path / "none.db"), "--budget", "0.1"]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: Decision log not found: {tmp_path / 'none.db'}"
    )
    assert not (tmp_path / "none.db").exists()


def test_budget_or_objective_is_required(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--db", "x.db"])
    assert e.value.code == 2


def test_parse_since():
    from datetime import datetime, timedelta, timezone

    now = datetime(2026, 8, 10, tzinfo=timezone.utc)
    assert parse_since("7d", now) == now - timedelta(days=7)
    assert parse_since("12h", now) == now - timedelta(hours=12)
    assert parse_since("2w", now) == now - timedelta(weeks=2)
    assert parse_since("2026-08-01", now) == datetime(2026, 8, 1, tzinfo=timezone.utc)
