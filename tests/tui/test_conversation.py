"""The chat app carries the conversation: follow-ups search a standalone query, the panel shows
it, and the status bar says whether tau was calibrated for the model (real app, model, index)."""

import io
import json
import sys
from pathlib import Path
from dataclasses import replace

import pytest
from rich.console import Console

from targ_mlx.assistant import Assistant, Settings
from targ_mlx.config import Config
from targ_mlx.gates.paper import CALIBRATED_TAU
from targ_mlx.defaults import SMALL_MODEL
from targ_mlx.log.decisions import DecisionLog
from tui.app import make_app
from tui.widgets import ChatLog, DecisionPanel, MessageView, SourcesPanel, StatusBar
from targ_mlx.session import DecisionView as DecisionInfo
from targ_mlx.settings import resolve_tau

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
SIZE = (120, 36)
PAINTING = ("Mona Lisa", "Leonardo da Vinci")
DISTRACTORS = 30  # other real vital-articles leads in the index


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="session")
def art_retriever(tmp_path_factory):
    """A real index over vital-articles leads: the Mona Lisa's, Leonardo's and 30 others."""
    from targ_mlx.index import build_index, open_retriever
    from targ_mlx.index.corpus import read_vital_articles

    rows = []
    for a in read_vital_articles():
        if a.title in PAINTING or len(rows) < DISTRACTORS:
            rows.append({"id": a.id, "title": a.title, "text": a.text})
    assert {r["title"] for r in rows} >= set(PAINTING)
    folder = tmp_path_factory.mktemp("art")
    corpus = folder / "art.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return open_retriever(build_index([str(corpus)], folder / "index"))


@pytest.fixture
def log(tmp_path):
    with DecisionLog(tmp_path / "chat.db") as log:
        yield log


def chat_app(backbone, retriever, log, tmp_path, **settings):
    assistant = Assistant(backbone, retriever, Settings(**{"max_tokens": 8, "k": 4, **settings}), log=log)
    return make_app(assistant, config=Config(db=str(log.path)), config_path=str(tmp_path / "config.toml"),
                    index_label="art")


async def ask(app, pilot, question: str) -> None:
    await pilot.press(*question, "enter")
    await app.workers.wait_for_complete()
    await pilot.pause()


async def test_follow_up_searches_a_standalone_query_and_the_panel_shows_it(backbone, art_retriever, log,
                                                                            tmp_path):
    app = chat_app(backbone, art_retriever, log, tmp_path, gate="always")
    async with app.run_test(size=SIZE) as pilot:
        await ask(app, pilot, "who painted the mona lisa")
        await ask(app, pilot, "when was he born?")
        first, second = app.query_one(ChatLog).answers()
        row = log.get(second.decision_id)
        searched = row["extra"]["search_query"]
        assert "mona lisa" in searched.lower() or "leonardo" in searched.lower()
        assert row["extra"]["history_turns"] == 1 and row["query"] == "when was he born?"
        assert "Leonardo da Vinci" in [p.title for p in app.query_one(SourcesPanel).passages]
        panel = app.query_one(DecisionPanel)
        assert panel.info.searched == searched
        assert f"searched {searched}" in panel_text(panel)
        assert "history 512 tok" in app.query_one(StatusBar).render().plain
        # The first question was searched as asked, so its panel shows no searched line.
        assert "search_query" not in (log.get(first.decision_id).get("extra") or {})
        first.focus()  # selecting an answer shows its decision
        await pilot.pause()
        assert panel.info.decision_id == first.decision_id and "searched" not in panel_text(panel)

    # Reopened from the log (Ctrl+R: the last chat), the answer's panel still shows what was searched.
    again = chat_app(backbone, art_retriever, log, tmp_path)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert again.query_one(DecisionPanel).info.searched == searched


def panel_text(panel: DecisionPanel) -> str:
    """The decision panel as the screen shows it (its Rich table), one line per row."""
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(DecisionPanel.render_info(panel.info))
    return " ".join(console.export_text().split())


