"""The answer settings: every field once, with its default, flag, help and check; tau resolved once.

A field's default is the library's (the paper's where it has one). A face layers its own defaults
over it (`APP_DEFAULTS` for ask, chat and serve; the eval's protocol values), then the config file's
values, then the flags given: `Settings.from_config(cfg, model_key, tau=..., **flags)`. The flags
of all four faces are generated from these fields (`add_flags`), so a new field is one line here
and its default in defaults.py. Bad values fail at construction, before a model loads, with one
line naming the value and the fix.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any, Mapping, Protocol

from targ_mlx import gates
from targ_mlx.defaults import (
    APP_DEFAULTS,
    DEFAULT_BETA,
    DEFAULT_CONTEXT_TOKENS,
    DEFAULT_DEPTH_RATIO,
    DEFAULT_HISTORY_TOKENS,
    DEFAULT_K,
    DEFAULT_N_SAMPLES,
    DEFAULT_PROMPT,
    DEFAULT_READ,
    DEFAULT_REWRITE,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    PAPER_GATE,
    PAPER_MAX_TOKENS,
    PROMPT_STYLES,
    READ_EACH,
    READ_MODES,
    REWRITE_METHODS,
)



class FileLayer(Protocol):
    """What the settings read from the user's config file (`config.Config`, which reads and writes
    it): its answer settings, its per-gate and per-model thresholds, the evidence gate's fits."""

    settings: Mapping[str, Any]
    tau: Mapping[str, float]
    tau_by_model: Mapping[str, Mapping[str, float]]

    def evidence_calibration(self, model: str) -> tuple[Mapping | None, str]: ...

FACES = ("ask", "chat", "serve", "eval")
APPS = ("ask", "chat", "serve")  # the eval records every gate at every k: no gate, tau or chat fields


def _opt(default: Any, help: str, *, flag: str | None = None, type: Any = None, choices: tuple | None = None,
         metavar: str | None = None, faces: tuple[str, ...] = FACES) -> Any:
    """A settings field with what its flag needs: `--name` (or `flag`), type, choices, help, faces."""
    return field(default=default, metadata=dict(help=help, flag=flag, type=type, choices=choices,
                                                metavar=metavar, faces=faces))


