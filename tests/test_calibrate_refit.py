"""Feedback into a refit: labels on logged answers move the evidence gate's calibration and tau.

The labels go in as a user gives them: over real HTTP to the real server (`POST /v1/feedback`),
and with `targ label` on an answer of `targ ask`; `targ-calibrate refit` then reads them from the
real decision log.
"""

import json
from dataclasses import replace

import httpx
import numpy as np
import pytest

from targ_mlx.assistant import Assistant, Settings
from targ_mlx.calibration.cli import main as calibrate
from targ_mlx.config import load_config
from targ_mlx.calibration.refit import logged_rows, u_evi
from targ_mlx.log.decisions import DecisionLog
from targ_mlx.index import open_retriever
from targ_mlx.server.app import make_app
from targ_mlx.settings import resolve_tau

from tests.test_server import MODEL, Served  # the loopback uvicorn fixture of the server's own tests

pytestmark = pytest.mark.slow
N = 6
OTHER, N_OTHER = "qwen2.5-coder-1.5b", 4  # a second model's key in the same log, and its labelled decisions


def _feedback(url, body):
    return httpx.post(f"{url}/v1/feedback", json=body, timeout=30)


def u_shift(db, model: str, before: dict, after: dict) -> np.ndarray:
    """Per labelled decision of `model` in `db`: its U_evi under the calibration `after` minus under
    `before` (> 0: the refitted gate rates reading likelier to help there)."""
    s = Settings.from_config(load_config(), model)  # k and beta as the refit reads them
    with DecisionLog(db) as log:
        rows = [r for r in logged_rows(log, model, s.k, s.beta) if r.label is not None]
    assert rows
    return u_evi(after, rows) - u_evi(before, rows)


def helps(read: bool) -> str:
    """The label saying reading would have helped: a read answer was right, a memory answer wrong."""
    return "correct" if read else "wrong"


def hurts(read: bool) -> str:
    """The opposite: reading did not help (a read answer wrong), memory was enough (a memory answer right)."""
    return "wrong" if read else "correct"


def _tau_line(out: str) -> tuple[float, float]:
    """(tau after the refit, tau of the old calibration on the same rows) from the refit's report."""
    line = next(line for line in out.splitlines() if line.strip().startswith("tau "))
    return float(line.split("-> ")[1].split(",")[0]), float(line.split("tau ")[-1].rstrip(")"))


