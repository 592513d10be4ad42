"""Kernels or MLX's own layers: decided by timing both on this machine, once per build.

The kernels are not faster everywhere: they were tuned for AVX512-VNNI and AVX2, and on a CPU
with neither (Linux on ARM, an old x86) they run scalar code that MLX's float32 layers over
OpenBLAS beat. So instead of a table of CPU classes, the first use of a build times a small
decoder of the default model's layer shapes both ways (a prefill, then greedy decode steps) and
keeps whichever gives the lower cost of a typical answer. The result is saved beside the build
(keyed like it: sources, compiler flags, CPU) and shown by `python -m targ_mlx.runtime.native info`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx

# The default model's layer shapes (SmolLM2-135M); 2 layers keep the measurement near a second.
SHAPES = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
              num_hidden_layers=2, vocab_size=4096, rms_norm_eps=1e-5, rope_theta=100000.0,
              tie_word_embeddings=True)
PROMPT_TOKENS, DECODE_STEPS, REPEATS = 128, 16, 3
# A typical answer: a prompt of ~600 tokens with retrieved passages, then ~60 decoded tokens
# (draft and answer). The cost below weighs per-token prefill and per-step decode times so.
PREFILL_WEIGHT, DECODE_WEIGHT = 600, 60


@dataclass(frozen=True)
class Timing:
    prefill_tok_s: float  # seconds per prompt token
    decode_step_s: float  # seconds per decoded token at batch 1

    def cost(self) -> float:
        return PREFILL_WEIGHT * self.prefill_tok_s + DECODE_WEIGHT * self.decode_step_s


@dataclass(frozen=True)
class Choice:
    kernels: Timing
    mlx: Timing
    simd: str

    @property
    def use_kernels(self) -> bool:
        return prefer_kernels(self.kernels, self.mlx)

    def reason(self) -> str:
        k, m = self.kernels, self.mlx
        return (f"measured on {self.simd}: kernels prefill {1 / k.prefill_tok_s:.0f} tok/s, decode "
                f"{1 / k.decode_step_s:.0f} tok/s; MLX float32 layers {1 / m.prefill_tok_s:.0f} tok/s, "
                f"{1 / m.decode_step_s:.0f} tok/s; cost of a typical answer {k.cost() / m.cost():.2f}x MLX's")


def prefer_kernels(kernels: Timing, mlx: Timing) -> bool:
    """The kernels run unless MLX's layers answer a typical question faster."""
    return kernels.cost() <= mlx.cost()


def _models(ops):
    from mlx_lm.models import llama

    from targ_mlx.runtime.native.model import NativeLM

    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs(model_type="llama", **SHAPES))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    quantized = llama.Model(llama.ModelArgs(model_type="llama", **SHAPES))
    quantized.update(model.parameters())
    import mlx.nn as nn

    nn.quantize(quantized, group_size=32, bits=4)  # the kernels' own weight format
    return NativeLM.build(quantized, ops), model


def _time(forward, make_cache) -> Timing:
    prompt = mx.array([[(7 * i) % SHAPES["vocab_size"] for i in range(PROMPT_TOKENS)]])
    cache = make_cache()
    t0 = time.perf_counter()
    y = mx.argmax(forward(prompt, cache)[:, -1, :], axis=-1)
    mx.eval(y)
    t1 = time.perf_counter()
    for _ in range(DECODE_STEPS):
        y = mx.argmax(forward(y[:, None], cache)[:, -1, :], axis=-1)
        mx.eval(y)
    t2 = time.perf_counter()
    return Timing((t1 - t0) / PROMPT_TOKENS, (t2 - t1) / DECODE_STEPS)


def measure(ops) -> Choice:
    """Time both paths, interleaved, best of REPEATS each (the machine may be shared)."""
    from mlx_lm.models.cache import make_prompt_cache

    lm, model = _models(ops)
    runs = {"kernels": [], "mlx": []}
    for _ in range(REPEATS + 1):  # the first round warms caches and is dropped
        runs["kernels"].append(_time(lm, lambda: make_prompt_cache(model)))
        runs["mlx"].append(_time(model, lambda: make_prompt_cache(model)))
    best = {k: Timing(min(t.prefill_tok_s for t in v[1:]), min(t.decode_step_s for t in v[1:])) for k, v in runs.items()}
    return Choice(best["kernels"], best["mlx"], ops.simd())


def choice_path(ops) -> Path:
    """Where the choice for this build and thread count is saved (beside the build)."""
    from targ_mlx.runtime.native.build import module_path

    return module_path().parent / f"choice-{ops.threads()}threads.json"


def load_or_measure(ops, path: Path) -> Choice:
    """The saved choice for this build, or a fresh measurement saved there."""
    try:
        d = json.loads(path.read_text())
        return Choice(Timing(**d["kernels"]), Timing(**d["mlx"]), d["simd"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    choice = measure(ops)
    # a name of its own: two processes that first use a new build at once both measure, and a
    # shared temporary file was moved away under the second ("No such file" on its replace)
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(asdict(choice), indent=1))
    tmp.replace(path)
    return choice
