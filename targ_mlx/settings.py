"""The one settings type of the answer path: frozen, validated, with tau resolved once.

`Settings.from_config(cfg, key, **flags)` is how `targ ask`, the chat app and the eval build it:
config file values, overridden by the flags given, and tau from the flag, else the config's
calibrated value for (model key, gate) (`model_spec.model_key`), else the gate's placeholder.
Bad values fail here, before a model loads, with one line naming the value and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from targ_mlx.config import Config
from targ_mlx.defaults import (
    DEFAULT_BETA,
    DEFAULT_CONTEXT_TOKENS,
    DEFAULT_DEPTH_RATIO,
    DEFAULT_GATE,
    PAPER_GATE,
    DEFAULT_HISTORY_TOKENS,
    DEFAULT_K,
    PAPER_MAX_TOKENS,
    DEFAULT_N_SAMPLES,
    DEFAULT_PROMPT,
    DEFAULT_READ,
    READ_MODES,
    DEFAULT_REWRITE,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    PROMPT_STYLES,
    REWRITE_METHODS,
)
from targ_mlx import gates

_FIXED_TAU = {"never": math.inf, "always": -math.inf}  # U > tau never / always holds


@dataclass(frozen=True)
class Settings:
    gate: str = PAPER_GATE  # the paper's; `from_config` gives the apps' default (evidence)
    tau: float | None = None  # None -> the gate's placeholder; never/always get +inf/-inf
    k: int = DEFAULT_K  # draft length
    beta: float = DEFAULT_BETA  # margin link temperature
    n_samples: int = DEFAULT_N_SAMPLES  # variance gate: sampled prefixes N
    temperature: float = DEFAULT_TEMPERATURE  # variance gate: sampling temperature T
    seed: int = 0
    top_k: int = DEFAULT_TOP_K  # passages retrieved
    context_tokens: int = DEFAULT_CONTEXT_TOKENS  # L_ctx
    max_tokens: int = PAPER_MAX_TOKENS  # the paper's; `from_config` gives the apps' (256)
    recheck_every: int = 0  # m: re-check the running score every m tokens (0 = single-shot)
    prompt_style: str = DEFAULT_PROMPT
    history_tokens: int = DEFAULT_HISTORY_TOKENS  # earlier chat turns kept in the prompt
    rewrite: str = DEFAULT_REWRITE  # how a follow-up becomes a standalone search query
    read: str = DEFAULT_READ  # what reading reads: the top-K passages, or the selected sentences of the top 20
    rerank: str = ""  # re-order the search's top 20 before reading: "" off, "llm", or a CrossEncoder name/path
    # the closed-book draft as one more search route: question + draft searched beside the question
    # and fused at this weight (0: off); only where a draft exists before the search (the evidence gate)
    draft_route: float = 0.0
    depth_ratio: float = DEFAULT_DEPTH_RATIO  # read the top-K passages whose similarity is >= this x the most similar one's (0: all)
    # the evidence gate's calibration for this model (`Config.evidence_calibration`) and what it is:
    # "shipped", "default (pooled)", "user, 300 questions, <date>"; None: the shipped one for the model
    calibration: Mapping | None = field(default=None, compare=False, repr=False)
    calibration_label: str = ""

    def __post_init__(self):
        if self.gate not in gates.names():
            raise ValueError(f"gate {self.gate!r} unknown; choose one of {', '.join(gates.names())}")
        tau = self.tau
        if tau is not None and (isinstance(tau, bool) or not isinstance(tau, (int, float)) or math.isnan(tau)):
            raise ValueError(f"tau must be a number; got {tau!r}: pass --tau 0.35 (a finite threshold on U)")
        if self.gate in _FIXED_TAU:
            tau = _FIXED_TAU[self.gate]
        elif tau is None:
            tau = gates.get(self.gate).default_tau
        elif not math.isfinite(tau):
            raise ValueError(f"tau must be finite for gate {self.gate}; got {tau}: pass a number like --tau 0.35, "
                             "or use --gate never / always")
        object.__setattr__(self, "tau", float(tau))
        _at_least("k", self.k, 1, "--k 20")
        _at_least("max_tokens", self.max_tokens, 1, "--max-tokens 32")
        _at_least("top_k", self.top_k, 1, "--top-k 5")
        _at_least("context_tokens", self.context_tokens, 0, "--context-tokens 1024")
        _at_least("recheck_every", self.recheck_every, 0, "--recheck-every 0 (off)")
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
    def from_config(cls, cfg: Config, model_key: str, tau: float | None = None, **flags: Any) -> Settings:
        """Config values overridden by the flags given (None = not given); tau resolved for model_key.

        Args:
            cfg: the loaded config file (`config.load_config`).
            model_key: the model's stable key (`model_spec.model_key`), the key of `[tau."key"]`.
            tau: an explicit threshold (the --tau flag), else calibrated / placeholder.
            flags: any other field of Settings or Config (gate, k, seed, prompt_style, ...).
        """
        given = {k: v for k, v in flags.items() if v is not None}
        unknown = set(given) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        shared = {f.name for f in fields(Config)} & {f.name for f in fields(cls)}
        values = {name: getattr(cfg, name) for name in shared if name != "tau"}
        values.update(given)
        gate = values.get("gate", DEFAULT_GATE)
        if tau is None and gates.get(gate).scored:
            tau = cfg.tau_for(model_key, gate)
        cal, label = cfg.evidence_calibration(model_key)
        return cls(**values, tau=tau, calibration=cal, calibration_label=label)

    def with_gate(self, gate: str, cfg: Config, model_key: str) -> Settings:
        """The same settings under another gate, its tau resolved as `from_config` does."""
        tau = cfg.tau_for(model_key, gate) if gates.get(gate).scored else None
        cal, label = cfg.evidence_calibration(model_key)
        return replace(self, gate=gate, tau=tau, calibration=cal, calibration_label=label)


def _at_least(name: str, value: int, low: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}; got {value!r}: pass {fix}")