def status_for(app) -> str:
    return app.query_one(StatusBar).render().plain


async def test_status_bar_says_whether_tau_is_calibrated(backbone, art_retriever, log, tmp_path):
    cfg = Config()
    assert backbone.model_id == SMALL_MODEL
    tau = resolve_tau("margin", None, SMALL_MODEL, cfg)
    assert tau == CALIBRATED_TAU[SMALL_MODEL]["margin"]
    app = chat_app(backbone, art_retriever, log, tmp_path, gate="margin", tau=tau)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert f"τ {tau:.3f} │" in status_for(app) and "not calibrated" not in status_for(app)

    # The same weights under another model key: no shipped tau, so the placeholder is flagged.
    other = replace(backbone, model_id="/models/my-finetune.gguf")
    placeholder = resolve_tau("margin", None, other.model_id, cfg)
    app = chat_app(other, art_retriever, log, tmp_path, gate="margin", tau=placeholder)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "not calibrated for this model: /recalibrate after 30 answers (0/30)" in status_for(app)
        await pilot.press(*"/tau 0.5", "enter")  # a tau the user chose is not flagged
        await pilot.pause()
        assert "τ 0.500 │" in status_for(app) and "not calibrated" not in status_for(app)


async def test_the_panel_says_why_the_evidence_gate_read_or_not(backbone, art_retriever, log, tmp_path):
    """The decision panel shows the evidence gate's reason, what the search found when it did not
    read, and cites only passages it read; a reloaded row shows the same."""
    app = chat_app(backbone, art_retriever, log, tmp_path, gate="evidence", tau=1e9)  # never reads
    async with app.run_test(size=SIZE) as pilot:
        await ask(app, pilot, "who painted the mona lisa")
        panel = app.query_one(DecisionPanel)
        text = panel_text(panel)
        assert "why weak evidence" in text or "why model sure" in text, text
        assert "answered from memory (searched)" in text and "found Mona Lisa" in text
        assert app.query_one(SourcesPanel).passages == ()  # nothing read, nothing cited
        [answer] = app.query_one(ChatLog).answers()
        again = DecisionInfo.from_row(log.get(answer.decision_id))  # the panel of a reloaded answer
        assert again.reason == panel.info.reason and again.found == panel.info.found


async def test_the_decision_shows_before_the_first_answer_token_and_sources_list_what_was_not_read(
        backbone, art_retriever, log, tmp_path):
    """Driven by the runner's real events: when the first answer text reaches the app, the panel
    already shows the search and the decision (recorded by a handler that runs before the app's
    own, at the moment that message is handled). Not the log's row count: the worker thread may
    finish and log an 8-token answer before the app handles its first text message (CI saw it)."""
    from tui.app import ChatApp

    first: list = []

    class Watched(ChatApp):
        CSS_PATH = Path(sys.modules[ChatApp.__module__].__file__).with_name(ChatApp.CSS_PATH)

        def on_answer_text(self, event) -> None:  # Textual runs this class's handler, then ChatApp's
            if not first:
                panel = self.query_one(DecisionPanel)
                first.append((panel_text(panel), panel.info))

    session = Assistant(backbone, art_retriever, Settings(gate="evidence", tau=1e9, max_tokens=8, k=4), log=log)
    app = Watched(session, config=Config(db=str(log.path)), config_path=str(tmp_path / "config.toml"))
    async with app.run_test(size=SIZE) as pilot:
        await ask(app, pilot, "who painted the mona lisa")
        assert first, "no answer text arrived"
        text, info = first[0]
        assert info.live and info.stage == "decided"  # from the events, not the logged row
        assert "found Mona Lisa" in text and "answering from memory" in text, text
        assert info.u is not None and info.found and not info.retrieved
        sources = app.query_one(SourcesPanel)
        assert sources.passages == () and "Mona Lisa" in [p.title for p in sources.not_read]
        title = str(sources.query_one("#sources-title").render())
        assert "searched, not read" in title and "retrieval skipped" not in title, title
