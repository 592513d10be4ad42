"""The eval's JSONL files: an interrupted write is repaired on resume, and the records are read in
the sample's order whatever order a resumed run appended them in (the dev/test split is by position)."""

import json

import pytest

from targ_mlx.eval.datasets import QAItem
from targ_mlx.eval.run import append_jsonl, in_item_order, read_jsonl, resume_jsonl


def _items(*ids):
    return [QAItem(id=i, question=f"q {i}", answers=("a",)) for i in ids]


def test_a_torn_last_line_is_dropped_and_the_next_append_starts_clean(tmp_path):
    path = tmp_path / "records.jsonl"
    append_jsonl(path, [{"id": "a"}, {"id": "b"}])
    with path.open("a") as f:
        f.write('{"id": "c", "nev')  # the process died mid-write
    have, done = resume_jsonl(path)
    assert done == {"a", "b"}
    append_jsonl(path, [{"id": "c"}])
    assert [r["id"] for r in read_jsonl(path)] == ["a", "b", "c"]


def test_records_are_read_and_rewritten_in_the_samples_order(tmp_path):
    path = tmp_path / "records.jsonl"
    # a run with a smaller --limit recorded q1 and q3; the resumed run appended q2 after them
    append_jsonl(path, [{"id": "q1", "x": 1}, {"id": "q3", "x": 3}, {"id": "q2", "x": 2}])
    rows = in_item_order(path, _items("q1", "q2", "q3"))
    assert [r["id"] for r in rows] == ["q1", "q2", "q3"]
    assert [json.loads(x)["id"] for x in path.read_text().splitlines()] == ["q1", "q2", "q3"]
    assert {r["id"]: r["x"] for r in rows} == {"q1": 1, "q2": 2, "q3": 3}  # nothing lost or changed


def test_records_outside_the_sample_are_kept_after_it(tmp_path):
    path = tmp_path / "records.jsonl"
    append_jsonl(path, [{"id": "z"}, {"id": "q2"}, {"id": "y"}, {"id": "q1"}])
    rows = in_item_order(path, _items("q1", "q2"))  # a report with a smaller --limit than recorded
    assert [r["id"] for r in rows] == ["q1", "q2", "z", "y"]
    assert len(read_jsonl(path)) == 4


def test_an_ordered_file_is_not_rewritten(tmp_path):
    path = tmp_path / "records.jsonl"
    append_jsonl(path, [{"id": "q1"}, {"id": "q2"}])
    before = path.stat().st_mtime_ns
    in_item_order(path, _items("q1", "q2"))
    assert path.stat().st_mtime_ns == before and not (tmp_path / "records.jsonl.tmp").exists()


def test_an_extended_sample_keeps_the_first_sample_in_place_and_adds_only_new_questions():
    from targ_mlx.eval.datasets import sample

    items = _items(*(f"q{i}" for i in range(40)))
    first = sample(items, 10, 0)
    grown = sample(items, 25, 0, pool=10)
    assert grown[:10] == first  # the recorded cell's questions, in their positions
    assert len(grown) == 25 and len({it.id for it in grown}) == 25  # 15 new, none twice
    assert grown == sample(items, 25, 0, pool=10)  # seeded: a resumed run draws the same
    assert sample(items, None, 0, pool=10)[:10] == first and len(sample(items, None, 0, pool=10)) == 40
    with pytest.raises(ValueError, match="--split-pool 10 .* below --limit 10"):
        sample(items, 10, 0, pool=10)


def test_an_extended_split_keeps_the_dev_half_and_puts_every_added_question_in_test():
    from targ_mlx.eval.sweep import split

    dev0, test0 = split(500, 0)
    dev, test = split(1000, 0, pool=500)
    assert list(dev) == list(dev0)  # the budgets and calibrations were chosen on these
    assert list(test) == [*test0, *range(500, 1000)]
    assert list(split(500, 0, pool=500)[1]) == list(test0) and list(split(1000, 0)[0]) != list(dev0)


def test_a_row_holding_unicode_line_breaks_is_one_row(tmp_path):
    """A TriviaQA question holds U+0085, which JSON writes raw and str.splitlines breaks at:
    the record was read as two torn lines and dropped (a report of 999 of 1,000 questions)."""
    path = tmp_path / "records.jsonl"
    append_jsonl(path, [{"id": "q1", "question": "a\x85b"}, {"id": "q2", "question": "c\u2028d\u2029e"}, {"id": "q3"}])
    rows, done = resume_jsonl(path)
    assert [r["id"] for r in rows] == ["q1", "q2", "q3"] and done == {"q1", "q2", "q3"}
    assert rows[0]["question"] == "a\x85b"
    assert [r["id"] for r in in_item_order(path, _items("q3", "q2", "q1"))] == ["q3", "q2", "q1"]
    assert len(read_jsonl(path)) == 3  # the rewritten file too
