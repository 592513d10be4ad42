"""Resumable drivers: records for every question (batched) and batch-1 timings for a sample.

Each finished batch is appended to `records.jsonl` (and each timed question to `latency.jsonl`)
and flushed, so a rerun reads the ids already there and continues; no question is run twice.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

from targ_mlx import pipeline
from targ_mlx.eval.datasets import QAItem
from targ_mlx.eval.latency import time_question
from targ_mlx.eval.record import QuestionRecord, EvalSettings, corpus_free_diff, record_batch, rerecord_batch

logger = logging.getLogger(__name__)

RECORDS = "records.jsonl"
LATENCY = "latency.jsonl"
DEFAULT_BATCH = 8
DEFAULT_LATENCY_SAMPLE = 100


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file; a torn last line (interrupted write) is dropped."""
    if not path.is_file():
        return []
    rows = []
    # JSON lines end at "\n" only: str.splitlines also breaks at U+0085, U+2028 and the like, which
    # json.dumps(ensure_ascii=False) leaves raw inside strings (a TriviaQA question holds U+0085)
    for line in path.read_text(encoding="utf-8").split("\n"):
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("skipping a torn line in %s", path)
    return rows


def append_jsonl(path: Path, rows: Sequence[dict]) -> None:
    with path.open("a", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.flush()


def write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    """Replace the file with `rows` atomically: an interrupted rewrite leaves the old file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)


def _repair(path: Path, rows: list[dict]) -> None:
    """Rewrite the file without a torn tail so appends start on a fresh line."""
    if path.is_file() and not path.read_text(encoding="utf-8").endswith("\n") and path.stat().st_size:
        write_jsonl(path, rows)


def resume_jsonl(path: Path) -> tuple[list[dict], set[str]]:
    """The rows a JSONL file already holds (torn tail repaired) and their ids."""
    have = read_jsonl(path)
    _repair(path, have)
    return have, {r["id"] for r in have}


def in_item_order(path: Path, items: Sequence[QAItem]) -> list[dict]:
    """The rows of `path` in the order of `items`, the file rewritten so when it was not.

    The dev/test split is by position (`sweep.split`), so every run over the same questions must
    list them alike; a run resumed from another `--limit` appended its new questions after the old
    ones. Rows of questions not in `items` (a smaller `--limit` than recorded) keep their place after.
    """
    rows = read_jsonl(path)
    pos = {it.id: i for i, it in enumerate(items)}
    ordered = sorted(rows, key=lambda r: pos.get(r["id"], len(pos)))  # stable: the others keep file order
    if [r["id"] for r in ordered] != [r["id"] for r in rows]:
        write_jsonl(path, ordered)
    return ordered


def run_records(bb, retriever, items: Sequence[QAItem], s: EvalSettings, out_dir: Path, batch_size: int = DEFAULT_BATCH,
                progress: Callable[[int, int], None] | None = None, log=None, log_k: int = 20,
                session: str | None = None, index_id: str | None = None,
                after_batch: Callable[[list[dict]], None] | None = None,
                reuse: dict[str, dict] | None = None) -> list[dict]:
    """Records for `items`, skipping ids already in out_dir/records.jsonl; returns all rows in item order.

    Batches are fixed slices of `items` (by position), so a resumed run forms the same batches
    and the variance samples (seeded per batch) are reproducible. A question with a record in
    `reuse` (the same run over another corpus) only has its corpus-dependent fields computed.
    """
    reuse = reuse or {}
    path = Path(out_dir) / RECORDS
    have, done = resume_jsonl(path)
    total = len(items)
    if progress:
        progress(sum(it.id in done for it in items), total)
    pending = [it for it in items if it.id not in done]
    # one search_batch for every pending question: the encoder is fastest on many short queries
    # (with the draft as a route each batch searches question + draft itself, after its drafts)
    t0 = time.perf_counter()
    routed = s.answer.draft_route > 0
    hits = dict(zip((it.id for it in pending), retriever.search_batch([it.question.strip() for it in pending], pipeline.search_depth(s.answer))
                    if pending and not routed else [[] for _ in pending]))
    search_share = (time.perf_counter() - t0) / max(len(pending), 1)
    for b in range(math.ceil(total / batch_size)):
        chunk = [it for it in items[b * batch_size : (b + 1) * batch_size] if it.id not in done]
        if not chunk:
            continue
        fresh = [it for it in chunk if it.id not in reuse]
        again = [it for it in chunk if it.id in reuse]
        recs = record_batch(bb, retriever, fresh, s, batch_no=b, found=[hits[it.id] for it in fresh]) if fresh else []
        if again:
            rows = rerecord_batch(bb, retriever, again, [reuse[it.id] for it in again], s, [hits[it.id] for it in again])
            recs += [QuestionRecord(**r) for r in rows]
        order = {it.id: i for i, it in enumerate(chunk)}
        recs.sort(key=lambda r: order[r.id])
        for r in recs:
            r.cost["retrieval"] += search_share
        rows = [r.to_dict() for r in recs]
        append_jsonl(path, rows)
        if log is not None:
            for r in recs:
                log_record(log, r, bb.model_id, s, log_k, session, index_id)
        have += rows
        done.update(r["id"] for r in rows)
        if after_batch:
            after_batch(rows)
        if progress:
            progress(sum(it.id in done for it in items), total)
    by_id = {r["id"]: r for r in have}
    return [by_id[it.id] for it in items if it.id in by_id]


def log_record(log, r: QuestionRecord, model: str, s: EvalSettings, k: int, session: str | None,
               index_id: str | None) -> int:
    """One decision-log row per question: the record's own Never answer (`never_answer`) with both
    branches' outcomes, so `targ-calibrate` can fit tau from eval runs."""
    strip = lambda b: {key: v for key, v in b.items() if key != "passages"}  # noqa: E731
    return log.record(r.never_answer(model, k, s), source="eval", session=session, index_id=index_id, gold=list(r.answers),
                      em=r.never["em"], f1=r.never["f1"],
                      branches={"never": strip(r.never), "always": strip(r.always)},
                      extra={"qid": r.id, "probes": r.probes, "scores_all_k": r.scores})


def latency_items(items: Sequence[QAItem], n: int, seed: int) -> list[QAItem]:
    if n <= 0:
        return []
    idx = sorted(random.Random(seed + 1).sample(range(len(items)), min(n, len(items))))
    return [items[i] for i in idx]


def run_latency(bb, retriever, items: Sequence[QAItem], never_answers: dict[str, str], s: EvalSettings,
                out_dir: Path, progress: Callable[[int, int], None] | None = None) -> dict[str, dict]:
    """Batch-1 stage timings for `items` (resumable, like run_records); returns id -> timings."""
    path = Path(out_dir) / LATENCY
    have, done = resume_jsonl(path)
    for i, it in enumerate(items):
        if it.id in done:
            continue
        row = asdict(time_question(bb, retriever, it, never_answers.get(it.id, ""), s))
        append_jsonl(path, [row])
        have.append(row)
        done.add(it.id)
        if progress:
            progress(i + 1, len(items))
    return {r["id"]: r for r in have}


def corpus_free_source(root: Path, name: str, ours: dict) -> tuple[Path, dict[str, dict], list[str]]:
    """The same run over another corpus, in `root`'s `name`/ folder or `root` itself: that folder,
    its records by question id (none where it holds no records.jsonl), and `corpus_free_diff` of
    its config against `ours` (a config's `model` and `settings`): empty where they can serve it."""
    src = root / name if (root / name / "records.jsonl").is_file() else root
    if not (src / "records.jsonl").is_file():
        return src, {}, []
    cfg = src / "config.json"
    diff = corpus_free_diff(json.loads(cfg.read_text(encoding="utf-8")) if cfg.is_file() else {}, ours)
    return src, {r["id"]: r for r in read_jsonl(src / "records.jsonl")}, diff
