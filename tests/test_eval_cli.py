"""`python -m targ_mlx.eval` end to end on a few real NQ-Open questions with the real model and the
small real index: --help, outputs, resume (no question twice), and decision-log rows."""

import json
import subprocess
import sys

import pytest

from targ_mlx.eval.__main__ import main
from tests.conftest import SHARED_DATA, build_stopped_after_first_commit

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
    first_ids = [x["id"] for x in first]
    r = first[0]
    assert set(r["scores"]) == {"entropy", "margin", "variance", "evidence"} and "5" in r["scores"]["margin"]
    assert set(r["scores"]["evidence"]) == set(r["scores"]["margin"])  # the search-first gate, at every k
    assert {"em", "f1", "acc", "answer"} <= set(r["never"]) and "tok_ctx" in r["always"]
    assert {"p_need", "p_supported", "p_relevant"} == set(r["probes"])
    # rerun the same command: nothing new; then a larger limit adds only the missing questions
    assert main([*args, "--limit", "2"]) == 0
    assert len((out / "records.jsonl").read_text().splitlines()) == 2
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["run"]["records_new"] == 2  # a rerun that recorded nothing keeps the run that did
    assert cfg["run"]["kernels"] and "huge_pages_bytes" in cfg["run"]  # what the throughput ran on
    assert main([*args, "--limit", "3"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert [r["records_new"] for r in cfg["runs"]] == [2, 1]  # every run's throughput, the first included
    ids = [json.loads(x)["id"] for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 3
    # the dev/test split is by position, so the resumed file lists the questions in the sample's
    # order (its new question sorts between the first two), and the report reads them so
    from targ_mlx.eval.datasets import read_jsonl as read_items
    from targ_mlx.eval.datasets import sample

    assert ids == [it.id for it in sample(read_items(NQ), 3, 0)] != [*first_ids, *set(ids) - set(first_ids)]
    lines = (out / "records.jsonl").read_text().splitlines()
    summary = (out / "summary.csv").read_text()
    (out / "records.jsonl").write_text("\n".join(lines[::-1]) + "\n")
    assert main([*args, "--limit", "3", "--report-only"]) == 0
    assert (out / "records.jsonl").read_text().splitlines() == lines and (out / "summary.csv").read_text() == summary
    for name in ("summary.md", "summary.csv", "points.csv", "config.json", "latency.jsonl"):
        assert (out / name).is_file(), name
    text = (out / "summary.md").read_text()
    assert "| Never |" in text and "Margin" in text and "Verdict" in text

    from targ_mlx.calibration.rows import score_rows
    from targ_mlx.log.decisions import DecisionLog

    log = DecisionLog(str(db))
    rows = log.rows()
    assert len(rows) == 3  # one per question, none twice
    row = rows[0]
    assert row["source"] == "eval" and row["u_margin"] is not None and row["em_never"] is not None
    assert row["em_always"] is not None and row["k"] == 5
    assert len(score_rows(log, "margin", 5, source="eval")) == 3


@pytest.mark.slow
def test_second_corpus_reuses_the_corpus_free_fields(tmp_path, small_index_dir, capsys):
    """--reuse-records computes only retrieval, the Always answer and CRAG's grade; over the same
    index it must reproduce the first pass's records exactly, and it refuses other settings."""
    a, b = tmp_path / "a", tmp_path / "b"
    common = ["--data-file", NQ, "--index", str(small_index_dir), "--limit", "3", *TINY]
    assert main([*common, "--output-dir", str(a)]) == 0
    assert main([*common, "--output-dir", str(b), "--reuse-records", str(a)]) == 0
    first = {r["id"]: r for r in map(json.loads, (a / "records.jsonl").read_text().splitlines())}
    second = {r["id"]: r for r in map(json.loads, (b / "records.jsonl").read_text().splitlines())}
    assert first.keys() == second.keys()
    for q, r in first.items():
        s = second[q]
        assert s["cost"]["draft"] == r["cost"]["draft"]  # the draft was not run again (its seconds are reused)
        assert s["always"] == r["always"] and s["probes"] == r["probes"]
        assert s["always"]["hit"] in (0.0, 1.0)
        assert {k: s[k] for k in ("draft", "samples", "never", "scores")} == {k: r[k] for k in ("draft", "samples", "never", "scores")}
    cfg = json.loads((b / "config.json").read_text())
    assert cfg["corpus_regime"] in ("clean", "seeded") and cfg["corpora"]
    # records made before hit@K existed get it from a search; a smaller --limit keeps the other rows
    rows = [json.loads(x) for x in (b / "records.jsonl").read_text().splitlines()]
    for r in rows:
        del r["always"]["hit"]
    (b / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([*common, "--limit", "2", "--output-dir", str(b)]) == 0
    after = {r["id"]: r for r in map(json.loads, (b / "records.jsonl").read_text().splitlines())}
    assert after.keys() == second.keys()  # the question outside --limit 2 is still there
    from targ_mlx.eval.datasets import read_jsonl as read_items
    from targ_mlx.eval.datasets import sample

    inside = {it.id for it in sample(read_items(NQ), 2, 0)}
    assert len(inside) == 2 and inside < after.keys()
    assert [q for q, r in after.items() if "hit" in r["always"]] == [q for q in after if q in inside]
    assert all(after[q]["always"]["hit"] == second[q]["always"]["hit"] for q in inside)
    # settings that change the corpus-free fields are refused with the fix
    assert main([*common, "--output-dir", str(tmp_path / "c"), "--reuse-records", str(a), "--max-tokens", "7"]) == 2
    err = capsys.readouterr().err
    assert "max_tokens" in err and "fix" in err


@pytest.mark.slow
def test_an_extended_cell_keeps_its_records_and_dev_half_and_judges_the_added_questions_as_test(tmp_path, small_index_dir,
                                                                                                capsys):
    out = tmp_path / "out"
    args = ["--data-file", NQ, "--index", str(small_index_dir), "--output-dir", str(out), *TINY, "--latency-sample", "0"]
    assert main([*args, "--limit", "4"]) == 0
    before = (out / "records.jsonl").read_text().splitlines()
    assert main([*args, "--limit", "6", "--split-pool", "4"]) == 0
    after = (out / "records.jsonl").read_text().splitlines()
    assert after[:4] == before and len(after) == 6  # the recorded questions untouched, in place; 2 added
    assert json.loads((out / "config.json").read_text())["args"]["split_pool"] == 4
    text = (out / "summary.md").read_text()
    assert "the first 4 split into dev and test halves; the 2 added after them" in text
    assert "dev n = 2, test n = 4" in text  # the dev half of the 4; their test half and both added questions
    # a rerun without the flag keeps the extended order; another pool is refused with the fix
    assert main([*args, "--limit", "6", "--report-only"]) == 0
    assert (out / "records.jsonl").read_text().splitlines() == after and "dev n = 2, test n = 4" in (out / "summary.md").read_text()
    assert main([*args, "--limit", "6", "--split-pool", "3"]) == 2
    err = capsys.readouterr().err
    assert "--split-pool 3" in err and "pass --split-pool 4" in err


@pytest.mark.slow
def test_a_resumed_run_records_with_the_cells_model_not_the_default(tmp_path, small_index_dir, capsys, monkeypatch):
    """Extending a cell with the apps' default model (the 1.5B where installed) instead of the one
    that recorded it would mix two models' records in one cell: the recorded model is kept."""
    out = tmp_path / "out"
    args = ["--data-file", NQ, "--index", str(small_index_dir), "--output-dir", str(out), *TINY, "--latency-sample", "0"]
    assert main([*args, "--limit", "2"]) == 0  # conftest: the default model is SmolLM2
    monkeypatch.setenv("TARG_MLX_MODEL", "qwen2.5-coder-1.5b")  # now the default is another model
    assert main([*args, "--limit", "3"]) == 0
    assert json.loads((out / "config.json").read_text())["model"] == "smollm2-135m"
    drafts = [json.loads(x)["draft"] for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(drafts) == 3 and max(t for d in drafts for t in d) < 49152  # SmolLM2's vocabulary, all three
    assert main([*args, "--limit", "4", "--model", "qwen2.5-coder-1.5b"]) == 2  # refused before loading it
    err = capsys.readouterr().err
    assert "holds records of smollm2-135m" in err and "pass --model smollm2-135m" in err
    assert len((out / "records.jsonl").read_text().splitlines()) == 3


@pytest.mark.slow
def test_eval_searches_as_told_records_both_scores_and_a_resumed_run_keeps_its_mode(tmp_path, small_index_dir):
    out = tmp_path / "out"
    args = ["--data-file", NQ, "--index", str(small_index_dir), "--output-dir", str(out), *TINY, "--latency-sample", "0"]
    assert main([*args, "--limit", "1"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["retriever"] == "dense"
    first = json.loads((out / "records.jsonl").read_text().splitlines()[0])
    assert all(len(p) == 3 for p in first["always"]["passages"])  # [key, title, cosine]: no BM25 score
    fresh = tmp_path / "fresh"
    assert main([*args[:5], str(fresh), *args[6:], "--limit", "1", "--retriever", "hybrid"]) == 0
    cfg = json.loads((fresh / "config.json").read_text())
    assert cfg["retriever"] == "hybrid" and "1 record; the tables need at least 2" in (fresh / "summary.md").read_text()
    rec = json.loads((fresh / "records.jsonl").read_text().splitlines()[0])
    # [key, title, cosine, bm25] for every passage read, whichever ranking found it
    assert rec["always"]["passages"] and all(len(p) == 4 and p[3] >= 0 for p in rec["always"]["passages"])
    # no --retriever: the run whose records are there was hybrid, so the added question is too
    assert main([*args[:5], str(fresh), *args[6:], "--limit", "2"]) == 0
    assert json.loads((fresh / "config.json").read_text())["retriever"] == "hybrid"
    assert "searched by hybrid" in (fresh / "summary.md").read_text()
    assert all(len(p) == 4 for line in (fresh / "records.jsonl").read_text().splitlines()
               for p in json.loads(line)["always"]["passages"])


@pytest.mark.slow
def test_eval_resumes_an_interrupted_default_index_build(tmp_path, monkeypatch, notes_folder):
    """The default index's build was stopped part-way (its DIR.partial holds the resume point):
    the eval finishes that build and runs, instead of asking for a command the user never ran."""
    from targ_mlx.index.store import partial_dir

    folder, rows = notes_folder
    default = tmp_path / "default-index"
    monkeypatch.setenv("TARG_MLX_INDEX", str(default))

    build_stopped_after_first_commit([str(folder)], default)
    assert partial_dir(default).is_dir() and not default.exists()
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": r["question"], "answers": r["answers"]}) + "\n"
                            for i, r in enumerate(rows[:2])), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["--data-file", str(data), "--output-dir", str(out), "--limit", "2", "--no-baselines", *TINY]) == 0
    assert (default / "manifest.json").is_file() and not partial_dir(default).exists()
    assert json.loads((out / "config.json").read_text())["index"] == str(default)
    assert len((out / "records.jsonl").read_text().splitlines()) == 2
