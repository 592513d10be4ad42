"""The LLM: load it (mlx-lm id or folder, GGUF file, or an offline alias), prefill, step.

Everything above this module sees logits as `mx.array`s and token ids as ints; nothing here
knows about gates, retrieval or prompts.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from targ_mlx import _blas
from targ_mlx.runtime import native
from targ_mlx.runtime.native import pages as native_pages
from targ_mlx.runtime.engine import Engine, MlxLMEngine
from targ_mlx.errors import ModelLoadError
from targ_mlx.runtime.model_spec import ALIASES, alias_path, model_key
from targ_mlx.runtime.tokenizer import ChatTokenizer, HFTokenizer, tokenizer_from_gguf

logger = logging.getLogger(__name__)

PREFILL_CHUNK = 512  # tokens per prefill step: bounds the attention scratch memory


@dataclass
class Backbone:
    model: nn.Module
    tokenizer: ChatTokenizer
    model_id: str  # the stable key (`model_spec.model_key`): thresholds and the log use it
    context_length: int
    dtype: str
    info: dict = field(default_factory=dict)
    engine: Engine | None = None  # what runs the model; None means plain mlx-lm (`MlxLMEngine`)
    _prefixes: OrderedDict = field(default_factory=OrderedDict, repr=False)

    def __post_init__(self):
        if self.engine is None:
            self.engine = MlxLMEngine(self.model)

    @property
    def on_gpu(self) -> bool:
        """Whether the model runs on a GPU (Metal, CUDA), leaving the CPU's cores to other work."""
        return self.engine.name == "mlx" and mx.default_device() == mx.gpu

    @property
    def vocab_size(self) -> int:
        return self.model.args.vocab_size if hasattr(self.model, "args") else self.tokenizer.vocab_size

    def make_cache(self) -> list[Any]:
        return make_prompt_cache(self.model)

    def prefill(self, ids: list[int], cache: list[Any]) -> mx.array:
        """Run `ids` (one sequence) through the model; returns the last position's logits (1, V).

        Only the last position goes through the LM head: for a small model with a large
        vocabulary (SmolLM2: 49k x 576) that head is ~20% of the prefill FLOPs.
        """
        return self.prefill_tokens(mx.array(ids, dtype=mx.int32)[None], cache)

    def prefill_tokens(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        """`prefill` for a (B, L) batch of tokens: chunked so attention scratch stays bounded."""
        for start in range(0, tokens.shape[1] - PREFILL_CHUNK, PREFILL_CHUNK):
            self.engine.advance(tokens[:, start : start + PREFILL_CHUNK], cache)
            mx.eval([c.state for c in cache])
        last = (tokens.shape[1] - 1) // PREFILL_CHUNK * PREFILL_CHUNK
        return self.engine.last_logits(tokens[:, last:], cache)

    def prefix_kv(self, ids: tuple[int, ...]) -> list[tuple[mx.array, mx.array]]:
        """Per layer, the (keys, values) of `ids` run on their own, (1, H, P, D).

        Prompts of a batch share their header (system prompt and few-shot turns); it is run once
        and memoized for the few headers in use. On the kernels a row's keys do not depend on what
        follows, so reusing them gives bit for bit what a full prefill gives.
        """
        hit = self._prefixes.get(ids)
        if hit is None:
            cache = self.make_cache()
            self.prefill(list(ids), cache)
            hit = [(c.keys[:, :, : c.offset, :], c.values[:, :, : c.offset, :]) for c in cache]
            mx.eval(hit)
            self._prefixes[ids] = hit
            while len(self._prefixes) > 4:
                self._prefixes.popitem(last=False)
        else:
            self._prefixes.move_to_end(ids)
        return hit

    def step(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        """One decode step for a batch: tokens (B,) -> logits (B, V) in float32."""
        return self.engine.step(tokens, cache)

    def step_chunk(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        """Several tokens of one sequence fed at once: tokens (L,) -> the logits after each, (L, V)
        in float32 (a decode step per row, as `draft._greedy_lookup` verifies guesses)."""
        return self.engine.head(self.engine.hidden(tokens[None], cache))[0].astype(mx.float32)

    def select(self, logits: mx.array, inv_temp: mx.array, u: mx.array) -> tuple[mx.array, ...]:
        """(token, entropy, gap, logprob) per row; see `targ_mlx.runtime.sampling`."""
        return self.engine.select(logits, inv_temp, u)


def load_backbone(spec: str, dtype: str = "auto", kernels: bool | None = None, huge_pages: str = "advise") -> Backbone:
    """Load a model by alias, GGUF path, local MLX folder or Hugging Face repo id.

    Args:
        spec: an offline alias ("qwen2.5-coder-1.5b", "smollm2-135m"), a path to a .gguf file,
            a folder holding an MLX model, or an mlx-lm repo id such as
            "mlx-community/Qwen2.5-7B-Instruct-4bit". Which model an app uses when none is
            named is the app's choice (`targ_mlx.config.default_model`), not the runtime's.
        dtype: for GGUF files: "auto" (the file's quantization under the CPU kernels, else
            float32 for small models on CPU), "float32", "float16", "bfloat16" or "quantized".
        kernels: run on targ_mlx's CPU kernels (`targ_mlx.runtime.native`); None means "where they
            help": a CPU-only MLX, dtype "auto" or "quantized", and a supported architecture.
        huge_pages: on the kernels, the weights' memory pages (`targ_mlx.runtime.native.pages`):
            "advise" (free at load; 2 MB pages come over minutes), "collapse" (2 MB pages now,
            ~2-3 s for the 1.5B: what the long-running apps ask for) or "off".
    """
    if not spec or not spec.strip():
        raise ModelLoadError("empty model spec; pass an alias (smollm2-135m), a .gguf path or an mlx-lm repo id")
    if huge_pages not in native_pages.MODES:
        raise ModelLoadError(f"huge_pages={huge_pages!r}: use one of {', '.join(native_pages.MODES)}")
    # None: where they were measured faster (native.ops()); True: by name, whatever the measurement
    kmod = native.ops() if kernels is None else native.module() if kernels else None
    use_kernels = (dtype in ("auto", "quantized") and kmod is not None) if kernels is None else kernels
    if use_kernels and kmod is None:
        raise ModelLoadError(f"the CPU kernels were requested but are unavailable: {native.status()}")
    if spec in ALIASES:
        bb = _load_gguf_backbone(alias_path(spec), dtype, kmod if use_kernels else None)
    elif spec.lower().endswith(".gguf"):
        bb = _load_gguf_backbone(spec, dtype, kmod if use_kernels else None)
    elif os.path.isdir(spec) or ("/" in spec and not os.path.exists(spec) and spec.count("/") == 1):
        bb = _load_mlx_backbone(spec)
    else:
        bb = None
    if bb is not None:
        bb.model_id = model_key(spec)
        if use_kernels and bb.engine.name != "targ_mlx.runtime.native":
            _attach_kernels(bb, kmod)
        bb.info["huge_pages"] = bb.engine.huge_pages(huge_pages)
        bb.info["kernels"] = "targ_mlx.runtime.native " + native.status() if bb.engine.name == "targ_mlx.runtime.native" else "mlx"
        if bb.engine.name == "mlx" and sys.platform == "linux" and mx.default_device() == mx.cpu and _blas.BLAS_PATH is None:
            logger.warning("MLX runs on CPU with its reference BLAS (%s); call targ_mlx.bind_openblas() before "
                           "anything imports mlx.core, as the entry points do", _blas.BLAS_STATUS)
        return bb
    known = ", ".join(ALIASES)
    raise ModelLoadError(
        f"unknown model {spec!r}: use an alias ({known}), a path to a .gguf file, an MLX model folder, "
        "or a Hugging Face repo id like mlx-community/Qwen2.5-0.5B-Instruct-4bit"
    )


def _attach_kernels(bb: Backbone, kmod) -> None:
    """Run `bb` on the CPU kernels when its architecture allows (else it stays on mlx-lm)."""
    from targ_mlx.runtime.native.engine import NativeEngine
    from targ_mlx.runtime.native.model import NativeLM, unsupported

    why = unsupported(bb.model)
    if why:
        logger.warning("CPU kernels skipped for %s: %s; running the mlx-lm model", bb.model_id, why)
        return
    bb.engine = NativeEngine(NativeLM.build(bb.model, kmod))


def _load_gguf_backbone(path: str, dtype: str, kmod) -> Backbone:
    from targ_mlx.runtime.gguf import load_gguf

    engine = None
    if kmod is not None and dtype in ("auto", "quantized"):
        from targ_mlx.runtime.repack import load_gguf_native  # repacked once, then from the disk cache
        from targ_mlx.runtime.native.engine import NativeEngine

        g, lm = load_gguf_native(path, kmod)
        engine = NativeEngine(lm) if lm is not None else None
    else:
        g = load_gguf(path, dtype=dtype)
    tok = tokenizer_from_gguf(g.metadata, path)
    return Backbone(model=g.model, tokenizer=tok, model_id=model_key(path), context_length=g.context_length,
                    dtype=g.dtype, info={"arch": g.arch, "params": g.n_params, "path": path}, engine=engine)


def _load_mlx_backbone(spec: str) -> Backbone:
    from mlx_lm import load

    try:
        model, wrapper = load(spec)
    except Exception as e:
        where = "folder" if os.path.isdir(spec) else "repo id (needs a network the first time)"
        raise ModelLoadError(f"cannot load mlx-lm model {spec!r} ({where}): {e}") from e
    ctx = getattr(model.args, "max_position_embeddings", None) or 4096
    return Backbone(model=model, tokenizer=HFTokenizer(wrapper), model_id=spec, context_length=int(ctx),
                    dtype="mlx", info={"arch": getattr(model.args, "model_type", "?")})
