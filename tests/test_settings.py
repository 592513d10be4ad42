"""The one settings type: validation with one-line errors, tau resolved once, one model key."""

import math

import pytest

from targ_mlx.cli import main as ask_main
from targ_mlx.cli import setup_arg_parser as ask_parser
from targ_mlx.config import Config, load_config, save_tau
from targ_mlx.session.options import config_from_args, resolve
from targ_mlx.runtime.model_spec import alias_path, model_key
from targ_mlx.settings import Settings
from tui.__main__ import setup_arg_parser as chat_parser


@pytest.mark.parametrize("bad, word", [
    (dict(tau=math.nan), "tau"), (dict(tau=math.inf), "tau"), (dict(tau=-math.inf), "tau"),
    (dict(beta=0.0), "beta"), (dict(beta=-1.0), "beta"), (dict(beta=math.nan), "beta"),
    (dict(temperature=0.0), "temperature"), (dict(temperature=-0.5), "temperature"),
    (dict(gate="variance", n_samples=1), "n_samples"), (dict(k=0), "k must"),
    (dict(max_tokens=0), "max_tokens"), (dict(top_k=0), "top_k"), (dict(context_tokens=-1), "context_tokens"),
    (dict(gate="entropi"), "entropi"), (dict(prompt_style="long"), "long"),
])
def test_bad_values_are_refused_in_one_line(bad, word):
    with pytest.raises(ValueError) as e:
        Settings(**bad)
    assert word in str(e.value) and "\n" not in str(e.value)


def test_tau_is_resolved_once_at_construction():
    assert Settings(gate="entropy").tau == 0.80  # the placeholder
    assert Settings(gate="margin", tau=0.2).tau == 0.2
    assert Settings(gate="never", tau=0.2).tau == math.inf and Settings(gate="always").tau == -math.inf
    with pytest.raises(ValueError):
        Settings(gate="never", tau=math.nan)  # NaN is refused whatever the gate


