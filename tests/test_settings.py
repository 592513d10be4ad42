"""The one settings type: validation with one-line errors, tau resolved once, one model key."""

import math

import pytest

from targ_mlx.cli import main as ask_main
from targ_mlx.cli import setup_arg_parser as ask_parser
from targ_mlx.config import Config, load_config, save_tau
from targ_mlx.flags import settings_from_args
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
    cfg = load_config(config)
    path = alias_path("smollm2-135m")
    for spec in ("smollm2-135m", path):
        ask = ask_parser().parse_args(["ask", "q", "--model", spec, "--gate", "margin"])
        chat = chat_parser().parse_args(["--model", spec, "--gate", "margin"])
        for args in (ask, chat):
            assert settings_from_args(args, cfg, model_key(args.model)).tau == 0.123, (spec, args)
    assert backbone.model_id == model_key("smollm2-135m") == model_key(path)