@dataclass(frozen=True)
class Settings:
    gate: str = _opt(PAPER_GATE, "gate: evidence searches first and reads only where it likely helps; the paper's: "
                     "entropy, margin, variance; never, always", choices=tuple(gates.names()), faces=APPS)
    tau: float | None = _opt(None, "read iff U > tau (default: calibrated for the model, else the gate's placeholder)",
                             type=float, faces=APPS)
    k: int = _opt(DEFAULT_K, "draft length in tokens (the eval: the prefix length of its headline table)", type=int)
    beta: float = _opt(DEFAULT_BETA, "margin link temperature", type=float)
    n_samples: int = _opt(DEFAULT_N_SAMPLES, "variance gate: sampled prefixes N", type=int)
    temperature: float = _opt(DEFAULT_TEMPERATURE, "variance gate: sampling temperature T", flag="--temp", type=float)
    seed: int = _opt(0, "sampling RNG seed (the eval: its splits too)", type=int)
    top_k: int = _opt(DEFAULT_TOP_K, "passages read", type=int)
    context_tokens: int = _opt(DEFAULT_CONTEXT_TOKENS, "context budget L_ctx in tokens", type=int)
    max_tokens: int = _opt(PAPER_MAX_TOKENS, "answer length cap", type=int)
    recheck_every: int = _opt(0, "re-check the gate's running score every m tokens (0: once, on the draft)", type=int,
                              faces=APPS)
    prompt_style: str = _opt(DEFAULT_PROMPT, "paper: the paper's system prompt; short: few-shot short answers",
                             flag="--prompt", choices=PROMPT_STYLES)
    history_tokens: int = _opt(DEFAULT_HISTORY_TOKENS, "in a chat: tokens of earlier turns kept in the prompt, oldest "
                               "dropped first", type=int, faces=APPS)
    rewrite: str = _opt(DEFAULT_REWRITE, "in a chat: how a follow-up becomes a standalone search query",
                        choices=REWRITE_METHODS, faces=APPS)
    read: str = _opt(DEFAULT_READ, "what reading reads: passages (the top K), distinct (the top K topics, no article "
                     "or subject twice), each (the first --each distinct topics each read on its own, the answer chosen "
                     "by the evidence for it), sentences (the sentences of the top 20 most likely to hold the answer)",
                     choices=READ_MODES)
    each: int = _opt(READ_EACH, "with --read each: distinct topics read one at a time (the eval: kept as candidates; its "
                     "answer chosen among the first 3)", type=int, metavar="M")
    rerank: str = _opt("", "re-order the search's top 20 before reading: a sentence-transformers CrossEncoder (Hub id "
                       "or folder), llm (the loaded model judges each passage; slower), or upr (by how likely SmolLM2 "
                       "finds the question after each passage); empty: off",
                       metavar="NAME|PATH|llm|upr")
    # the closed-book draft as one more search route: question + draft searched beside the question
    # and fused at this weight; only where a draft exists before the search (the evidence gate; the
    # eval's Always branch searches again with the k-token draft)
    draft_route: float = _opt(0.0, "search question + the closed-book draft too, fused beside the question's own "
                              "ranking at weight W (0: off)", type=float, metavar="W")
    depth_ratio: float = _opt(DEFAULT_DEPTH_RATIO, "read only the top-K passages whose similarity is at least R x the "
                              "most similar one's (0: all K)", type=float, metavar="R")
    # the evidence gate's calibration for this model (`Config.evidence_calibration`) and what it is:
    # "shipped", "default (pooled)", "user, 300 questions, <date>"; None: the shipped one for the model
    calibration: Mapping | None = field(default=None, compare=False, repr=False)
    calibration_label: str = ""

    def __post_init__(self):
        if self.gate not in gates.names():
            raise ValueError(f"gate {self.gate!r} unknown; choose one of {', '.join(gates.names())}")
        object.__setattr__(self, "tau", resolve_tau(self.gate, self.tau))
        _at_least("k", self.k, 1, "--k 20")
        _at_least("max_tokens", self.max_tokens, 1, "--max-tokens 32")
        _at_least("top_k", self.top_k, 1, "--top-k 5")
        _at_least("context_tokens", self.context_tokens, 0, "--context-tokens 1024")
        _at_least("recheck_every", self.recheck_every, 0, "--recheck-every 0 (off)")
        _at_least("each", self.each, 1, "--each 3")
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ValueError(f"beta must be a finite number > 0; got {self.beta}: pass --beta 3")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0; got {self.temperature}: pass --temp 0.7")
        if self.gate == "variance" and self.n_samples < 2:
            raise ValueError(f"the variance gate needs n_samples >= 2 to compare; got {self.n_samples}: "
                             "pass --n-samples 5")
        _at_least("history_tokens", self.history_tokens, 0, "--history-tokens 512")
        if self.rewrite not in REWRITE_METHODS:
            raise ValueError(f"rewrite {self.rewrite!r} unknown; choose one of {', '.join(REWRITE_METHODS)}")
        if self.read not in READ_MODES:
            raise ValueError(f"read {self.read!r} unknown; choose one of {', '.join(READ_MODES)}")
        if not (isinstance(self.depth_ratio, (int, float)) and 0.0 <= self.depth_ratio <= 1.0):
            raise ValueError(f"depth_ratio must be a number from 0 to 1; got {self.depth_ratio!r}: pass --depth-ratio 0.98 "
                             "(0 reads all K passages)")
        if not (isinstance(self.draft_route, (int, float)) and 0.0 <= self.draft_route <= 10.0):
            raise ValueError(f"draft_route must be a weight from 0 to 10; got {self.draft_route!r}: pass --draft-route 1 "
                             "(0: off)")
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"prompt style {self.prompt_style!r} unknown; choose one of {', '.join(PROMPT_STYLES)}")

    @property
    def scored(self) -> bool:
        """Whether the gate has a score U and a threshold (every gate but never and always)."""
        return gates.get(self.gate).scored

    @classmethod
    def from_config(cls, cfg: FileLayer | None, model_key: str, tau: float | None = None,
                    defaults: Mapping[str, Any] = APP_DEFAULTS, **flags: Any) -> Settings:
        """The face's `defaults`, under the config file's values, under the flags given (None = not
        given); tau the flag's, else resolved for (model_key, gate) from the file (`resolve_tau`).

        Args:
            cfg: the loaded config file (`config.load_config`), or None for none.
            model_key: the model's stable key (`model_spec.model_key`), the key of `[tau."key"]`.
            tau: an explicit threshold (the --tau flag).
            defaults: the face's own defaults (the apps' evidence gate and 256-token answers).
            flags: any other field (gate, k, seed, prompt_style, ...).
        """
        given = {k: v for k, v in flags.items() if v is not None}
        unknown = set(given) - set(flag_fields())
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        values = {**defaults, **(cfg.settings if cfg is not None else {}), **given}
        carried = values.pop("tau", None)  # a flag's, carried in cfg.settings by `Config.merged`
        tau = carried if tau is None else tau
        gate = values.get("gate", PAPER_GATE)
        cal, label = cfg.evidence_calibration(model_key) if cfg is not None else (None, "")
        return cls(**values, tau=resolve_tau(gate, tau, model_key, cfg), calibration=cal, calibration_label=label)

    def with_gate(self, gate: str, cfg: FileLayer, model_key: str) -> Settings:
        """The same settings under another gate, its tau resolved as `from_config` does."""
        cal, label = cfg.evidence_calibration(model_key)
        return replace(self, gate=gate, tau=resolve_tau(gate, None, model_key, cfg), calibration=cal,
                       calibration_label=label)


