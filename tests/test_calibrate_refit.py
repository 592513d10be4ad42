"""Feedback into a refit: labels on logged answers move the evidence gate's calibration and tau.

The labels go in as a user gives them: over real HTTP to the real server (`POST /v1/feedback`),
and with `targ label` on an answer of `targ ask`; `targ-calibrate refit` then reads them from the
real decision log.
"""

import json

import httpx
import pytest

from targ_mlx.assistant import Assistant, Settings
from targ_mlx.calibrate import main as calibrate
from targ_mlx.config import load_config
from targ_mlx.log.decisions import DecisionLog
from targ_mlx.index import open_retriever
from targ_mlx.server.app import make_app

from tests.test_server import MODEL, Served  # the loopback uvicorn fixture of the server's own tests

pytestmark = pytest.mark.slow
N = 6


def _feedback(url, body):
    return httpx.post(f"{url}/v1/feedback", json=body, timeout=30)


def test_feedback_over_http_refits_the_calibration_and_moves_tau(backbone, small_index_dir, small_index_questions,
                                                                 tmp_path, capsys):
    db = tmp_path / "serve.db"
    with DecisionLog(db) as log:
        assistant = Assistant(backbone, open_retriever(small_index_dir), Settings(gate="evidence", max_tokens=4),
                              log=log, source="ask", session="serve-test")
        with Served(make_app(assistant, MODEL)) as s:
            ids = []
            for q in small_index_questions[:N]:
                r = httpx.post(f"{s.url}/v1/chat/completions", timeout=120,
                               json={"model": MODEL, "messages": [{"role": "user", "content": q["question"]}]})
                assert r.status_code == 200
                ids.append(r.json()["targ"]["decision_id"])
            # bad input: one line, 4xx, nothing written
            for body, status in (({"decision_id": "1", "label": "wrong"}, 400), ({"decision_id": ids[0], "label": "meh"}, 400),
                                 ({"decision_id": 10_000, "label": "wrong"}, 404), ({"label": "wrong"}, 400)):
                r = _feedback(s.url, body)
                assert r.status_code == status and r.json()["error"]["message"], body
            r = httpx.post(f"{s.url}/v1/feedback", content=b"not json", timeout=30)
            assert r.status_code == 400
            assert log._query("SELECT count(*) AS n FROM feedback")[0]["n"] == 0
            for i in ids:  # every answer marked wrong: a read that did not help, a memory answer that was wrong
                r = _feedback(s.url, {"decision_id": i, "label": "wrong"})
                assert r.status_code == 200 and r.json()["label"] == "wrong"
    before = load_config()
    assert before.evidence_calibration(MODEL)[1] == "shipped"
    args = ["refit", "--model", MODEL, "--db", str(db), "--prior", "10"]
    assert calibrate([*args, "--min-labels", str(N + 1)]) == 2
    assert f"{N} labelled decisions" in capsys.readouterr().err
    assert calibrate([*args, "--min-labels", str(N), "--write"]) == 0
    out = capsys.readouterr().out
    assert f"from {N} labelled decisions" in out
    moved = [float(line.split("at most ")[1].split(" points")[0]) for line in out.splitlines() if "moved by" in line]
    assert max(moved) > 0
    tau_line = next(line for line in out.splitlines() if line.strip().startswith("tau "))
    after, unlabelled = float(tau_line.split("-> ")[1].split(",")[0]), float(tau_line.split("tau ")[-1].rstrip(")"))
    assert after != unlabelled  # the labels, not the rows, moved it
    cfg = load_config()
    assert cfg.tau_for(MODEL, "evidence") == pytest.approx(after, abs=1e-6)
    assert cfg.tau_for(MODEL, "evidence") != before.tau_for(MODEL, "evidence")
    assert cfg.evidence_calibration(MODEL)[1].startswith(f"user, 1500 questions, {N} labels, ")


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
