"""The chat's F2 / F3 labels feed `targ-calibrate refit`: labelled answers move the evidence gate's fit
in the labels' direction, and tau with it."""

import pytest

from targ_mlx.assistant import Assistant, Settings
from targ_mlx.calibration.cli import main as calibrate
from targ_mlx.config import Config, load_config
from targ_mlx.log.decisions import DecisionLog
from targ_mlx.settings import resolve_tau
from tests.test_calibrate_refit import OTHER, hurts, u_shift
from tui.app import make_app
from tui.widgets import StatusBar

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
MODEL = "smollm2-135m"
N = 6  # answers labelled: enough that both branches (read, from memory) are among them


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_f2_f3_labels_in_the_chat_refit_the_calibration_in_their_direction(backbone, small_index_dir,
                                                                                small_index_questions, tmp_path, capsys):
    """Labels saying reading did not help (F3 on a read answer, F2 on one from memory) lower U_evi
    on the labelled questions under the written calibration (test_calibrate_refit.py checks the
    opposite labels over HTTP); the other model's tau and calibration stay as shipped."""
    from targ_mlx.index import open_retriever

    config_path = tmp_path / "config.toml"
    with DecisionLog(tmp_path / "chat.db") as log:
        cfg = Config(db=str(log.path))
        settings = Settings.from_config(cfg, MODEL, gate="evidence", max_tokens=4)  # k, beta as the refit reads them
        app = make_app(Assistant(backbone, open_retriever(small_index_dir), settings, log=log), config=cfg,
                       config_path=str(config_path), index_label="small")
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.pause()
            assert "gate evidence (shipped)" in app.query_one(StatusBar).render().plain
            for q in small_index_questions[:N]:
                await pilot.press(*q["question"], "enter")
                await app.workers.wait_for_complete()
                await pilot.pause()
                read = bool(log._query("SELECT retrieved FROM decisions ORDER BY id DESC LIMIT 1")[0]["retrieved"])
                await pilot.press("f3" if read else "f2")  # the latest answer: reading did not help
        labels = log._query("SELECT d.retrieved, f.label FROM feedback f JOIN decisions d ON d.id = f.decision_id")
        assert len(labels) == N and all(r["label"] == hurts(bool(r["retrieved"])) for r in labels)
        assert {r["retrieved"] for r in labels} == {0, 1}  # both branches labelled: both kinds of fit move
    before = load_config()
    shipped, shipped_other = before.evidence_calibration(MODEL), before.evidence_calibration(OTHER)
    assert calibrate(["refit", "--model", MODEL, "--db", str(tmp_path / "chat.db"), "--prior", "10",
                      "--min-labels", str(N), "--write"]) == 0
    out = capsys.readouterr().out
    assert f"from {N} labelled decisions" in out
    tau_line = next(line for line in out.splitlines() if line.strip().startswith("tau "))
    after, unlabelled = float(tau_line.split("-> ")[1].split(",")[0]), float(tau_line.split("tau ")[-1].rstrip(")"))
    assert after != unlabelled
    cfg = load_config()
    shift = u_shift(tmp_path / "chat.db", MODEL, shipped[0], cfg.evidence_calibration(MODEL)[0])
    assert shift.max() <= 1e-9 and shift.min() < -0.01, shift  # reading did not help: U_evi down
    assert resolve_tau("evidence", None, OTHER, cfg) == resolve_tau("evidence", None, OTHER, before)
    assert cfg.evidence_calibration(OTHER) == shipped_other
