"""The variance gate over sampling seeds (`python -m targ_mlx.eval.seeds`): the run's own seed
re-draws exactly the recorded samples (same batches, same RNG), another seed draws new ones, and
each seed's row judges that seed's U_var (synthetic records with known answers)."""

import json

import numpy as np
import pytest

from targ_mlx.eval import seeds
from targ_mlx.eval.__main__ import main as eval_main
from targ_mlx.eval.run import read_jsonl
from tests.test_eval_cli import NQ, TINY
from tests.test_eval_controls import outcomes, records_for


def test_each_seed_row_judges_that_seeds_variance_scores():
    never, always = outcomes(n=600, seed=3)
    recs = records_for(np.random.default_rng(1).random(600), never, always)
    coin = {r["id"]: {"20": float(u)} for r, u in zip(recs, np.random.default_rng(4).random(600))}
    helps = always > never
    oracle = {r["id"]: {"20": float(h) + 0.01 * i / 600} for i, (r, h) in enumerate(zip(recs, helps))}
    metric, rows = seeds.seed_rows(recs, {0: coin, 7: oracle}, k=20, run_seed=0, n_boot=200)
    assert metric == "acc" and [r.seed for r in rows] == [0, 7]
    coin_row, oracle_row = rows
    assert oracle_row.helps[0] == pytest.approx(1.0)  # U_var of seed 7 ranks every helped question first
    assert 0.4 < coin_row.helps[0] < 0.6
    assert oracle_row.verdict.answers()["random"] == "yes" and coin_row.verdict.answers()["random"] != "yes"
    text = seeds.render("synthetic", metric, rows, 20, 600, changed=1.0)
    assert "| 7 |" in text and "mean ± sd" in text


@pytest.mark.slow
def test_run_seed_redraws_the_recorded_samples_and_another_seed_new_ones(tmp_path, small_index_dir, backbone):
    out = tmp_path / "run"
    assert eval_main(["--data-file", NQ, "--index", str(small_index_dir), "--limit", "3", "--output-dir", str(out),
                      *TINY]) == 0
    records = read_jsonl(out / "records.jsonl")
    settings = json.loads((out / "config.json").read_text())["settings"]
    assert [b for b, _ in seeds.recorded_batches(records)] == [0, 1]  # batch size 2: two batches as recorded

    again = [row for rows in seeds.resample(backbone, records, settings, seed=0) for row in rows]
    assert [(a["id"], a["samples"], a["variance"]) for a in again] == \
           [(r["id"], r["samples"], r["scores"]["variance"]) for r in records]

    assert seeds.main([str(out), "--seeds", "0", "1", "--bootstrap", "20", "--quiet"]) == 0
    drawn = read_jsonl(out / seeds.SEEDS_FILE)
    assert {r["seed"] for r in drawn} == {1} and len(drawn) == 3  # the run's own seed is not drawn again
    assert any(d["samples"] != r["samples"] for d, r in zip(drawn, records))
    report = (out / seeds.REPORT).read_text()
    assert "| 0 |" in report and "| 1 |" in report
    # a rerun draws nothing new (resume by question and seed)
    assert seeds.main([str(out), "--seeds", "1", "--bootstrap", "20", "--quiet"]) == 0
    assert len(read_jsonl(out / seeds.SEEDS_FILE)) == 3


def test_folder_without_records_is_one_line_error(tmp_path, capsys):
    assert seeds.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "fix" in err
