"""QA datasets: JSON Lines files (`{"question", "answers": [...]}`) or Hugging Face `datasets`
names when online, normalised to `QAItem`s; a seeded sample of `limit` items.

Nothing here scores or runs a model.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from targ_mlx.defaults import PAPER_MAX_TOKENS

DATASETS = ("nq_open", "triviaqa", "popqa", "musique", "asqa")
DEFAULT_LIMIT = 500
# Generation caps per dataset (the paper: 50 tokens for multi-hop MuSiQue, 32 otherwise).
MAX_TOKENS = {"musique": 50}


@dataclass(frozen=True)
class QAItem:
    id: str
    question: str
    answers: tuple[str, ...]  # every accepted alias
    meta: dict = field(default_factory=dict, compare=False)


def read_jsonl(path: str | Path) -> list[QAItem]:
    """Rows `{"question", "answers": [...]}` (optional "id", "meta"); ids default to the line number."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    items = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            if "question" not in row or "answers" not in row:
                raise ValueError(f"{path}:{n + 1}: each line needs \"question\" and \"answers\"; got keys {sorted(row)}")
            answers = row["answers"] if isinstance(row["answers"], list) else [row["answers"]]
            items.append(QAItem(str(row.get("id", n)), row["question"], tuple(str(a) for a in answers), row.get("meta", {})))
    return items


def load_hf(name: str) -> list[QAItem]:
    """The evaluation split of a dataset by name, from the Hugging Face hub (needs a network)."""
    if name not in DATASETS:
        raise ValueError(f"dataset {name!r} unknown; choose one of {', '.join(DATASETS)} or pass --data-file")
    try:
        from datasets import load_dataset
    except ImportError as e:
        raise ImportError("loading datasets by name needs `pip install datasets` (or pass --data-file PATH.jsonl)") from e
    if name == "nq_open":
        rows = load_dataset("google-research-datasets/nq_open", split="validation")
        return [QAItem(str(i), r["question"], tuple(r["answer"])) for i, r in enumerate(rows)]
    if name == "triviaqa":
        rows = load_dataset("mandarjoshi/trivia_qa", "rc.nocontext", split="validation")
        return [QAItem(r["question_id"], r["question"], tuple(r["answer"]["aliases"])) for r in rows]
    if name == "popqa":
        rows = load_dataset("akariasai/PopQA", split="test")
        return [QAItem(str(r["id"]), r["question"], tuple(json.loads(r["possible_answers"]))) for r in rows]
    if name == "musique":
        rows = load_dataset("dgslibisey/MuSiQue", split="validation")
        return [QAItem(r["id"], r["question"], tuple([r["answer"], *r.get("answer_aliases", [])])) for r in rows]
    rows = load_dataset("din0s/asqa", split="dev")  # asqa: gold short answers of every interpretation
    return [QAItem(r["sample_id"], r["ambiguous_question"],
                   tuple(a for qa in r["qa_pairs"] for a in qa["short_answers"])) for r in rows]


def sample(items: list[QAItem], limit: int | None, seed: int, pool: int | None = None) -> list[QAItem]:
    """A seeded sample of `limit` items in their original order (all items when limit is None).

    With `pool`, the sample of `pool` items comes first, exactly as `sample(items, pool, seed)` gives
    it, then `limit - pool` more drawn from the items outside it (in their order): a cell recorded
    at `--limit pool` keeps its questions and their positions, which its dev/test split is drawn over.
    """
    if pool is not None:
        if pool < 1 or (limit is not None and pool >= limit):
            raise ValueError(f"--split-pool {pool} must be at least 1 and below --limit {limit}; fix: give the "
                             "--limit the cell was first recorded at as --split-pool, and a larger --limit")
        first = sample(items, pool, seed)
        ids = {it.id for it in first}
        rest = [it for it in items if it.id not in ids]
        return first + sample(rest, None if limit is None else limit - pool, seed)
    if limit is None or limit >= len(items):
        return list(items)
    if limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit}")
    keep = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in keep]


def dataset_name(data_file: str | None, dataset: str | None) -> str:
    """Short name for outputs: the dataset name, or the data file's stem (nq_open_dev -> nq_open_dev)."""
    return dataset if dataset else Path(data_file).stem


def max_tokens_for(name: str) -> int:
    return next((v for k, v in MAX_TOKENS.items() if name.startswith(k)), PAPER_MAX_TOKENS)
