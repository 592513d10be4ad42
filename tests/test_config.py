import math
import sys
from pathlib import Path

import pytest

from targ_mlx.config import (
    DEFAULT_TAU,
    Config,
    default_config_path,
    default_db_path,
    load_config,
    save_tau,
)
from targ_mlx.gates.paper import CALIBRATED_TAU
from targ_mlx.settings import Settings, resolve_tau, tau_calibrated

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults():
    """The file gives no answer setting; the apps' come from APP_DEFAULTS over Settings' own."""
    cfg = Config()
    assert (cfg.model, cfg.index, dict(cfg.settings)) == ("smollm2-135m", (), {})
    s = Settings.from_config(cfg, "smollm2-135m")
    assert (s.gate, s.k, s.beta, s.n_samples, s.temperature, s.top_k, s.context_tokens, s.max_tokens) == (
        "evidence", 20, 3.0, 5, 0.7, 5, 1024,
        256,  # the apps' whole-answer cap; the eval and Settings() keep the paper's 32
    )
    assert Settings().max_tokens == 32 and Settings().gate == "margin"
    assert resolve_tau("margin", None, "other-model", cfg) == DEFAULT_TAU["margin"]


def test_default_model_ships_a_calibrated_tau(tmp_path):
    cfg = Config()
    for gate in ("entropy", "margin", "variance"):
        assert tau_calibrated(gate, "smollm2-135m", cfg)
        assert resolve_tau(gate, None, "smollm2-135m", cfg) == CALIBRATED_TAU["smollm2-135m"][gate] != DEFAULT_TAU[gate]
        assert not tau_calibrated(gate, "/models/other.gguf", cfg)  # not measured: flagged in the app
    # The user's own calibration (targ-calibrate --write) wins over the shipped value.
    user = load_config(write(tmp_path / "c.toml", '[tau."smollm2-135m"]\nmargin = 0.9\n'))
    assert resolve_tau("margin", None, "smollm2-135m", user) == 0.9 and tau_calibrated("margin", "smollm2-135m", user)


SHIPPED_FROM = {  # model key -> the committed eval records its shipped tau comes from
    "smollm2-135m": ("smollm2-135m", "seeded", "nq_open"),
    "qwen2.5-coder-1.5b": ("qwen2.5-coder-1.5b", "clean", "triviaqa"),
}


@pytest.mark.parametrize("model", sorted(SHIPPED_FROM))
def test_shipped_tau_is_the_budget_threshold_of_the_committed_records(model, capsys):
    """CALIBRATED_TAU[model] is what scripts/analysis/ship_tau.py prints for the records it names."""
    import importlib.util

    root = Path(__file__).parents[1]
    spec = importlib.util.spec_from_file_location("ship_tau", root / "scripts" / "analysis" / "ship_tau.py")
    ship_tau = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ship_tau)
    records = root.joinpath("results", *SHIPPED_FROM[model], "records.jsonl")
    assert ship_tau.main([str(records), "--budget", "0.3"]) == 0
    printed = {line.split(":")[0]: float(line.split("tau ")[1].split()[0])
               for line in capsys.readouterr().out.splitlines() if " tau " in line}
    assert printed == dict(CALIBRATED_TAU[model])
    assert set(SHIPPED_FROM) == set(CALIBRATED_TAU)  # every shipped tau names its records here


def test_config_is_frozen():
    cfg = Config()
    with pytest.raises(AttributeError):
        cfg.model = "x"
    with pytest.raises(TypeError):
        cfg.settings["k"] = 10
    with pytest.raises(TypeError):
        cfg.tau["margin"] = 0.1


def test_load_from_toml(tmp_path):
    path = write(
        tmp_path / "c.toml",
        """
model = "qwen"
gate = "entropy"
k = 10
beta = 2
index = "/data/index"

[tau]
margin = 0.2

[tau."qwen"]
entropy = 0.9
""",
    )
    cfg = load_config(path)
    assert (cfg.model, cfg.settings["gate"], cfg.settings["k"], cfg.index) == (
        "qwen",
        "entropy",
        10,
        ("/data/index",),
    )
    assert cfg.settings["beta"] == 2.0 and isinstance(cfg.settings["beta"], float)
    s = Settings.from_config(cfg, "qwen")
    assert (s.gate, s.k, s.beta, s.tau) == ("entropy", 10, 2.0, 0.9)
    assert resolve_tau("entropy", None, "qwen", cfg) == 0.9  # calibrated
    assert resolve_tau("margin", None, "qwen", cfg) == 0.2  # file default for the gate
    assert resolve_tau("entropy", None, "other", cfg) == DEFAULT_TAU["entropy"]  # module default


