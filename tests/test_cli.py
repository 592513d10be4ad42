"""`python -m targ_mlx ask` in-process on the real model, plus help, errors and import hygiene."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from targ_mlx.cli import main
from targ_mlx.settings import resolve_tau
from tests.conftest import build_stopped_after_first_commit


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["ask", "--help"])
    assert e.value.code == 0
    assert "--gate" in capsys.readouterr().out


def test_ask_json_and_log(tmp_path, capsys, backbone):
    db = tmp_path / "log.db"
    rc = main(["ask", "Who wrote Hamlet?", "--gate", "margin", "--tau", "1.0", "--k", "6", "--max-tokens", "10",
               "--db", str(db), "--json"])
    assert rc == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["gate"] == "margin" and rec["retrieved"] is False and rec["k"] == 6
    assert rec["tokens"]["draft"] <= 6 and rec["answer"]
    from targ_mlx.log.decisions import DecisionLog

    rows = DecisionLog(str(db)).rows()
    assert len(rows) == 1 and rows[0]["source"] == "ask" and rows[0]["query"] == "Who wrote Hamlet?"


def test_ask_json_carries_what_the_evidence_gate_looked_at_and_why(tmp_path, capsys, backbone, small_index_dir,
                                                                    small_index_questions):
    """The default gate: the search's passages with their similarities, the score, the threshold
    shipped for the model and the reason, in --json and on the log's row."""
    q = small_index_questions[0]["question"]
    db = tmp_path / "log.db"
    assert main(["ask", q, "--index", str(small_index_dir), "--max-tokens", "8", "--db", str(db), "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    from targ_mlx.gates.evidence import calibrations

    assert rec["gate"] == "evidence" and rec["searched"] is True
    assert rec["tau"] == calibrations()["smollm2-135m"]["tau"]  # shipped per model
    assert rec["found"] and all({"key", "title", "score"} <= set(p) for p in rec["found"])
    assert rec["score"] == rec["scores"]["evidence"] and rec["retrieved"] == (rec["score"] > rec["tau"])
    assert rec["reason"] and ("read" in rec["reason"] or "memory" in rec["reason"])
    assert rec["latency"]["retrieval"] > 0  # the search is counted on every question
    from targ_mlx.log.decisions import DecisionLog

    row = DecisionLog(str(db)).rows()[0]
    assert row["extra"]["reason"] == rec["reason"] and len(row["extra"]["found"]) == len(rec["found"])


def test_ask_plain_output(tmp_path, capsys):
    rc = main(["ask", "what is the capital of france", "--gate", "never", "--no-log", "--max-tokens", "8"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.strip()
    assert err.startswith("[never U=- <= tau=-: answered from memory;")
    assert "why: gate never → answered from memory" in err


@pytest.mark.parametrize("argv, message", [
    (["ask", "hi", "--model", "nosuchmodel", "--no-log"], "error: unknown model 'nosuchmodel'"),
    (["ask", "   ", "--gate", "never", "--no-log"], "error: empty question"),
])
def test_errors_are_one_line(tmp_path, capsys, argv, message):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(message) and err.count("\n") == 1


def test_library_never_imports_textual():
    code = ("import targ_mlx, targ_mlx.assistant, targ_mlx.cli, targ_mlx.log.decisions, targ_mlx.index, sys; "
            "assert 'textual' not in sys.modules and 'tui' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_module_entry_point_help():
    out = subprocess.run([sys.executable, "-m", "targ_mlx", "--help"], capture_output=True, text=True, check=True)
    assert "ask" in out.stdout


def test_every_entry_point_reports_errors_alike(tmp_path, capsys):
    """One handler (`errors.run_main`): one `error: ...` line and the same exit code everywhere."""
    from targ_mlx.calibration.cli import main as calibrate
    from targ_mlx.errors import EXIT_ERROR
    from targ_mlx.eval.__main__ import main as evaluate
    from targ_mlx.index.__main__ import main as index

    for run, argv in ((calibrate, ["--db", str(tmp_path / "none.db"), "--budget", "0.1"]),
                      (index, ["info", str(tmp_path / "nowhere")]),
                      (evaluate, ["--output-dir", str(tmp_path)])):
        assert run(argv) == EXIT_ERROR, run.__module__
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err


_NO_SERVE_EXTRA = "import sys; sys.modules['starlette'] = sys.modules['uvicorn'] = None; from targ_mlx.cli import main; "


def test_ask_runs_without_the_serve_extra():
    """starlette and uvicorn are the optional `serve` extra: `targ ask`'s parser (which also holds
    `serve`'s flags) must build without them (seen on a fresh mlx[cuda] machine)."""
    out = subprocess.run([sys.executable, "-c", _NO_SERVE_EXTRA + "sys.exit(main(['ask', '--help']))"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "usage: targ ask" in out.stdout


def test_serve_without_the_serve_extra_is_one_line_naming_the_extra():
    out = subprocess.run([sys.executable, "-c", _NO_SERVE_EXTRA + "sys.exit(main(['serve']))"],
                         capture_output=True, text=True)
    assert out.returncode != 0
    assert out.stderr.startswith("error: targ serve needs the serve extra") and out.stderr.count("\n") == 1, out.stderr
    assert "[serve]" in out.stderr


def test_importing_the_package_does_no_work():
    """`import targ_mlx` loads neither MLX nor OpenBLAS; the entry points bind it when they start."""
    code = ("import sys, targ_mlx, targ_mlx._blas as b, targ_mlx.config, targ_mlx.settings, targ_mlx.log.decisions; "
            "assert 'mlx.core' not in sys.modules, 'mlx'; assert b.BLAS_STATUS == 'not attempted', b.BLAS_STATUS")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_second_entry_point_binds_nothing_twice():
    """One entry point importing another (eval.seeds imports eval's modules) must not warn that
    mlx.core came first when OpenBLAS is bound already."""
    code = ("import warnings; warnings.simplefilter('error'); import targ_mlx._blas as b; p = b.bind_openblas(); "
            "import mlx.core; assert b.bind_openblas() == p, b.BLAS_STATUS; print(b.BLAS_STATUS)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_ask_continues_a_saved_chat(tmp_path, capsys, backbone):
    db = str(tmp_path / "log.db")
    common = ["--gate", "never", "--max-tokens", "12", "--db", db, "--json"]
    assert main(["ask", "who painted the mona lisa", *common]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["chat"] and first["history_turns"] == 0
    assert main(["ask", "when was he born?", "--chat", first["chat"], *common]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["chat"] == first["chat"] and second["history_turns"] == 1
    assert second["tokens"]["prompt"] > 40  # the first turn is in the prompt
    # Without --chat, ask stays single-turn: a new chat id and no history.
    assert main(["ask", "when was he born?", *common]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["chat"] != first["chat"] and alone["history_turns"] == 0
    assert alone["tokens"]["prompt"] < second["tokens"]["prompt"]


def test_unknown_chat_is_one_clear_line(tmp_path, capsys):
    rc = main(["ask", "when was he born?", "--chat", "nosuchchat", "--db", str(tmp_path / "log.db")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: no chat 'nosuchchat' in") and err.count("\n") == 1
    rc = main(["ask", "when was he born?", "--chat", "abc", "--no-log"])
    assert rc == 2 and "drop --no-log" in capsys.readouterr().err


def test_ask_chat_and_serve_resume_an_unfinished_build_of_a_named_index(tmp_path, notes_folder):
    """`--index DIR` whose build was stopped part-way: the loader ask, chat and serve share
    (`flags.open_index`) finishes that build and opens it, instead of refusing it as unfinished."""
    from targ_mlx.flags import open_index
    from targ_mlx.index.store import partial_dir

    folder, rows = notes_folder
    out = tmp_path / "notes-index"

    build_stopped_after_first_commit([str(folder)], out)
    retriever = open_index([str(out)])()
    assert (out / "manifest.json").is_file() and not partial_dir(out).exists()
    assert retriever.search(rows[0]["question"], 1)[0].title == "notes/lecture.md"


def test_targ_ask_binds_openblas_before_anything_loads_mlx():
    """Building `targ`'s parser imports the server's flags, whose modules load mlx.core: binding
    OpenBLAS after that leaves MLX on its reference BLAS (~30x slower matmuls on CPU)."""
    import subprocess
    import sys

    code = ("import contextlib, io\n"
            "from targ_mlx import _blas\n"
            "from targ_mlx.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['ask', '--help'])\n"
            "    except SystemExit:\n        pass\n"
            "print(_blas.BLAS_STATUS)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # bound (or found missing, or skipped) while nothing had loaded mlx.core yet
    assert out.stdout.strip() not in ("not attempted", "") and "imported before" not in out.stdout, out.stdout


@pytest.mark.parametrize("bad, what", [(b"abc \xed\xa0\x80 def", "question holds U+DCED"),
                                       (b"abc \xff def", "question holds U+DCFF")])
def test_ask_refuses_text_that_is_not_utf8_in_one_line(tmp_path, bad, what):
    """argv decodes invalid UTF-8 (here the bytes of a lone surrogate U+D800) to lone surrogates."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "targ_mlx.cli", "ask", bad, "--no-log"], capture_output=True,
                       cwd=Path(__file__).resolve().parents[1], timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.startswith(f"error: {what}") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_ask_refuses_an_index_folder_name_that_is_not_utf8(tmp_path):
    import subprocess

    r = subprocess.run([sys.executable, "-m", "targ_mlx.cli", "ask", "hi", "--index", b"notes-\xff", "--no-log"],
                       capture_output=True, cwd=Path(__file__).resolve().parents[1], timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.startswith("error: --index 'notes-\\udcff' holds U+DCFF") and err.count("\n") == 1


# What `targ ask` prints on stderr after the answer (cli.ask): gate, U, the comparison with tau, where
# the answer came from and the seconds per stage.
DECISION_LINE = re.compile(
    r"\[(?P<gate>\w+) U=(?P<u>\d+\.\d{3}|-) (?P<op><=|>) tau=(?P<tau>\d+\.\d{3}|-): "
    r"(?P<where>answered from memory|read \d+ passages); \d+\.\d{2}s \((?:opening the index \d+\.\d{2}, )?"
    r"draft \d+\.\d{2}, search \d+\.\d{2}(?: beside it)?, generation \d+\.\d{2}\)\]")
REPO = Path(__file__).resolve().parents[1]


def _documented_decision_lines(path: Path) -> list[str]:
    """The decision lines of `targ ask` output shown in `path`'s code blocks."""
    out, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside and re.match(r"\[\w+ U=", line):
            out.append(line)
    return out


def test_the_documented_targ_ask_output_has_its_format_and_the_shipped_tau(capsys, small_index_dir,
                                                                          small_index_questions):
    """README's and docs/ask.md's examples (the default model, gate and index) print the tau that
    ships for that model and gate, in the line's format as `targ ask` prints it today."""
    from targ_mlx.config import Config
    from targ_mlx.defaults import DEFAULT_GATE, DEFAULT_MODEL

    q = small_index_questions[0]["question"]
    assert main(["ask", q, "--index", str(small_index_dir), "--no-log", "--max-tokens", "8"]) == 0
    printed = capsys.readouterr().err.splitlines()
    at = next(i for i, line in enumerate(printed) if line.startswith("["))  # after the hint a weak search prints
    assert DECISION_LINE.fullmatch(printed[at]) and printed[at + 1].startswith("  why: "), printed  # the pattern is today's
    shipped = f"{resolve_tau(DEFAULT_GATE, None, DEFAULT_MODEL, Config()):.3f}"
    for doc in (REPO / "README.md", REPO / "docs" / "ask.md"):
        lines = _documented_decision_lines(doc)
        assert lines, doc
        for line in lines:
            m = DECISION_LINE.fullmatch(line)
            assert m, f"{doc.name}: {line}"
            assert m["gate"] == DEFAULT_GATE and m["tau"] == shipped, f"{doc.name}: {line} (shipped tau {shipped})"
            read = m["op"] == ">"
            assert read == (float(m["u"]) > float(m["tau"])) == m["where"].startswith("read"), f"{doc.name}: {line}"