def test_feedback_over_http_refits_the_labelled_models_calibration_in_the_labels_direction(
        backbone, small_index_dir, small_index_questions, tmp_path, capsys):
    """Labels saying reading would have helped raise U_evi on the labelled questions, the opposite
    labels lower it, and labels logged for one model reach that model's fit only."""
    db = tmp_path / "serve.db"
    # the same small model logged under the 1.5B's key too, so the log holds two models' decisions
    # without loading the 1.5B
    other = replace(backbone, model_id=OTHER)
    with DecisionLog(db) as log:
        retriever = open_retriever(small_index_dir)
        assistant = Assistant(backbone, retriever, Settings(gate="evidence", max_tokens=4),
                              log=log, source="ask", session="serve-test")
        with Served(make_app(assistant, MODEL)) as s:
            read = {}
            for q in small_index_questions[:N]:
                r = httpx.post(f"{s.url}/v1/chat/completions", timeout=120,
                               json={"model": MODEL, "messages": [{"role": "user", "content": q["question"]}]})
                assert r.status_code == 200
                read[r.json()["targ"]["decision_id"]] = r.json()["targ"]["decision"]["read"]
            assert set(read.values()) == {True, False}  # both branches labelled: both kinds of fit move
            ids = list(read)
            # bad input: one line, 4xx, nothing written
            for body, status in (({"decision_id": "1", "label": "wrong"}, 400), ({"decision_id": ids[0], "label": "meh"}, 400),
                                 ({"decision_id": 10_000, "label": "wrong"}, 404), ({"label": "wrong"}, 400)):
                r = _feedback(s.url, body)
                assert r.status_code == status and r.json()["error"]["message"], body
            r = httpx.post(f"{s.url}/v1/feedback", content=b"not json", timeout=30)
            assert r.status_code == 400
            assert log._query("SELECT count(*) AS n FROM feedback")[0]["n"] == 0
            for i, was_read in read.items():
                r = _feedback(s.url, {"decision_id": i, "label": helps(was_read)})
                assert r.status_code == 200 and r.json()["label"] == helps(was_read)
        theirs = Assistant(other, retriever, Settings(gate="evidence", max_tokens=4), log=log, source="ask")
        for q in small_index_questions[N:N + N_OTHER]:
            ans = theirs.answer(q["question"])
            log.feedback(log._query("SELECT max(id) AS id FROM decisions")[0]["id"], hurts(ans.retrieved))
    before = load_config()
    mine, shipped_other = before.evidence_calibration(MODEL), before.evidence_calibration(OTHER)
    assert mine[1] == "shipped" and shipped_other[1] == "shipped"
    args = ["refit", "--model", MODEL, "--db", str(db), "--prior", "10"]
    assert calibrate([*args, "--min-labels", str(N + 1)]) == 2  # the other model's labels are not this one's
    assert f"{N} labelled decisions of {MODEL}" in capsys.readouterr().err
    assert calibrate([*args, "--min-labels", str(N), "--write"]) == 0
    out = capsys.readouterr().out
    assert f"from {N} labelled decisions" in out
    after, unlabelled = _tau_line(out)
    assert after != unlabelled  # the labels, not the rows, moved it
    cfg = load_config()
    assert resolve_tau("evidence", None, MODEL, cfg) == pytest.approx(after, abs=1e-6) != resolve_tau("evidence", None, MODEL, before)
    assert cfg.evidence_calibration(MODEL)[1].startswith(f"user, 1500 questions, {N} labels, ")
    shift = u_shift(db, MODEL, mine[0], cfg.evidence_calibration(MODEL)[0])
    assert shift.min() >= -1e-9 and shift.max() > 0.01, shift  # reading would have helped: U_evi up
    # the other model's tau and calibration are untouched by this model's labels
    assert resolve_tau("evidence", None, OTHER, cfg) == resolve_tau("evidence", None, OTHER, before)
    assert cfg.evidence_calibration(OTHER) == shipped_other
    # its own, opposite labels move its fit the other way and leave this model's alone
    assert calibrate(["refit", "--model", OTHER, "--db", str(db), "--prior", "10", "--min-labels", str(N_OTHER),
                      "--write"]) == 0
    assert f"from {N_OTHER} labelled decisions" in capsys.readouterr().out
    cfg2 = load_config()
    shift = u_shift(db, OTHER, shipped_other[0], cfg2.evidence_calibration(OTHER)[0])
    assert shift.max() <= 1e-9 and shift.min() < -0.01, shift  # reading did not help: U_evi down
    assert resolve_tau("evidence", None, MODEL, cfg2) == resolve_tau("evidence", None, MODEL, cfg)
    assert cfg2.evidence_calibration(MODEL) == cfg.evidence_calibration(MODEL)


def test_targ_label_labels_an_answer_of_targ_ask(small_index_dir, small_index_questions, tmp_path, capsys):
    from targ_mlx.cli import main as targ

    db = tmp_path / "ask.db"
    q = small_index_questions[0]["question"]
    assert targ(["ask", q, "--json", "--db", str(db), "--index", str(small_index_dir), "--max-tokens", "4"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["calibration"] == "shipped" and isinstance(record["decision"], int)
    assert targ(["label", str(record["decision"]), "correct", "--db", str(db)]) == 0
    assert targ(["label", "999", "correct", "--db", str(db)]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    with DecisionLog(db) as log:
        assert log._query("SELECT label FROM feedback")[0]["label"] == "correct"