def test_tau_never_always_and_unknown_gate():
    cfg = Config()
    assert resolve_tau("never", None, "m", cfg) == math.inf
    assert resolve_tau("always", None, "m", cfg) == -math.inf
    with pytest.raises(ValueError, match="gate 'entropi' unknown"):
        resolve_tau("entropi", None, "m", cfg)


def test_unknown_key_is_rejected(tmp_path):
    path = write(tmp_path / "c.toml", "modle = 'x'\n")
    with pytest.raises(ValueError) as e:
        load_config(path)
    assert str(e.value) == f"Unknown config key: modle in {path}"


def test_unknown_tau_keys_are_rejected(tmp_path):
    path = write(tmp_path / "c.toml", "[tau]\nmargn = 0.3\n")
    with pytest.raises(ValueError, match="Unknown config key: tau.margn in"):
        load_config(path)
    path = write(tmp_path / "d.toml", "[tau.m]\nmargn = 0.3\n")
    with pytest.raises(ValueError, match="Unknown config key: tau.m.margn in"):
        load_config(path)


@pytest.mark.parametrize(
    "text, message",
    [
        ("k = 'twenty'", "Config key k must be a int; got 'twenty'"),
        ("k = true", "Config key k must be a int; got True"),
        ("beta = 'x'", "Config key beta must be a float; got 'x'"),
        (
            "[tau]\nmargin = 'high'",
            "Config key tau.margin must be a finite number; got 'high'",
        ),
        (
            "[tau.m]\nmargin = nan",
            "Config key tau.m.margin must be a finite number; got nan",
        ),
    ],
)
def test_wrong_types_are_rejected(tmp_path, text, message):
    path = write(tmp_path / "c.toml", text)
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        load_config(path)


def test_invalid_toml(tmp_path):
    path = write(tmp_path / "c.toml", "k = = 3")
    with pytest.raises(ValueError, match="is not valid TOML"):
        load_config(path)


def test_missing_explicit_path_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="Config file not found: .*nope.toml"):
        load_config(tmp_path / "nope.toml")


def test_missing_default_file_means_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("TARG_MLX_CONFIG", str(tmp_path / "absent.toml"))
    assert load_config() == Config()


def test_env_overrides_default_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("TARG_MLX_CONFIG", str(tmp_path / "c.toml"))
    monkeypatch.setenv("TARG_MLX_DB", str(tmp_path / "d.db"))
    assert default_config_path() == tmp_path / "c.toml"
    assert default_db_path() == tmp_path / "d.db"
    assert Config().db == str(tmp_path / "d.db")


def test_default_paths_are_per_user(monkeypatch):
    monkeypatch.delenv("TARG_MLX_CONFIG", raising=False)
    monkeypatch.delenv("TARG_MLX_DB", raising=False)
    assert default_config_path().name == "config.toml"
    assert default_db_path().name == "decisions.db"
    assert "targ-mlx" in str(default_db_path())


def test_merged_skips_unset_flags():
    cfg = Config().merged(k=10, gate=None, model="qwen")
    assert (dict(cfg.settings), cfg.model) == ({"k": 10}, "qwen")
    with pytest.raises(ValueError, match="Unknown config key: gates"):
        Config().merged(gates="margin")


