"""The user's config file: read into one frozen `Config`, written atomically; the flags go over it.

What it holds: where things are (model, index folders, retriever, decision log), answer settings
(any field of `settings.Settings` by its name: `gate`, `k`, `read`, ...; checked against that
field's type), and the thresholds and fits calibrated for each model. A face's flags go over the
file's values (`Config.merged`, `session.config_from_args`). The settings' defaults and their
layering (face defaults < this file < the flags) live in `settings.py`; tau is resolved there
(`settings.resolve_tau`). The file lives under the user config dir (platformdirs) unless
TARG_MLX_CONFIG or `--config` says otherwise; `targ-calibrate --write` stores calibrated
thresholds in it per model and gate:

    model = "qwen2.5-coder-1.5b"
    index = ["/data/targ-simplewiki", "/data/notes-index"]   # or one folder as a string
    retriever = "hybrid"
    gate = "evidence"
    read = "each"

    [tau]                     # defaults per gate, used for models with no calibrated value
    margin = 0.35

    [tau."smollm2-135m"]      # written by `targ-calibrate --write`
    margin = 0.41

    [evidence."my-model"]     # the evidence gate's own fit, written by `targ-calibrate fit`
    read = {x = [...], y = [...]}
    memory = {x = [...], y = [...]}
    n = 300
    date = "2026-11-28"

Unknown keys are an error: a typo in our own file should not be silently ignored.
Reading the file has no side effects; only `save_tau` and `save_evidence` write.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import platformdirs

from targ_mlx.errors import check_text
from targ_mlx.paths import APP_NAME
from targ_mlx.retrieval import RETRIEVERS
from targ_mlx.defaults import DEFAULT_MODEL, MODEL_ENV, SMALL_MODEL
from targ_mlx.gates import DEFAULT_TAU
from targ_mlx.gates import SCORED_GATES as GATES  # the built-in gates with a threshold (never/always have none)
from targ_mlx.settings import flag_fields

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CONFIG_ENV = "TARG_MLX_CONFIG"
DB_ENV = "TARG_MLX_DB"

_noted_fallback = False


class DefaultModel(str):
    """A model name nobody chose (no --model, no config key): the fallback note is said only
    when such a name is used, not when Config() is built and --model then replaces it."""


def default_model(note: bool = True) -> str:
    """The model the apps use when neither the config file nor --model names one: TARG_MLX_MODEL,
    else the 1.5B where it is installed, else SmolLM2 (said once, with the command that installs
    the 1.5B, unless note=False)."""
    env = os.environ.get(MODEL_ENV, "").strip()
    if env:
        return env
    from targ_mlx.runtime.model_spec import installed

    model = DefaultModel(DEFAULT_MODEL if installed(DEFAULT_MODEL) else SMALL_MODEL)
    if note:
        note_fallback(model)
    return model


def note_fallback(model: str) -> None:
    """Say once that SmolLM2 stands in for the 1.5B, with the command that installs it."""
    global _noted_fallback
    if _noted_fallback or not isinstance(model, DefaultModel) or model != SMALL_MODEL:
        return
    from targ_mlx.runtime.model_spec import ALIASES

    _noted_fallback = True
    print(f"note: {DEFAULT_MODEL} is not installed ({ALIASES[DEFAULT_MODEL]['parts'].install}, 1.1 GB); "
          f"using {SMALL_MODEL}", file=sys.stderr)


def default_config_path() -> Path:
    """TARG_MLX_CONFIG, else `config.toml` under the user config dir."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    return platformdirs.user_config_path(APP_NAME) / "config.toml"


