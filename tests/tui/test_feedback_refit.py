"""The chat's F3 labels feed `targ-calibrate refit`: labelled answers move the evidence gate's fit and tau."""

import pytest

from targ_mlx.assistant import Assistant, Settings
from targ_mlx.calibrate import main as calibrate
from targ_mlx.config import Config
from targ_mlx.log.decisions import DecisionLog
from tui.app import make_app
from tui.widgets import StatusBar

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
MODEL = "smollm2-135m"
N = 4


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_f3_labels_in_the_chat_refit_the_calibration_and_move_tau(backbone, small_index_dir,
                                                                        small_index_questions, tmp_path, capsys):
    from targ_mlx.index import open_retriever

    with DecisionLog(tmp_path / "chat.db") as log:
        cfg = Config(db=str(log.path))
        settings = Settings.from_config(cfg, MODEL, gate="evidence", max_tokens=4)  # k, beta as the refit reads them
        app = make_app(Assistant(backbone, open_retriever(small_index_dir), settings, log=log), config=cfg,
                       config_path=str(tmp_path / "config.toml"), index_label="small")
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            assert "gate evidence (shipped)" in app.query_one(StatusBar).render().plain
            for q in small_index_questions[:N]:
                await pilot.press(*q["question"], "enter")
                await app.workers.wait_for_complete()
                await pilot.pause()
                await pilot.press("f3")  # the latest answer: wrong
        labels = log._query("SELECT label FROM feedback")
        assert [r["label"] for r in labels] == ["wrong"] * N
    assert calibrate(["refit", "--model", MODEL, "--db", str(tmp_path / "chat.db"), "--prior", "10",
                      "--min-labels", str(N)]) == 0
    out = capsys.readouterr().out
    assert f"from {N} labelled decisions" in out
    tau_line = next(line for line in out.splitlines() if line.strip().startswith("tau "))
    after, unlabelled = float(tau_line.split("-> ")[1].split(",")[0]), float(tau_line.split("tau ")[-1].rstrip(")"))
    assert after != unlabelled
