"""`targ-calibrate fit`: the evidence gate fitted to a model from one command, end to end.

SmolLM2 is treated as a new model (its shipped fit hidden by TARG_MLX_HIDE_CALIBRATION): the
command fits it from the dev halves of five committed eval cells, and the fit must make the shipped
fit's read/skip decisions on at least 95% of the held-out test half of every committed SmolLM2
cell, while the same fit from shuffled outcomes must not. A second test records a few questions with the real model over a small real index, so the
recording path, the config it writes and `targ ask --json`'s label are exercised too.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from targ_mlx.calibration.cli import main
from targ_mlx.config import default_config_path, load_config
from targ_mlx.eval.record import record_signals
from targ_mlx.calibration.evidence import METRIC, read_cell
from targ_mlx.eval.run import read_jsonl, write_jsonl
from targ_mlx.gates import GateParams, get
from targ_mlx.gates.evidence import HIDE_ENV, calibrations
from targ_mlx.settings import resolve_tau

ROOT = Path(__file__).resolve().parents[1]
SMOL = ROOT / "results" / "smollm2-135m"
DEV_CELL = SMOL / "clean" / "nq_open"  # 250 dev questions: near the command's default of 300
CELLS = [SMOL / corpus / name for corpus in ("clean", "seeded") for name in ("nq_open", "popqa", "triviaqa")]


def _decisions(records: list[dict], cal: dict, tau: float) -> list[bool]:
    """The gate's own read/skip decision per record under calibration `cal` (k=20, beta=3)."""
    gate, p = get("evidence"), GateParams(20, 3.0, cal)
    out = []
    for r in records:
        out.append(gate.decide(record_signals(r, "smollm2-135m", 20), tau, p).retrieve)
    return out


FIT_FROM = [c for c in CELLS if c != DEV_CELL]  # five cells' dev halves, 1,250 questions; clean/nq_open left out


def _agreement(cal: dict, tau: float) -> dict[str, float]:
    """Per committed cell: the share of its held-out test half on which `cal` decides as the shipped fit."""
    shipped = calibrations()["smollm2-135m"]
    out = {}
    for cell in CELLS:
        recs, _, test = read_cell(cell)
        held_out = [recs[i] for i in test]
        ours, theirs = _decisions(held_out, cal, tau), _decisions(held_out, shipped, shipped["tau"])
        out[f"{cell.parent.name}/{cell.name}"] = sum(a == b for a, b in zip(ours, theirs)) / len(held_out)
    return out


def _fit_from_cli(folders: list[Path], capsys) -> tuple[dict, float]:
    assert main(["fit", "--model", "smollm2-135m", "--records", *map(str, folders)]) == 0
    assert f"{250 * len(folders)} questions" in capsys.readouterr().out
    cfg = load_config()
    cal, label = cfg.evidence_calibration("smollm2-135m")
    assert label.startswith(f"user, {250 * len(folders)} questions, ")
    tau = resolve_tau("evidence", None, "smollm2-135m", cfg)
    assert tau == cal["tau"]
    return dict(cal), tau


def _shuffled_cells(root: Path, seed: int = 0) -> list[Path]:
    """FIT_FROM with each record's outcomes (Always right, Never right) moved to another record of
    its cell: the signals stay, what they predicted is gone."""
    rng = np.random.default_rng(seed)
    out = []
    for cell in FIT_FROM:
        recs = read_jsonl(cell / "records.jsonl")
        perm = rng.permutation(len(recs))
        moved = [{**r, "always": {**r["always"], METRIC: recs[j]["always"][METRIC]},
                  "never": {**r["never"], METRIC: recs[j]["never"][METRIC]}} for r, j in zip(recs, perm)]
        dest = root / cell.parent.name / cell.name
        dest.mkdir(parents=True)
        write_jsonl(dest / "records.jsonl", moved)
        shutil.copy(cell / "config.json", dest / "config.json")  # the same dev/test split
        out.append(dest)
    return out


