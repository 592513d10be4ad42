"""scripts/analysis/reading_depth.py scores each rule at the depth it reads, from records at that
depth, and refuses a depth it has no records for instead of scoring depth 5 in its place."""

import importlib.util
import json
from pathlib import Path

from targ_mlx.eval.run import write_jsonl

_spec = importlib.util.spec_from_file_location(
    "reading_depth", Path(__file__).parents[1] / "scripts" / "analysis" / "reading_depth.py")
reading_depth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reading_depth)

# Per question: the similarity of each of its 5 passages in the ranking's order. Every ratio of the
# script's keeps 1 or 2 of them, except ratio 0.5 on the last question: 3 (0.40 >= 0.5 x 0.80).
SCORES = [[0.80, 0.20, 0.10, 0.10, 0.10]] * 3 + [[0.80, 0.79, 0.10, 0.10, 0.10]] * 2 + [[0.80, 0.70, 0.40, 0.10, 0.10]]


def _cell(folder: Path, depth: int, scores: list[list[float]]) -> Path:
    """A recorded cell of len(scores) questions whose Always branch read `depth` passages: right at
    depth 1, wrong at every other, so a depth scored in another's place shows in the accuracy."""
    folder.mkdir(parents=True)
    config = {"args": {"split_pool": None}, "settings": {"top_k": depth}}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    write_jsonl(folder / "records.jsonl", [
        {"id": f"q{i}", "always": {"passages": [[k, f"T{k}", s] for k, s in enumerate(row[:depth])],
                                   "acc": int(depth == 1), "tok_ctx": 100 * depth, "confirms": {"20": 0}}}
        for i, row in enumerate(scores)])
    return folder


def test_a_rule_reading_a_depth_never_recorded_is_refused_in_one_line(tmp_path, capsys):
    base = _cell(tmp_path / "d5", 5, SCORES)
    others = [_cell(tmp_path / f"d{d}", d, SCORES) for d in (1, 2)]
    assert reading_depth.main([str(base), *map(str, others)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "no records at depth 3 (ratio 0.5 reads 3 passages for q5)" in err and "--top-k 3" in err, err
    # with that depth recorded too, each rule is scored from the records of the depth it reads
    others.append(_cell(tmp_path / "d3", 3, SCORES))
    assert reading_depth.main([str(base), *map(str, others)]) == 0
    by, ids, _ = reading_depth.load(base, others)
    acc, tokens, depth = reading_depth.evaluate("ratio", 0.5, by, ids, "acc")
    assert list(depth) == [1, 1, 1, 2, 2, 3] and list(tokens) == [100, 100, 100, 200, 200, 300]
    assert list(acc) == [1, 1, 1, 0, 0, 0]


def test_a_ratio_whose_passages_are_not_the_first_of_the_ranking_is_refused(tmp_path, capsys):
    """On a ranking not sorted by similarity (BM25, hybrid), --depth-ratio reads passages that no
    depth's records (the first D of the ranking) read."""
    scores = [[0.50, 0.80, 0.10, 0.10, 0.10]] * 4
    base = _cell(tmp_path / "d5", 5, scores)
    others = [_cell(tmp_path / f"d{d}", d, scores) for d in (1, 2, 3, 4)]
    assert reading_depth.main([str(base), *map(str, others)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--depth-ratio 0.7 reads passages [1] of q0's ranking" in err, err