def test_ask_with_a_nan_tau_fails_before_anything_runs(tmp_path, capsys):
    db = tmp_path / "log.db"
    rc = ask_main(["ask", "who wrote hamlet", "--tau", "nan", "--db", str(db)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: tau must be") and err.count("\n") == 1
    assert not db.exists()  # nothing logged: the decision never ran


def test_from_config_flags_override_the_file(tmp_path):
    cfg = Config().merged(k=12, beta=2.0)
    s = Settings.from_config(cfg, "m", gate="entropy", k=None, beta=4.0, seed=3)
    assert (s.k, s.beta, s.seed, s.tau) == (12, 4.0, 3, 0.80)
    assert Settings.from_config(cfg, "m").gate == "evidence"  # the apps' default over the library's
    assert Settings.from_config(cfg, "m", tau=0.5).tau == 0.5
    with pytest.raises(TypeError):
        Settings.from_config(cfg, "m", gates="margin")


def test_model_key_is_stable_never_a_path(tmp_path):
    assert model_key("smollm2-135m") == "smollm2-135m"
    assert model_key(alias_path("smollm2-135m")) == "smollm2-135m"  # the alias's own file
    assert model_key("/some/where/Other-7B.Q4_0.gguf") == "Other-7B.Q4_0"
    (tmp_path / "qwen-mlx").mkdir()
    assert model_key(str(tmp_path / "qwen-mlx") + "/") == "qwen-mlx"
    assert model_key("mlx-community/Qwen2.5-0.5B-Instruct-4bit") == "mlx-community/Qwen2.5-0.5B-Instruct-4bit"


def test_one_tau_key_for_ask_chat_and_eval(tmp_path, backbone):
    """A tau stored under the key (as `targ-calibrate --write` does from logged rows) is the one
    ask and chat use, whether the model is named by alias or by its file; the eval logs its rows
    under that same key (`bb.model_id`), so calibrating from an eval run reaches both."""
    config = tmp_path / "config.toml"
    save_tau(backbone.model_id, "margin", 0.123, config)
    path = alias_path("smollm2-135m")
    for spec in ("smollm2-135m", path):
        ask = ask_parser().parse_args(["ask", "q", "--model", spec, "--gate", "margin", "--config", str(config)])
        chat = chat_parser().parse_args(["--model", spec, "--gate", "margin", "--config", str(config)])
        for args in (ask, chat):
            assert resolve(config_from_args(args)).tau == 0.123, (spec, args)
    assert backbone.model_id == model_key("smollm2-135m") == model_key(path)


def _faces():
    from targ_mlx.eval.__main__ import setup_arg_parser as eval_parser
    from targ_mlx.server.__main__ import setup_arg_parser as serve_parser

    ask = ask_parser()._subparsers._group_actions[0].choices["ask"]
    return {"ask": ask, "chat": chat_parser(), "serve": serve_parser(), "eval": eval_parser()}


def test_every_answer_field_is_a_flag_of_each_face_that_takes_it():
    """A field added to Settings (with its default in defaults.py) is a flag of ask, chat, serve and
    the eval with nothing else edited; the eval leaves out only the fields its one pass records
    for every gate (gate, tau) or has no chat for."""
    from targ_mlx.settings import APPS, FACES, flag_fields, flag_name

    skipped = {name for name, f in flag_fields().items() if f.metadata["faces"] != FACES}
    assert skipped == {"gate", "tau", "recheck_every", "history_tokens", "rewrite"}
    assert all(flag_fields()[n].metadata["faces"] == APPS for n in skipped)
    for face, parser in _faces().items():
        shown = parser.format_help()
        flags = {s for a in parser._actions for s in a.option_strings}
        for name, f in flag_fields(face).items():
            assert flag_name(f) in flags and flag_name(f) in shown, (face, name)
            assert getattr(parser.parse_args(_required(face)), name) is None, (face, name)  # not given: the layers below


def test_every_answer_field_is_a_key_of_the_config_file(tmp_path):
    """The file takes the same fields by name (tau is its table of thresholds), checked by type."""
    from targ_mlx.settings import flag_fields

    for name, f in flag_fields().items():
        if name == "tau":
            continue
        value = Settings().__getattribute__(name)
        text = f'{name} = "{value}"' if isinstance(value, str) else f"{name} = {value}"
        assert load_config(_write(tmp_path / f"{name}.toml", text)).settings[name] == value, name
        with pytest.raises(ValueError, match=f"Config key {name} must be"):
            load_config(_write(tmp_path / f"bad-{name}.toml", f"{name} = true"))


def _write(path, text: str):
    path.write_text(text + "\n", encoding="utf-8")
    return path


def _required(face: str) -> list[str]:
    return {"ask": ["q"], "eval": ["--output-dir", "x"]}.get(face, [])


def test_a_flag_reaches_the_settings_the_same_way_in_every_face(tmp_path):
    from targ_mlx.eval.record import eval_answer
    from targ_mlx.settings import given

    for face, parser in _faces().items():
        args = parser.parse_args(_required(face) + ["--top-k", "7", "--read", "each", "--each", "4", "--temp", "0.5"])
        got = given(args)
        assert {k: got[k] for k in ("top_k", "read", "each", "temperature")} == \
            {"top_k": 7, "read": "each", "each": 4, "temperature": 0.5}, face
        if face == "eval":
            s = eval_answer(**got)
        else:
            (tmp_path / "c.toml").write_text("top_k = 2\nread = 'distinct'\n")  # the flags go over the file
            args.config = str(tmp_path / "c.toml")
            s = resolve(config_from_args(args))
        assert (s.top_k, s.read, s.each, s.temperature) == (7, "each", 4, 0.5), face


def test_the_latency_pass_times_the_records_own_settings():
    from targ_mlx.eval.latency import _settings
    from targ_mlx.eval.record import EvalSettings, eval_answer

    s = EvalSettings(eval_answer(read="each", each=4, depth_ratio=0.5, rerank="llm", top_k=3, max_tokens=12))
    for gate in ("never", "margin", "always"):
        t = _settings(s, gate, 8)
        assert (t.read, t.each, t.depth_ratio, t.rerank, t.top_k, t.max_tokens, t.k, t.gate) == \
            ("each", 4, 0.5, "llm", 3, 12, 8, gate)
        assert (t.context_tokens, t.prompt_style) == (512, "short")  # the eval's own defaults


def test_eval_settings_round_trip_as_a_runs_config_keeps_them():
    from targ_mlx.eval.record import EvalSettings, eval_answer

    s = EvalSettings(eval_answer(read="distinct", beta=2.0), k_max=8, ks=(4, 8), baselines=False)
    flat = s.to_dict()
    assert "answer" not in flat and flat["read"] == "distinct" and flat["k_max"] == 8 and "gate" not in flat
    assert EvalSettings.from_dict(flat) == s
    old = {k: v for k, v in flat.items() if k not in ("read", "each", "rerank", "depth_ratio")}  # an older run's
    assert EvalSettings.from_dict(old).answer.read == "passages"
