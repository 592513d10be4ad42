"""`python -m targ_mlx.eval` end to end on a few real NQ-Open questions with the real model and the
small real index: --help, outputs, resume (no question twice), and decision-log rows."""

import json
import subprocess
import sys

import pytest

from targ_mlx.eval.__main__ import main
from tests.conftest import SHARED_DATA

NQ = str(SHARED_DATA / "qa" / "nq_open_dev.jsonl")
TINY = ["--k-max", "5", "--k", "5", "--max-tokens", "6", "--context-tokens", "64", "--batch-size", "2",
        "--latency-sample", "1", "--bootstrap", "20", "--no-plots", "--quiet", "--n-samples", "2"]


def test_help_runs_as_module():
    out = subprocess.run([sys.executable, "-m", "targ_mlx.eval", "--help"], capture_output=True, text=True, check=True)
    assert "--data-file" in out.stdout and "--limit" in out.stdout and "--db" in out.stdout


def test_no_dataset_is_one_line_error(capsys, tmp_path):
    assert main(["--output-dir", str(tmp_path)]) == 2
    assert "--data-file" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_resumes_and_logs_decisions(tmp_path, small_index_dir):
    out, db = tmp_path / "out", tmp_path / "d.db"
    args = ["--data-file", NQ, "--index", str(small_index_dir), "--output-dir", str(out), "--db", str(db), *TINY]
    assert main([*args, "--limit", "2"]) == 0
    first = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(first) == 2
    r = first[0]
    assert set(r["scores"]) == {"entropy", "margin", "variance"} and "5" in r["scores"]["margin"]
    assert {"em", "f1", "acc", "answer"} <= set(r["never"]) and "tok_ctx" in r["always"]
    assert {"p_need", "p_supported", "p_relevant"} == set(r["probes"])
    # rerun the same command: nothing new; then a larger limit adds only the missing questions
    assert main([*args, "--limit", "2"]) == 0
    assert len((out / "records.jsonl").read_text().splitlines()) == 2
    assert main([*args, "--limit", "3"]) == 0
    ids = [json.loads(x)["id"] for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 3
    for name in ("summary.md", "summary.csv", "points.csv", "config.json", "latency.jsonl"):
        assert (out / name).is_file(), name
    text = (out / "summary.md").read_text()
    assert "| Never |" in text and "Margin" in text and "Verdict" in text

    from targ_mlx.calibration_rows import score_rows
    from targ_mlx.decision_log import DecisionLog

    log = DecisionLog(str(db))
    rows = log.rows()
    assert len(rows) == 3  # one per question, none twice
    row = rows[0]
    assert row["source"] == "eval" and row["u_margin"] is not None and row["em_never"] is not None
    assert row["em_always"] is not None and row["k"] == 5
    assert len(score_rows(log, "margin", 5, source="eval")) == 3