def resolve_tau(gate: str, given: float | None = None, model: str = "", cfg: FileLayer | None = None) -> float:
    """The threshold a gate reads against, the one place it is decided: never +inf and always -inf
    (`U > tau` holds never / always); else the number given; else the user's calibrated value for
    (model, gate) (`[tau."model"]`), the gate's shipped value for the model, the file's per-gate
    default (`[tau]`), the gate's placeholder, in that order."""
    if gate not in gates.names():
        raise ValueError(f"gate {gate!r} unknown; choose one of {', '.join(gates.names())}")
    if given is not None and (isinstance(given, bool) or not isinstance(given, (int, float)) or math.isnan(given)):
        raise ValueError(f"tau must be a number; got {given!r}: pass --tau 0.35 (a finite threshold on U)")
    g = gates.get(gate)
    if not g.scored:
        return math.inf if gate == "never" else -math.inf
    if given is not None:
        if not math.isfinite(given):
            raise ValueError(f"tau must be finite for gate {gate}; got {given}: pass a number like --tau 0.35, "
                             "or use --gate never / always")
        return float(given)
    user = cfg.tau_by_model.get(model, {}) if cfg is not None else {}
    if gate in user:
        return float(user[gate])
    shipped = g.model_tau(model)
    if shipped is not None:
        return float(shipped)
    return float(cfg.tau.get(gate, g.default_tau) if cfg is not None else g.default_tau)


def tau_calibrated(gate: str, model: str, cfg: FileLayer | None = None) -> bool:
    """Whether `resolve_tau(gate, None, model, cfg)` was calibrated for this model (by the user or shipped)."""
    return (cfg is not None and gate in cfg.tau_by_model.get(model, {})) or gates.get(gate).model_tau(model) is not None


def flag_fields(face: str | None = None) -> dict[str, Field]:
    """The fields a face takes as flags (every face's when `face` is None)."""
    return {f.name: f for f in fields(Settings) if "faces" in f.metadata and (face is None or face in f.metadata["faces"])}


def flag_name(f: Field) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def add_flags(p: argparse.ArgumentParser, face: str, shown: Mapping[str, Any] = APP_DEFAULTS,
              from_config: bool = True) -> None:
    """One flag per field `face` takes, None when not given (then the face's default, or the
    config file's). `shown`: the face's own defaults where they differ from the field's, for the help."""
    for name, f in flag_fields(face).items():
        value = shown.get(name, f.default)
        value = "off" if value == "" else value
        where = f"default: the config's, else {value}" if from_config else f"default {value}"
        help_ = f.metadata["help"] if value is None else f"{f.metadata['help']} ({where})"  # tau says its own
        kw = dict(dest=name, default=None, help=help_)
        for key in ("type", "choices", "metavar"):
            if f.metadata[key] is not None:
                kw[key] = f.metadata[key]
        p.add_argument(flag_name(f), **kw)


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the flags gave (those not given are left out)."""
    return {name: getattr(args, name) for name in flag_fields() if getattr(args, name, None) is not None}


def _at_least(name: str, value: int, low: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {value!r}: pass {fix}")
