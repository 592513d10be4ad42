"""scripts/analysis/rescore_records.py brings records made before a signal existed up to what the record
pass computes now, from the index and the tokenizer alone."""

import importlib.util
import json
from pathlib import Path

import pytest

from targ_mlx.eval.datasets import QAItem
from targ_mlx.eval.record import EvalSettings, eval_answer, record_batch
from targ_mlx.eval.run import read_jsonl, write_jsonl
from targ_mlx.index import open_retriever

_spec = importlib.util.spec_from_file_location(
    "rescore_records", Path(__file__).parents[1] / "scripts" / "analysis" / "rescore_records.py")
rescore = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rescore)


def test_rescoring_old_records_gives_what_the_record_pass_computes(backbone, small_index_dir, small_index_questions,
                                                                   tmp_path):
    s = EvalSettings(eval_answer(max_tokens=12), k_max=8, ks=(4, 8), baselines=False)
    items = [QAItem(q["id"], q["question"], tuple(q["answers"])) for q in small_index_questions[:5]]
    recs = [r.to_dict() for r in record_batch(backbone, open_retriever(small_index_dir), items, s)]
    # some drafts are confirmed at one k and not the other: a wrong k, text or question would show
    assert {r["always"]["confirms"]["4"] for r in recs} == {0, 1} and {r["always"]["confirms"]["8"] for r in recs} == {0, 1}
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": "smollm2-135m", "settings": s.to_dict()}), encoding="utf-8")
    old = json.loads(json.dumps(recs))
    for r in old:  # as records made before the signals existed: no confirms or support, the evidence score stale
        del r["always"]["confirms"], r["always"]["support"]
        r["scores"]["evidence"] = {k: -1.0 for k in r["scores"]["evidence"]}
    write_jsonl(run / "records.jsonl", old)
    assert rescore.main([str(run), "--model", "smollm2-135m", "--index", str(small_index_dir)]) == 0
    new = read_jsonl(run / "records.jsonl")
    assert [r["always"]["confirms"] for r in new] == [r["always"]["confirms"] for r in recs]
    assert [r["always"]["support"] for r in new] == [r["always"]["support"] for r in recs]
    for r, ref in zip(new, recs):
        assert r["scores"]["evidence"] == pytest.approx(ref["scores"]["evidence"], abs=1e-4)  # s_1 kept to 4 decimals


def test_rescoring_against_another_index_names_the_fix(backbone, small_index_dir, small_index_questions, tmp_path):
    s = EvalSettings(eval_answer(max_tokens=12), k_max=8, ks=(8,), baselines=False)
    q = small_index_questions[0]
    [rec] = record_batch(backbone, open_retriever(small_index_dir), [QAItem(q["id"], q["question"], tuple(q["answers"]))], s)
    row = rec.to_dict()
    row["always"]["passages"][0][0] = 12345  # a key this index does not hold
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": "smollm2-135m", "settings": s.to_dict()}), encoding="utf-8")
    write_jsonl(run / "records.jsonl", [row])
    with pytest.raises(SystemExit, match="pass the --index the records were made with"):
        rescore.main([str(run), "--model", "smollm2-135m", "--index", str(small_index_dir)])
    assert read_jsonl(run / "records.jsonl")[0] == row  # nothing written
