"""`/index get`: the chat builds a bigger index in the background, then searches it beside the open
one (the real app via Pilot, the real SmolLM2, real passages, real builds)."""

import json
from pathlib import Path

import pytest

from targ_mlx.assistant import Assistant, Settings
from targ_mlx.config import Config
from targ_mlx.defaults import BIGGER_INDEX_CHAT_HINT, BIGGER_INDEX_OFFER
from targ_mlx.index import named
from targ_mlx.log.decisions import DecisionLog
from tui.app import make_app
from tui.widgets import ChatLog, DecisionPanel, MessageView, SourcesPanel, StatusBar

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
SIZE = (120, 36)
WIKI_POOL = Path(__file__).resolve().parents[3] / "shared" / "data" / "corpus" / "wiki_pool.jsonl"
ARTICLE = "Thomas John Barnardo"  # among the pool's first lines (KILT pages), not in the small index


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def log(tmp_path):
    with DecisionLog(tmp_path / "chat.db") as log:
        yield log


@pytest.fixture
def corpus(tmp_path, monkeypatch) -> Path:
    """The short articles among the pool's first 60 lines (real KILT pages) as a JSONL; `/index get`
    builds into tmp_path/indexes."""
    monkeypatch.setenv(named.ENV_INDEXES, str(tmp_path / "indexes"))
    rows = []
    with open(WIKI_POOL, encoding="utf-8") as f:
        for _, line in zip(range(60), f):
            row = json.loads(line)
            if len(row["text"]) < 6000:
                rows.append({"id": row["id"], "title": row["title"], "text": row["text"]})
    assert ARTICLE in [r["title"] for r in rows]
    path = tmp_path / "kilt_head.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def chat_app(backbone, small_index_dir, log, tmp_path, **settings):
    from targ_mlx.index import open_indexes

    settings = {"max_tokens": 8, "k": 4, **settings}
    session = Assistant(backbone, open_indexes([small_index_dir]), Settings(**settings), log=log)
    return make_app(session, config=Config(db=str(log.path)), config_path=str(tmp_path / "config.toml"),
                    index_label="small")


def system_lines(app) -> list[MessageView]:
    return [v for v in app.query_one(ChatLog).query(MessageView) if v.role == "system"]


async def run_and_wait(app, pilot, line: str) -> None:
    await pilot.press(*line, "enter")
    await app.workers.wait_for_complete()  # the build's worker, or the answer's
    await pilot.pause()  # let their messages land


async def test_index_get_builds_in_the_background_then_questions_search_both(backbone, small_index_dir, log,
                                                                             tmp_path, corpus):
    app = chat_app(backbone, small_index_dir, log, tmp_path, gate="always")
    async with app.run_test(size=SIZE) as pilot:
        await run_and_wait(app, pilot, f"/index get {corpus}")
        built = tmp_path / "indexes" / "kilt_head"
        line = system_lines(app)[-1]
        notes = [n.message for n in app._notifications]
        assert (built / "manifest.json").is_file(), (line.text, notes)
        assert line.text.startswith("kilt_head is ready") and "small + kilt_head together" in line.text, line.text
        # the progress line it showed stays under it: a local file is counted, so percent and ETA
        assert line.note.startswith("building kilt_head (BM25 only, in the background): ") and "(100%)" in line.note
        opened = app.assistant.index
        assert opened.paths == (small_index_dir, built) and opened.mode == "hybrid"  # both folders, fused by rank
        assert "small + kilt_head" in app.query_one(StatusBar).render().plain

        await run_and_wait(app, pilot, f"Who was {ARTICLE}?")
        titles = [p.title for p in app.query_one(SourcesPanel).passages]
        assert ARTICLE in titles, titles
        answer = list(app.query_one(ChatLog).query(MessageView))[-1]
        assert ARTICLE in [p["title"] for p in log.get(answer.decision_id)["passages"]]


async def test_index_get_again_resumes_a_stopped_build(backbone, small_index_dir, log, tmp_path, corpus):
    t = named.target(str(corpus))

    def stop_after_first_commit(done, total):
        if done:
            raise named.BuildStopped

    with pytest.raises(named.BuildStopped):  # as the app stops it on quit: after a commit
        named.get_index(t, stop_after_first_commit, commit_every=4)
    assert not t.out.exists() and t.out.with_name("kilt_head.partial").is_dir()
    app = chat_app(backbone, small_index_dir, log, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await run_and_wait(app, pilot, f"/index get {corpus}")
        line = system_lines(app)[-1]
        assert line.text.startswith("kilt_head is ready"), (line.text, [n.message for n in app._notifications])
        assert "; resumed at chunk 4" in line.note and "(100%)" in line.note, line.note
        assert app.assistant.index.paths == (small_index_dir, t.out)


async def test_index_get_simplewiki_offline_is_one_line(backbone, small_index_dir, log, tmp_path, monkeypatch):
    """No network (the Hub forced offline here): one line
    naming the problem and the fix, and the chat keeps its index."""
    monkeypatch.setenv(named.ENV_INDEXES, str(tmp_path / "indexes"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    app = chat_app(backbone, small_index_dir, log, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await run_and_wait(app, pilot, "/index get simplewiki")
        said = [n.message for n in app._notifications if "/index get simplewiki downloads" in n.message]
        assert len(said) == 1 and "\n" not in said[0], [n.message for n in app._notifications]
        assert ("it needs a network (its parquet files stream from the Hugging Face Hub); or give a local file: "
                "/index get PATH") in said[0]
        assert app.assistant.index.paths == (small_index_dir,)


async def test_no_good_source_offers_index_get_until_it_is_open(backbone, small_index_dir, log, tmp_path, corpus):
    """The evidence gate, never reading (tau 1), on a question the small index has nothing on."""
    app = chat_app(backbone, small_index_dir, log, tmp_path, gate="evidence", tau=1.0)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(2):
            await run_and_wait(app, pilot, "What is the capital of the planet Zorblax?")
        panel = app.query_one(DecisionPanel)
        assert panel.info.no_source, panel.info
        assert [v.text for v in system_lines(app)] == [BIGGER_INDEX_OFFER]  # offered once, not per answer
        assert "/index get simplewiki" in BIGGER_INDEX_OFFER and panel.hint == BIGGER_INDEX_CHAT_HINT
        # Once the folder `/index get simplewiki` builds is searched (here made offline from a local
        # file of that name), the panel offers nothing more.
        local = corpus.rename(corpus.with_name("simplewiki.jsonl"))
        await run_and_wait(app, pilot, f"/index get {local}")
        assert app.assistant.index.paths[-1] == named.target_folder("simplewiki")
        assert panel.hint == ""