def default_db_path() -> Path:
    """TARG_MLX_DB, else `decisions.db` under the user data dir."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env)
    return platformdirs.user_data_path(APP_NAME) / "decisions.db"


def _frozen(mapping: Mapping) -> MappingProxyType:
    return MappingProxyType(
        {k: _frozen(v) if isinstance(v, Mapping) else v for k, v in mapping.items()}
    )


@dataclass(frozen=True)
class Config:
    """The user's configuration: the config file's values (`load_config`), with the flags a face was
    given over them (`merged`): where things are, the answer settings, the calibrated thresholds."""

    model: str = field(default_factory=lambda: default_model(note=False))  # as `targ ask --model` takes it
    index: tuple[str, ...] = ()  # index folders searched together; () = the offline default index
    retriever: str | None = None  # dense, bm25 or hybrid; None: each index's default
    db: str = field(default_factory=lambda: str(default_db_path()))  # decision log file
    path: str | None = None  # the config file read (and written by /recalibrate); None: the user's
    # answer settings (Settings' field names) the file gives, and the flags over them
    settings: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # gate -> tau, used when no value was calibrated for the model (`settings.resolve_tau`)
    tau: Mapping[str, float] = field(default_factory=lambda: DEFAULT_TAU)
    # model -> gate -> calibrated tau (the [tau."model"] tables)
    tau_by_model: Mapping[str, Mapping[str, float]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    # model -> the evidence gate's calibration fitted for it (the [evidence."model"] tables)
    evidence_by_model: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def __post_init__(self):
        object.__setattr__(self, "index", tuple(self.index or ()))

    def evidence_calibration(self, model: str) -> tuple[Mapping, str]:
        """(the evidence gate's calibration for this model key, its label): the user's own fit
        (`targ-calibrate fit`), else the shipped one, else the pooled default."""
        from targ_mlx.gates.evidence import resolve

        return resolve(model, self.evidence_by_model.get(model))

    def merged(self, model: str | None = None, db: str | None = None, index: Sequence[str] | None = None,
               retriever: str | None = None, **settings: Any) -> Config:
        """A copy with the given values over the file's, skipping None and () (a flag not given):
        where things are, and answer settings (tau too: a flag's threshold). The faces call this
        with their flags, so a default model that is still in use is noted here."""
        where = {k: v for k, v in dict(model=model, db=db, index=tuple(index or ()) or None,
                                       retriever=retriever).items() if v is not None}
        for key, value in where.items():
            for text in (value if key == "index" else (value,)):
                check_text(text, f"--{key} {text!r}")
        if where.get("retriever") not in (None, *RETRIEVERS):
            raise ValueError(f"retriever {where['retriever']!r} unknown; choose one of {', '.join(RETRIEVERS)}")
        given = {k: v for k, v in settings.items() if v is not None}
        _check_settings({k: v for k, v in given.items() if k != "tau"}, "the values given")
        cfg = replace(self, **where, settings=MappingProxyType({**self.settings, **given}))
        note_fallback(cfg.model)
        return cfg


_PLACES = {"model": "str", "index": "str", "retriever": "str", "db": "str"}
FITS = ("read", "read_support", "memory", "memory_confirmed", "memory_unconfirmed")  # an evidence calibration's knots
_FIT_INFO = {"tau": (int, float), "tau_rate": (int, float), "n": (int,), "n_confirmed": (int,), "date": (str,),
             "source": (str,), "records": (list,), "feedback": (int,)}
_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "str | None": (str,)}


def _setting_types() -> dict[str, tuple]:
    """The answer settings a file may hold, by name: the flag fields of Settings (tau is a table here)."""
    return {name: _TYPES[str(f.type)] for name, f in flag_fields().items() if name != "tau"}


def _check_settings(values: Mapping[str, Any], where: Any) -> None:
    types = _setting_types()
    for key, value in values.items():
        if key not in types:
            raise ValueError(f"Unknown config key: {key} in {where}")
        if isinstance(value, bool) or not isinstance(value, types[key]):
            raise ValueError(f"Config key {key} must be a {types[key][-1].__name__}; got {value!r} in {where}")


def _check_tau(value: Any, key: str, path: Path) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
    ):
        raise ValueError(
            f"Config key {key} must be a finite number; got {value!r} in {path}"
        )
    return float(value)


def _check_evidence(model: str, fit: Any, path: Path) -> dict:
    """One [evidence."model"] table: "read" and "memory" knots (equal-length x, y lists, x rising) and
    what the fit was made from."""
    where = f"evidence.{model}"
    if not isinstance(fit, dict) or "read" not in fit or "memory" not in fit:
        raise ValueError(f"Config key {where} must be a table with read and memory knots in {path}; "
                         "fix: rerun targ-calibrate fit, or delete the table")
    for key, value in fit.items():
        if key in FITS:
            xs, ys = (value.get(c) if isinstance(value, dict) else None for c in ("x", "y"))
            ok = (isinstance(xs, list) and isinstance(ys, list) and len(xs) == len(ys) > 0
                  and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs + ys)
                  and all(a <= b for a, b in zip(xs, xs[1:])))
            if not ok:
                raise ValueError(f"Config key {where}.{key} must be {{x = [...], y = [...]}}, equal lengths, x rising, "
                                 f"in {path}; fix: rerun targ-calibrate fit")
        elif key not in _FIT_INFO:
            raise ValueError(f"Unknown config key: {where}.{key} in {path}")
        elif isinstance(value, bool) or not isinstance(value, _FIT_INFO[key]):
            raise ValueError(f"Config key {where}.{key} must be a {_FIT_INFO[key][-1].__name__}; got {value!r} in {path}")
    return fit


def _parse(doc: dict, path: Path) -> Config:
    values: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    tau = dict(DEFAULT_TAU)
    tau_by_model: dict[str, dict[str, float]] = {}
    evidence: dict[str, dict] = {}
    for key, value in doc.items():
        if key == "evidence":
            if not isinstance(value, dict):
                raise ValueError(f"Config key evidence must be a table of models; got {value!r} in {path}")
            evidence = {m: _check_evidence(m, fit, path) for m, fit in value.items()}
            continue
        if key == "tau":
            if not isinstance(value, dict):
                raise ValueError(
                    f"Config key tau must be a table; got {value!r} in {path}"
                )
            for name, item in value.items():
                if isinstance(item, dict):  # [tau."model"]
                    for gate, t in item.items():
                        if gate not in GATES:
                            raise ValueError(
                                f"Unknown config key: tau.{name}.{gate} in {path}"
                            )
                        tau_by_model.setdefault(name, {})[gate] = _check_tau(
                            t, f"tau.{name}.{gate}", path
                        )
                elif name in GATES:
                    tau[name] = _check_tau(item, f"tau.{name}", path)
                else:
                    raise ValueError(f"Unknown config key: tau.{name} in {path}")
            continue
        if key == "index" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            values[key] = tuple(value)  # several folders, searched together
            continue
        if key in _PLACES:
            allowed = _TYPES[_PLACES[key]]
            if isinstance(value, bool) or not isinstance(value, allowed):
                raise ValueError(f"Config key {key} must be a {allowed[-1].__name__}; got {value!r} in {path}")
            if key == "retriever" and value not in RETRIEVERS:
                raise ValueError(f"Config key retriever must be one of {', '.join(RETRIEVERS)}; got {value!r} in {path}")
            values[key] = (value,) if key == "index" else value
            continue
        _check_settings({key: value}, path)
        settings[key] = float(value) if _setting_types()[key] == (int, float) else value
    return Config(**values, settings=_frozen(settings), tau=_frozen(tau), tau_by_model=_frozen(tau_by_model),
                  evidence_by_model=_frozen(evidence))


def _read(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"Config file {path} is not valid TOML: {e}") from None


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Defaults overlaid with the TOML file at `path` (default: `default_config_path()`).

    A missing default file means defaults; a missing explicit path is an error (likely a typo).
    """
    explicit = path is not None
    if path is None:
        path = default_config_path()
        if not path.exists():
            return Config()
    path = Path(path)
    check_text(str(path), f"--config {str(path)!r}")
    if not path.exists():
        raise FileNotFoundError(
            f"Config file not found: {path} (create it, or drop --config to use the default)"
        )
    return replace(_parse(_read(path), path), path=str(path) if explicit else None)


def _write(doc: dict, path: Path) -> Path:
    _parse(doc, path)  # refuse to write a file we would not read back
    import tomli_w  # only the writer needs it

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".toml", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            tomli_w.dump(doc, f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def save_evidence(model: str, fit: Mapping[str, Any], path: str | os.PathLike | None = None) -> Path:
    """Store the evidence gate's calibration for `model` as `[evidence."model"]`, and its tau as
    `[tau."model"] evidence`, keeping every other key (atomically, as `save_tau`)."""
    if not model:
        raise ValueError("Cannot store a calibration without a model name; pass --model")
    path = Path(path) if path is not None else default_config_path()
    doc = _read(path) if path.exists() else {}
    keep = {k: v for k, v in fit.items() if k in FITS or k in _FIT_INFO}
    doc.setdefault("evidence", {})[model] = keep
    doc.setdefault("tau", {}).setdefault(model, {})["evidence"] = _check_tau(fit["tau"], f"tau.{model}.evidence", path)
    return _write(doc, path)


def save_tau(
    model: str, gate: str, tau: float, path: str | os.PathLike | None = None
) -> Path:
    """Store a calibrated tau as `[tau."model"] gate = tau`, keeping every other key.

    The file is rewritten atomically (temp file + rename), so a reader never sees half of it;
    TOML comments in it are not preserved. Returns the path written.
    """
    if gate not in GATES:
        raise ValueError(
            f"Cannot store tau for gate {gate!r}; use one of {', '.join(GATES)}"
        )
    if not model:
        raise ValueError("Cannot store tau without a model name; pass --model")
    path = Path(path) if path is not None else default_config_path()
    doc = _read(path) if path.exists() else {}
    key = f"tau.{model}.{gate}"
    tau = _check_tau(tau, key, path)
    doc.setdefault("tau", {}).setdefault(model, {})[gate] = tau
    return _write(doc, path)
