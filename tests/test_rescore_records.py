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


def test_a_record_packed_again_is_what_it_read_and_another_budget_is_refused(backbone, small_index_dir,
                                                                             small_index_questions):
    """`recorded_context`: the recorded keys packed again give the text the Always branch read (its
    text, read-hit, token count and the selection's support over it); at a budget that cuts them otherwise it says so instead of
    re-reading a context the run never read."""
    from targ_mlx import pipeline
    from targ_mlx.eval.record import recorded_context
    from targ_mlx.matching import contains

    s = EvalSettings(eval_answer(max_tokens=12), k_max=8, ks=(8,), baselines=False)
    items = [QAItem(q["id"], q["question"], tuple(q["answers"])) for q in small_index_questions[:4]]
    retriever = open_retriever(small_index_dir)
    lookup = lambda key: retriever.passages([key]).get(key)  # noqa: E731
    for rec in (r.to_dict() for r in record_batch(backbone, retriever, items, s)):
        packed = recorded_context(rec, lookup, backbone.tokenizer, s.answer.context_tokens)
        assert packed.reading.tokens == rec["always"]["tok_ctx"]
        assert contains(packed.reading.text, rec["answers"]) == rec["always"]["read_hit"]
        assert round(pipeline.support_of(rec["question"].strip(), packed), 4) == rec["always"]["support"]
        q = rec["question"].strip()  # and the very text the record pass packed from its search
        assert packed.text == pipeline.pack_found(backbone, q, retriever.search(q, pipeline.search_depth(s.answer)),
                                                  s.answer).text
        with pytest.raises(ValueError, match="do not pack to the recorded ones at 64 tokens"):
            recorded_context(rec, lookup, backbone.tokenizer, 64)


def _run(folder: Path, s: EvalSettings, records: list[dict]) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model": "smollm2-135m", "settings": s.to_dict()}), encoding="utf-8")
    write_jsonl(folder / "records.jsonl", records)
    return folder


def test_a_cell_takes_a_rerecorded_draft_and_keeps_its_own_reading(backbone, small_index_dir, small_index_questions,
                                                                   tmp_path):
    """--reuse-records: a cell over one corpus follows the same run re-recorded over another (new
    kernels, new drafts) without its own index: the draft, Never answer and draft scores come from
    there, the Always answer stays the cell's, and confirmation and the evidence score follow the
    new draft, as a re-record would compute them."""
    s = EvalSettings(eval_answer(max_tokens=12), k_max=8, ks=(4, 8), baselines=False)
    items = [QAItem(q["id"], q["question"], tuple(q["answers"])) for q in small_index_questions[:5]]
    recs = [r.to_dict() for r in record_batch(backbone, open_retriever(small_index_dir), items, s)]
    assert {r["always"]["confirms"]["8"] for r in recs} == {0, 1}
    stale = json.loads(json.dumps(recs))
    for r, other in zip(stale, recs[1:] + recs[:1]):  # an older kernel's drafts and Never answers
        for key in ("draft", "entropies", "gaps", "never"):
            r[key] = other[key]
        r["scores"] = other["scores"]
    base = json.loads(json.dumps(recs))
    for r in base:  # the re-record over the other corpus read something else
        r["always"] = {**r["always"], "answer": "read elsewhere", "passages": []}
    cell = _run(tmp_path / "cell", s, stale)
    _run(tmp_path / "base", s, base)
    assert rescore.main([str(cell), "--model", "smollm2-135m", "--index", str(small_index_dir),
                         "--reuse-records", str(tmp_path / "base")]) == 0
    new = read_jsonl(cell / "records.jsonl")
    assert [r["draft"] for r in new] == [r["draft"] for r in recs]
    assert [r["never"] for r in new] == [r["never"] for r in recs]
    assert [r["always"]["answer"] for r in new] == [r["always"]["answer"] for r in recs]
    assert [r["always"]["confirms"] for r in new] == [r["always"]["confirms"] for r in recs]
    for r, ref in zip(new, recs):
        assert r["scores"]["margin"] == ref["scores"]["margin"]
        assert r["scores"]["evidence"] == pytest.approx(ref["scores"]["evidence"], abs=1e-4)
    assert json.loads((cell / "config.json").read_text())["corpus_free_from"] == str(tmp_path / "base")


def test_drafts_of_other_settings_are_refused(backbone, small_index_dir, small_index_questions, tmp_path):
    s = EvalSettings(eval_answer(max_tokens=12), k_max=8, ks=(8,), baselines=False)
    q = small_index_questions[0]
    [rec] = record_batch(backbone, open_retriever(small_index_dir), [QAItem(q["id"], q["question"], tuple(q["answers"]))], s)
    cell = _run(tmp_path / "cell", s, [rec.to_dict()])
    _run(tmp_path / "base", EvalSettings(eval_answer(max_tokens=24), k_max=8, ks=(8,), baselines=False), [rec.to_dict()])
    with pytest.raises(SystemExit, match="max_tokens=24"):
        rescore.main([str(cell), "--model", "smollm2-135m", "--index", str(small_index_dir),
                      "--reuse-records", str(tmp_path / "base")])
    assert read_jsonl(cell / "records.jsonl") == [rec.to_dict()]
