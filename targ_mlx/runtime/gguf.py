"""Load a GGUF file (llama or qwen2 architecture) into an mlx-lm model.

Weights come from `mx.load(path, return_metadata=True)`, which keeps Q4_0/Q4_1/Q8_0 blocks as
MLX affine-quantized triplets. Files with other block types are read with the `gguf` package:
Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1 become triplets too (`targ_mlx.runtime.gguf_blocks`, groups of 32), and
the rest (Q2_K, Q3_K, IQ*) are dequantized to float32. The tokenizer and chat template come from the same metadata
(`targ_mlx.runtime.tokenizer`). Nothing here knows about gates or retrieval.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from targ_mlx.errors import ModelLoadError
from targ_mlx.runtime.gguf_blocks import GROUP  # every MLX triplet here: GGUF blocks and K-quant sub-blocks are 32 wide

SUPPORTED_ARCHS = ("llama", "qwen2")

# GGUF tensor names -> mlx-lm parameter names (per block, then the rest).
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias|scales|biases)$")
_TOP_RE = re.compile(r"^([a-z_]+)\.(weight|bias|scales|biases)$")


@dataclass(frozen=True)
class GGUFModel:
    model: nn.Module
    metadata: dict
    arch: str
    # "float32" | "float16" | "bfloat16" | "q4", "q8", "q4+q8": kept quantized, the mlx-lm layers' bits
    # per tensor (a Q4_K_M file's Q6_K rows are 8-bit there; the CPU kernels keep their own blocks)
    dtype: str
    n_params: int
    context_length: int


def _meta_value(v):
    if isinstance(v, mx.array):
        return v.item() if v.size == 1 else v
    return v


# Scales and biases of repacked K-quant blocks. float16 keeps a Q4_K_M file's weights within
# 1.2x its size (float32: 1.4x) and changed no greedy token (docs/archive/benchmarks-journal.md,
# "K-quant GGUFs on the kernels").
SCALE_DTYPE = mx.float16


# GGML type ids: F32, F16, Q4_0, Q4_1, Q8_0, BF16. `mx.load` keeps the quantized ones as MLX
# triplets exactly; any other type it converts to float16 (slowly, and rounding), so such files
# go through the `gguf` package instead.
_MLX_EXACT = frozenset({0, 1, 30})
_MLX_KEEPS = _MLX_EXACT | {2, 3, 8}
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def tensor_types(path: str) -> set[int]:
    """The GGML type ids of a GGUF file's tensors, from its header alone (GGUFReader parses
    every metadata array into numpy and takes ~40 s on a 150k-token vocabulary)."""
    import struct

    with open(path, "rb") as f:
        buf = f.read(1 << 20)
        pos = 0

        def take(n: int) -> bytes:
            nonlocal buf, pos
            while pos + n > len(buf):
                more = f.read(max(1 << 20, n))
                if not more:
                    raise ModelLoadError(f"cannot read GGUF file {path}: its header is truncated; re-download it")
                buf = buf[pos:] + more
                pos = 0
            pos += n
            return buf[pos - n : pos]

        def skip(kind: int) -> None:
            if kind == 8:
                take(struct.unpack("<Q", take(8))[0])
            elif kind == 9:
                sub, n = struct.unpack("<IQ", take(12))
                if sub in _SCALAR:
                    take(_SCALAR[sub] * n)
                else:
                    for _ in range(n):
                        skip(sub)
            else:
                take(_SCALAR[kind])

        if take(4) != b"GGUF":
            raise ModelLoadError(f"{path} is not a GGUF file (bad magic); pass a .gguf model file")
        _, n_tensors, n_kv = struct.unpack("<IQQ", take(20))
        for _ in range(n_kv):
            take(struct.unpack("<Q", take(8))[0])
            skip(struct.unpack("<I", take(4))[0])
        types = set()
        for _ in range(n_tensors):
            take(struct.unpack("<Q", take(8))[0])
            n_dims = struct.unpack("<I", take(4))[0]
            take(8 * n_dims)
            types.add(struct.unpack("<I", take(4))[0])
            take(8)
        return types


def check_file(path: str) -> None:
    if not os.path.isfile(path):
        raise ModelLoadError(f"GGUF file not found: {path}. Pass an existing .gguf path or a model alias.")


def read_gguf(path: str, keep_blocks: bool = True) -> tuple[dict[str, mx.array], dict]:
    """Raw tensors and metadata; falls back to the `gguf` package for block types MLX lacks.

    keep_blocks: return the block types `gguf_blocks` knows as MLX affine triplets (name.weight
    packed uint32, name.scales, name.biases); False dequantizes them to float32 as the `gguf`
    package does (the exact reference; Q6_K's repacking rounds a little).
    """
    check_file(path)
    if keep_blocks and not tensor_types(path) <= _MLX_KEEPS or not keep_blocks and not tensor_types(path) <= _MLX_EXACT:
        return _read_with_gguf_package(path, keep_blocks=keep_blocks)
    try:
        weights, meta = mx.load(path, return_metadata=True)
    except Exception as e:
        # MLX reads F32/F16/BF16/Q4_0/Q4_1/Q8_0 only ("gguf_tensor_to_f16 failed" otherwise); the
        # gguf package reads every block type, and tells a truncated file from an exotic one.
        return _read_with_gguf_package(path, first_error=e, keep_blocks=keep_blocks)
    return weights, {k: _meta_value(v) for k, v in meta.items()}


def _read_with_gguf_package(path: str, first_error: Exception | None = None,
                            keep_blocks: bool = True) -> tuple[dict[str, mx.array], dict]:
    try:
        from gguf.quants import dequantize
    except ImportError as e:  # pragma: no cover - gguf is a core dependency
        raise ModelLoadError("reading this GGUF's block types needs the `gguf` package: pip install gguf") from e
    from targ_mlx.runtime import gguf_blocks

    reader = _reader(path, first_error)
    meta = _fields(reader)
    weights = {}
    for t in reader.tensors:
        # GGUF stores dims fastest-first; numpy shape from the reader is already row-major.
        shape = tuple(reversed(t.shape.tolist()))
        a = gguf_blocks.affine(t.data, t.tensor_type, shape) if keep_blocks and len(shape) == 2 else None
        if a is not None and t.name.endswith(".weight"):
            base = t.name[: -len("weight")]
            weights[t.name] = mx.array(gguf_blocks.mlx_packed(a))
            weights[base + "scales"] = mx.array(a.scales).astype(SCALE_DTYPE)
            weights[base + "biases"] = mx.array(a.biases).astype(SCALE_DTYPE)
            continue
        arr = dequantize(t.data, t.tensor_type)
        weights[t.name] = mx.array(np.asarray(arr, dtype=np.float32).reshape(shape))
    return weights, meta


def _fields(reader) -> dict:
    meta = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            meta[name] = field.contents()
        except Exception:  # some exotic field types; the model does not need them
            continue
    return meta


def _reader(path: str, first_error: Exception | None = None):
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except Exception as e:
        raise ModelLoadError(
            f"cannot read GGUF file {path} ({first_error or e}); it is truncated or not a GGUF file: re-download it"
        ) from e


def metadata(path: str) -> dict:
    """A GGUF file's metadata from its header (memory-mapped; no tensor is read): enough for its
    tokenizer (`tokenizer.tokenizer_from_gguf`) without loading the model."""
    return _fields(_reader(path))


def stored_blocks(path: str, types: set[int]) -> dict[str, tuple[int, np.ndarray]]:
    """The raw super-blocks of the 2-D weights whose GGML type is in `types`, by mlx-lm module
    path ("model.layers.0.mlp.down_proj"): (GGML type, (N, K / 256 * block bytes) uint8 view of
    the file), for kernels that read them in the file's own terms."""
    from gguf import GGUFReader

    out = {}
    for t in GGUFReader(path).tensors:
        kind = int(t.tensor_type)
        if kind in types and len(t.shape) == 2 and t.name.endswith(".weight"):
            (name,) = _rename({t.name: None})
            out[name[: -len(".weight")]] = kind, np.asarray(t.data)
    return out


def model_args(meta: dict, arch: str, has_output: bool) -> dict:
    p = arch  # GGUF keys are prefixed by the architecture name
    try:
        hidden = int(meta[f"{p}.embedding_length"])
        heads = int(meta[f"{p}.attention.head_count"])
        args = {
            "model_type": arch,
            "hidden_size": hidden,
            "num_hidden_layers": int(meta[f"{p}.block_count"]),
            "intermediate_size": int(meta[f"{p}.feed_forward_length"]),
            "num_attention_heads": heads,
            "num_key_value_heads": int(meta.get(f"{p}.attention.head_count_kv", heads)),
            "rms_norm_eps": float(meta[f"{p}.attention.layer_norm_rms_epsilon"]),
            "vocab_size": int(meta.get(f"{p}.vocab_size", len(meta["tokenizer.ggml.tokens"]))),
            "rope_theta": float(meta.get(f"{p}.rope.freq_base", 10000.0)),
            "max_position_embeddings": int(meta.get(f"{p}.context_length", 4096)),
            "tie_word_embeddings": not has_output,
        }
    except KeyError as e:
        raise ModelLoadError(f"GGUF metadata lacks {e.args[0]!r}; the file is incomplete or not a {arch} model") from e
    rot = meta.get(f"{p}.rope.dimension_count")
    if rot is not None and int(rot) != hidden // heads:
        args["head_dim"] = int(rot)
    # llama.cpp's converter permutes llama's q/k rows for its interleaved ("traditional") RoPE;
    # qwen2 is stored unpermuted and uses the NeoX form.
    args["rope_traditional"] = arch == "llama"
    return args


def _rename(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    out = {}
    for name, w in weights.items():
        m = _BLOCK_RE.match(name)
        if m:
            layer, part, kind = m.groups()
            if part not in _BLOCK_NAMES:
                raise ModelLoadError(f"unexpected GGUF tensor {name!r}; this architecture variant is not supported")
            out[f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"] = w
            continue
        m = _TOP_RE.match(name)
        if m and m.group(1) in _TOP_NAMES:
            out[f"{_TOP_NAMES[m.group(1)]}.{m.group(2)}"] = w
        elif name.startswith("rope_freqs"):
            continue  # llama3 rope scaling factors; mlx-lm recomputes them from the args
        else:
            raise ModelLoadError(f"unexpected GGUF tensor {name!r}; this architecture variant is not supported")
    return out


def _bits(weights: dict[str, mx.array], prefix: str) -> int:
    """Bits per value of the MLX-quantized `prefix`.weight (uint32 words per group of 32)."""
    return weights[f"{prefix}.weight"].shape[-1] * 32 // (weights[f"{prefix}.scales"].shape[-1] * GROUP)


def _quantized(weights: dict[str, mx.array]) -> list[str]:
    """The prefixes of MLX-quantized triplets (prefix.weight/.scales/.biases); empty when all are dense."""
    return [n[: -len(".scales")] for n in weights if n.endswith(".scales")]


def _count_params(weights: dict[str, mx.array]) -> int:
    total = 0
    for name, w in weights.items():
        if name.endswith((".scales", ".biases")) and name[: -len("scales")] + "weight" in weights:
            continue
        total += w.shape[0] * weights[name[: -len("weight")] + "scales"].shape[-1] * GROUP if w.dtype == mx.uint32 else w.size
    return total


def dequantize_all(weights: dict[str, mx.array], dtype: mx.Dtype) -> dict[str, mx.array]:
    out = {}
    for name, w in weights.items():
        if name.endswith((".scales", ".biases")) and name[: -len("scales")] + "weight" in weights:
            continue
        base = name[: -len("weight")]
        if name.endswith(".weight") and base + "scales" in weights:
            w = mx.dequantize(w, weights[base + "scales"], weights[base + "biases"], group_size=GROUP,
                              bits=_bits(weights, base[:-1]))
        out[name] = w.astype(dtype)
    return out


def load_gguf(path: str, dtype: str = "auto") -> GGUFModel:
    """Build an mlx-lm llama/qwen2 model from a GGUF file.

    Args:
        path: the .gguf file.
        dtype: "auto" (float32 for models up to 2B parameters on CPU, where MLX's dense
            BLAS path is far faster than its quantized kernels; else keep the file's
            quantization), "float32", "float16", "bfloat16" or "quantized".
    """
    on_cpu = mx.default_device() == mx.cpu
    # Float dtypes (and "auto" on CPU, which means float32 there) take the exact dequantization.
    raw, meta = read_gguf(path, keep_blocks=dtype == "quantized" or (dtype == "auto" and not on_cpu))
    return model_from(path, _rename(raw), meta, dtype)


def model_from(path: str, weights: dict[str, mx.array], meta: dict, dtype: str = "auto",
               evaluate: bool = True) -> GGUFModel:
    """The mlx-lm model over `weights` (mlx-lm names, e.g. from `load_gguf` or the repack cache).
    evaluate=False leaves lazily loaded arrays unread until something uses them."""
    arch = str(meta.get("general.architecture", "?"))
    if arch not in SUPPORTED_ARCHS:
        raise ModelLoadError(
            f"GGUF architecture {arch!r} in {path} is not supported; supported: {', '.join(SUPPORTED_ARCHS)} "
            "(other architectures: pass an mlx-lm model id or MLX folder instead)"
        )
    from mlx_lm.models import llama, qwen2

    module = {"llama": llama, "qwen2": qwen2}[arch]
    args = model_args(meta, arch, has_output="lm_head.weight" in weights)
    if arch == "qwen2":
        args.pop("head_dim", None)
    model = module.Model(module.ModelArgs.from_dict(args))
    quant = _quantized(weights)
    n_params = _count_params(weights)
    if dtype == "auto":
        on_cpu = mx.default_device() == mx.cpu
        dtype = "float32" if (not quant or (on_cpu and n_params <= 2_000_000_000)) else "quantized"
    if dtype == "quantized" and quant:
        # Bits differ per tensor (SmolLM2's Q4_1 file keeps its embedding in Q8_0).
        def predicate(p, m):
            if f"{p}.scales" not in weights:
                return False
            return {"group_size": GROUP, "bits": _bits(weights, p)}

        nn.quantize(model, class_predicate=predicate)
        dense = weights
        # each tensor's bits, e.g. "q4+q8" (a Q4_K_M file's Q6_K rows are 8-bit here, SmolLM2's
        # Q8_0 embedding too): what a user reads as the weights' size
        label = "+".join(f"q{b}" for b in sorted({_bits(weights, p) for p in quant}))
    else:
        if dtype == "quantized":
            dtype = "float32"
        dense = dequantize_all(weights, getattr(mx, dtype))
        label = dtype
    try:
        model.load_weights(list(dense.items()), strict=True)
    except ValueError as e:
        raise ModelLoadError(f"GGUF tensors in {path} do not fit a {arch} model: {e}") from e
    if evaluate:
        mx.eval(model.parameters())
    return GGUFModel(model=model, metadata=meta, arch=arch, dtype=label, n_params=n_params,
                     context_length=int(args["max_position_embeddings"]))