def test_save_tau_creates_and_keeps_other_keys(tmp_path):
    path = tmp_path / "sub" / "c.toml"
    assert save_tau("smollm2-135m", "margin", 0.41, path) == path
    assert resolve_tau("margin", None, "smollm2-135m", load_config(path)) == 0.41

    write(path, 'gate = "variance"\nk = 10\n' + path.read_text())
    save_tau("smollm2-135m", "entropy", 1.2, path)
    save_tau("qwen", "margin", 0.2, path)
    save_tau("smollm2-135m", "margin", 0.5, path)  # overwrite
    cfg = load_config(path)
    assert (cfg.settings["gate"], cfg.settings["k"]) == ("variance", 10)
    assert resolve_tau("margin", None, "smollm2-135m", cfg) == 0.5
    assert resolve_tau("entropy", None, "smollm2-135m", cfg) == 1.2
    assert resolve_tau("margin", None, "qwen", cfg) == 0.2
    with open(path, "rb") as f:
        assert tomllib.load(f)["tau"]["smollm2-135m"] == {"margin": 0.5, "entropy": 1.2}
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "c.toml"
    ]  # no temp files left


def test_save_tau_rejects_bad_input(tmp_path):
    path = tmp_path / "c.toml"
    with pytest.raises(ValueError, match="Cannot store tau for gate 'never'"):
        save_tau("m", "never", 0.1, path)
    with pytest.raises(ValueError, match="must be a finite number; got inf"):
        save_tau("m", "margin", math.inf, path)
    assert not path.exists()


def test_save_tau_refuses_to_rewrite_a_broken_file(tmp_path):
    path = write(tmp_path / "c.toml", "modle = 'x'\n")
    with pytest.raises(ValueError, match="Unknown config key: modle"):
        save_tau("m", "margin", 0.3, path)
    assert path.read_text() == "modle = 'x'\n"


def test_default_model_is_the_1_5b_where_installed_else_smollm2_said_once(monkeypatch, capsys):
    from targ_mlx import config
    from targ_mlx.defaults import DEFAULT_MODEL, SMALL_MODEL
    from targ_mlx.runtime.model_spec import installed

    assert config.Config().model == SMALL_MODEL  # the suite pins its model (conftest)
    monkeypatch.delenv("TARG_MLX_MODEL")
    monkeypatch.setattr(config, "_noted_fallback", False)
    expected = DEFAULT_MODEL if installed(DEFAULT_MODEL) else SMALL_MODEL
    assert config.Config().model == config.Config().model == expected
    assert config.Config().merged(model="my.gguf").model == "my.gguf"
    assert capsys.readouterr().err == ""  # --model given: nothing to say of the default
    assert config.Config().merged(model=None).merged().model == expected
    err = capsys.readouterr().err
    if expected == SMALL_MODEL:  # named once, with the command that installs the 1.5B
        assert err.count("note: qwen2.5-coder-1.5b is not installed (pip install 'targ-mlx[qwen15b]'") == 1
    else:
        assert err == ""
    # the eval's way in says it too
    monkeypatch.setattr(config, "_noted_fallback", False)
    assert config.default_model() == expected
    err = capsys.readouterr().err
    assert err.count("note: qwen2.5-coder-1.5b is not installed") == (1 if expected == SMALL_MODEL else 0)
    monkeypatch.setenv("TARG_MLX_MODEL", "some/repo")
    assert config.Config().model == "some/repo"


def test_the_file_names_index_folders_and_a_retriever_and_the_flags_go_over_them(tmp_path):
    path = write(tmp_path / "c.toml", 'index = ["/a", "/b"]\nretriever = "hybrid"\nread = "each"\n')
    cfg = load_config(path)
    assert (cfg.index, cfg.retriever, cfg.settings["read"], cfg.path) == (("/a", "/b"), "hybrid", "each", str(path))
    assert load_config(write(tmp_path / "one.toml", 'index = "/a"\n')).index == ("/a",)
    flags = cfg.merged(index=["/c"], retriever="bm25", read="distinct", tau=0.2)
    assert (flags.index, flags.retriever, flags.settings["read"], flags.settings["tau"]) == (("/c",), "bm25", "distinct", 0.2)
    assert cfg.merged(index=[], retriever=None).index == ("/a", "/b")  # no --index: the file's folders
    assert Settings.from_config(flags, "m", gate="margin").tau == 0.2  # a --tau flag carried in the settings
    with pytest.raises(ValueError, match="Config key retriever must be one of dense, bm25, hybrid; got 'vector'"):
        load_config(write(tmp_path / "bad.toml", 'retriever = "vector"\n'))
    with pytest.raises(ValueError, match="retriever 'vector' unknown"):
        cfg.merged(retriever="vector")
