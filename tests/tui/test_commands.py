"""Slash-command parsing, completion, budget refusal and Markdown export (no app, no model)."""

import pytest

from targ_mlx.calibration.thresholds import budget_threshold
from targ_mlx.calibration.rows import DEFAULT_BUDGET, NotEnoughRowsError, ScoreRow, budget_tau, fit_tau
from tui import commands
from tui.commands import Command, CommandError


@pytest.mark.parametrize("text, expected", [
    ("/gate Margin", Command("gate", "margin")),
    ("/tau 0.42", Command("tau", 0.42)),
    ("  /budget 0.3 ", Command("budget", 0.3)),
    ("/k 8", Command("k", 8)),
    ("/recalibrate", Command("recalibrate", None)),
    ("/recalibrate 0.2", Command("recalibrate", 0.2)),
    ("/model smollm2-135m", Command("model", "smollm2-135m")),
    ("/index /tmp/my index", Command("index", "/tmp/my index")),
    ("/index get simplewiki", Command("index", "get simplewiki")),
    ("/index GET /tmp/my corpus.jsonl", Command("index", "get /tmp/my corpus.jsonl")),
    ("/export", Command("export", None)),
    ("/help", Command("help", None)),
    ("/set read Each", Command("set", ("read", "each"))),
    ("/set --top-k 3", Command("set", ("top_k", 3))),
    ("/set depth_ratio 0.9", Command("set", ("depth_ratio", 0.9))),
    ("/set rerank off", Command("set", ("rerank", ""))),
    ("/set", Command("set", None)),
])
def test_parse(text, expected):
    assert commands.parse(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("/gate sometimes", "one of entropy"),
    ("/tau high", "expected a number"),
    ("/tau nan", "finite"),
    ("/budget 1.5", "[0, 1]"),
    ("/k 0", ">= 1"),
    ("/k two", "whole number"),
    ("/model", "missing SPEC"),
    ("/index get", "/index get simplewiki"),
    ("/frobnicate", "/help"),
    ("/set frob 1", "no such setting; one of gate, tau, k"),
    ("/set top_k three", "expected a whole number"),
    ("/set read nope", "one of passages, distinct, each, sentences"),
    ("/set beta inf", "finite"),
])
def test_parse_errors_say_what_to_type(text, fragment):
    with pytest.raises(CommandError, match=None) as e:
        commands.parse(text)
    assert fragment in str(e.value)


def test_complete():
    assert commands.complete("/ga") == ["/gate"]
    assert commands.complete("/set read e") == ["/set read each"]
    assert "/set each" in commands.complete("/set e")
    assert commands.complete("/gate m") == ["/gate margin"]
    assert set(commands.complete("/gate ")) == {f"/gate {g}" for g in commands.GATES}
    assert commands.common_prefix(commands.complete("/re")) == "/recalibrate"
    assert commands.complete("hello") == []
    assert "/budget RHO" in commands.hint("/bu")
    assert commands.complete("/index g") == ["/index get"]
    assert commands.complete("/index get s") == ["/index get simplewiki"]


def test_help_lists_index_get():
    assert "get simplewiki" in commands.help_text() and "/index [add] DIR | get NAME" in commands.help_text()


@pytest.mark.parametrize("done, total, first, elapsed, expected", [
    (5_000, 20_000, 0, 10.0, "5,000/20,000 chunks (25%), ETA 30 s, 500 chunks/s"),
    (20_000, 20_000, 0, 10.0, "20,000/20,000 chunks (100%), 2,000 chunks/s"),
    (6_000, 20_000, 1_000, 10.0, "6,000/20,000 chunks (30%), ETA 28 s, 500 chunks/s; resumed at chunk 1,000"),
    (5_000, 0, 0, 10.0, "5,000 chunks so far (no total in advance for a stream or a compressed file), 500 chunks/s"),
    (0, 0, 0, 0.0, "0 chunks so far (no total in advance for a stream or a compressed file)"),
])
def test_build_progress_says_percent_eta_and_where_a_resumed_build_began(done, total, first, elapsed, expected):
    assert commands.build_progress("simplewiki", done, total, first, elapsed) == (
        "building simplewiki (BM25 only, in the background): " + expected)


def test_duration():
    assert [commands.duration(s) for s in (0.4, 59, 60, 3599, 3600, 7500)] == [
        "0 s", "59 s", "1 min 0 s", "59 min 59 s", "1 h 0 min", "2 h 5 min"]


def test_no_source_hint_names_the_chat_command():
    import io

    from rich.console import Console

    from targ_mlx.session import DecisionView
    from tui.widgets import DecisionPanel

    view = DecisionView(gate="evidence", k=20, tau=0.3, u=0.6, reason="weak evidence (best 0.31) → answered from "
                        "memory", no_source=True, tokens={"prompt": 1, "draft": 1, "context": 0, "output": 1})
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(DecisionPanel.render_info(view))
    shown = " ".join(console.export_text().split())
    assert "no good source found" in shown and "type /index get simplewiki" in shown


def _rows(us, labels=None):
    labels = labels or [None] * len(us)
    return [ScoreRow(i, "chat", "m", "margin", u, u > 0.5, None, None, None, None, lab)
            for i, (u, lab) in enumerate(zip(us, labels))]


def test_budget_refuses_below_min_rows_and_matches_calibration():
    with pytest.raises(NotEnoughRowsError, match="only 29 logged answers"):
        budget_tau([0.1] * 29, 0.3)
    us = [i / 40 for i in range(40)]
    assert budget_tau(us, 0.25) == budget_threshold(us, 0.25)


def test_fit_tau_prefers_labels_then_budget():
    us = [i / 40 for i in range(40)]
    tau, how = fit_tau(_rows(us))
    assert tau == budget_threshold(us, DEFAULT_BUDGET) and how.startswith("budget")
    tau, how = fit_tau(_rows(us, ["correct"] * 40))
    assert how.startswith("accuracy on 40 labelled rows")


def test_export_markdown():
    row = {"gate": "margin", "u": 0.5, "tau": 0.35, "retrieved": 1, "lat_total": 1.5,
           "passages": [{"key": 1, "title": "Paris", "score": 0.81}]}
    md = commands.export_markdown("chat", [("user", "capital of France?", None), ("assistant", "Paris", row)])
    assert "**You:** capital of France?" in md
    assert "> margin U=0.500 tau=0.350: retrieved" in md
    assert "> [1] Paris (0.810)" in md


def test_the_chat_entry_point_loads_no_mlx_before_binding_blas():
    """`targ-chat` binds OpenBLAS into MLX before the app imports mlx.core; importing its package
    and entry module must not load MLX first (it did, through the app: reference BLAS in the app)."""
    import subprocess
    import sys

    code = "import sys, tui, tui.__main__; print('mlx.core' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
