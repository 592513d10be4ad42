"""results/README.md's headline table is what its cells' files say: each row regenerated from the
cell folder's overview.md and summary.md (scripts/analysis/headline_rows.py) equals the row shown,
so a re-recorded or re-reported cell cannot leave a stale figure in the headline."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"SmolLM2": "smollm2-135m", "Qwen 1.5B": "qwen2.5-coder-1.5b"}
# a row's corpus label -> the cell folder ("large" is the hybrid index's cells)
CORPORA = {"seeded": "seeded", "clean": "clean", "large": "large-hybrid", "large, BM25-only index": "large"}
DATASETS = {"NQ-Open": "nq_open", "PopQA": "popqa", "TriviaQA": "triviaqa"}


def _headline_rows() -> list[str]:
    text = (ROOT / "results" / "README.md").read_text(encoding="utf-8")
    table = text.split("## Headline", 1)[1].split("\n\n")
    body = next(block for block in table if block.startswith("| model · corpus · dataset"))
    return body.splitlines()[2:]


def test_every_headline_row_is_regenerated_from_its_cell_files():
    spec = importlib.util.spec_from_file_location("headline_rows", ROOT / "scripts" / "analysis" / "headline_rows.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = _headline_rows()
    assert len(rows) >= 18
    for row in rows:
        label = row.split(" | ")[0].lstrip("| ")
        model, corpus, dataset = label.split(" · ")
        folder = ROOT / "results" / MODELS[model] / CORPORA[corpus]
        assert mod.headline(label, folder, DATASETS[dataset]) == row, label