def test_fit_from_dev_halves_reproduces_the_shipped_decisions_and_shuffled_labels_do_not(monkeypatch, tmp_path,
                                                                                          capsys):
    """The fit from 1,250 dev questions (five of the six committed cells) decides as the shipped fit on
    at least 95% of every cell's held-out test half, the left-out cell's included (measured
    2026-11-29 after the clean cells and seeded TriviaQA were re-recorded: 0.977-0.997). Its control:
    the same command on the same records with each cell's outcomes shuffled must miss 95% on some cell
    (measured: 0.900 at worst; seeds 1 and 2 give 0.947 and 0.899), so the bar is not met by a fit that ignores its labels. Agreement is a weak measure:
    most cells still agree >= 0.94 under shuffled labels, and the pooled default with no fit agrees
    0.969-0.985 (before the re-record). Left out in turn, the other five cells gave 0.917-0.971 at worst (issue 57's
    closing note): the 95% bar holds with clean/nq_open left out, not with every cell left out."""
    monkeypatch.setenv(HIDE_ENV, "smollm2-135m")
    assert load_config().evidence_calibration("smollm2-135m")[1] == "default (pooled)"
    agree = _agreement(*_fit_from_cli(FIT_FROM, capsys))
    assert min(agree.values()) >= 0.95, agree
    default_config_path().unlink()
    control = _agreement(*_fit_from_cli(_shuffled_cells(tmp_path / "shuffled"), capsys))
    assert min(control.values()) < 0.95, control


def test_too_few_questions_and_another_models_records_are_refused_in_one_line(tmp_path, capsys):
    assert main(["fit", "--model", "smollm2-135m", "--records", str(DEV_CELL), "--min-questions", "300"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "at least 300" in err
    assert main(["fit", "--model", "qwen2.5-coder-1.5b", "--records", str(DEV_CELL)]) == 2
    assert "fix: --model smollm2-135m" in capsys.readouterr().err
    assert not default_config_path().exists()  # nothing written on a refusal


def _qa_file(path: Path, questions: list[dict], n: int) -> Path:
    path.write_text("".join(json.dumps({"id": q["id"], "question": q["question"], "answers": q["answers"]}) + "\n"
                            for q in questions[:n]), encoding="utf-8")
    return path


@pytest.mark.slow
def test_fit_records_with_the_model_resumes_and_targ_ask_says_user(tmp_path, monkeypatch, capsys, small_index_dir,
                                                                    small_index_questions):
    from targ_mlx.cli import main as targ

    monkeypatch.setenv(HIDE_ENV, "smollm2-135m")
    data = _qa_file(tmp_path / "qa.jsonl", small_index_questions, 6)
    run = tmp_path / "run"
    args = ["fit", "--model", "smollm2-135m", "--data-file", str(data), "--index", str(small_index_dir),
            "--output-dir", str(run), "--quiet", "--batch-size", "3"]
    # the refusal names the minimum, before any model loads
    assert main([*args, "--limit", "6"]) == 2
    assert "at least 100" in capsys.readouterr().err
    assert main([*args, "--limit", "3", "--min-questions", "3"]) == 0
    assert len((run / "records.jsonl").read_text().splitlines()) == 3
    assert main([*args, "--limit", "6", "--min-questions", "6"]) == 0  # continues: 3 more recorded
    rows = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
    assert len(rows) == len({r["id"] for r in rows}) == 6
    out = capsys.readouterr().out
    assert "on 6 questions" in out and "before: default (pooled)" in out
    cfg = load_config()
    assert cfg.evidence_by_model["smollm2-135m"]["n"] == 6
    assert "read_support" in cfg.evidence_by_model["smollm2-135m"]  # the records hold the support
    q = small_index_questions[20]["question"]
    assert targ(["ask", q, "--json", "--no-log", "--index", str(small_index_dir)]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["gate"] == "evidence"
    assert record["calibration"].startswith("user, 6 questions, ")
    assert record["tau"] == pytest.approx(cfg.evidence_by_model["smollm2-135m"]["tau"])


@pytest.mark.slow
def test_a_model_that_cannot_load_is_one_line(tmp_path, capsys, small_index_dir, small_index_questions):
    data = _qa_file(tmp_path / "qa.jsonl", small_index_questions, 3)
    assert main(["fit", "--model", str(tmp_path / "missing.gguf"), "--data-file", str(data), "--index",
                 str(small_index_dir), "--min-questions", "3", "--quiet", "--output-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot load model") and "\n" not in err
