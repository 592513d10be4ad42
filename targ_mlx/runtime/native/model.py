"""A llama/qwen2-family decoder forward on the CPU kernels, over an mlx-lm model's weights.

`NativeLM.build(model)` repacks the weights of an mlx-lm `llama`/`qwen2`/`mistral` model (q|k|v
and gate|up fused) and runs the same computation as the mlx-lm forward: a decode step as one
graph node a layer where its keys fit in the cache (the node writes them into the cache's
buffers), since its graph is built and scheduled by a thread that competes with the kernels for
the same cores; prefills as ~12 kernel calls a layer, instead of ~150 MLX ops. It reads and
writes mlx-lm's own `KVCache` and `BatchKVCache`, so caches, left padding and row repetition
work as with the mlx-lm model.
Anything else (other architectures, sliding windows, rotating or quantized caches) is reported
by `unsupported(model)` and runs on the mlx-lm model instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache, KVCache

from targ_mlx.runtime.native import pack
from targ_mlx.runtime.native.caches import SharedPrefixCache
from targ_mlx.runtime.native.pack import KBlocks, Packed, Weights

ARCHS = ("llama", "qwen2", "mistral")


def _linear(layer: nn.Module, stored: Weights | None = None) -> tuple[Weights, mx.array | None]:
    """The layer's weights for the kernels (`stored`: made from its GGUF blocks) and bias."""
    bias = getattr(layer, "bias", None) if "bias" in layer else None
    if stored is not None:
        p = stored
    elif isinstance(layer, nn.QuantizedLinear):
        p = pack.from_quantized(layer.weight, layer.scales, layer.biases, layer.bits, layer.group_size)
    elif isinstance(layer, nn.Linear):
        p = pack.from_float(layer.weight)
    else:
        raise TypeError(f"unsupported linear layer {type(layer).__name__}")
    return p, (bias.astype(mx.float32) if bias is not None else None)


def _embedding(emb: nn.Module, stored: Weights | None = None) -> Weights:
    if stored is not None:
        return stored
    if isinstance(emb, nn.QuantizedEmbedding):
        return pack.from_quantized(emb.weight, emb.scales, emb.biases, emb.bits, emb.group_size)
    return pack.from_float(emb.weight)


def _rope(rope: nn.Module) -> tuple[mx.array, float, bool, int]:
    """(inverse frequencies, position scale, traditional, rotated dims) as mx.fast.rope uses them."""
    if isinstance(rope, nn.RoPE):
        half = rope.dims // 2
        inv = mx.exp(mx.arange(0, -half, -1, dtype=mx.float32) * (math.log(rope.base) / half))
        return inv, float(rope.scale), bool(rope.traditional), int(rope.dims)
    freqs = getattr(rope, "_freqs", None)
    if freqs is not None and type(rope).__name__ == "Llama3RoPE":
        return (1.0 / freqs).astype(mx.float32), 1.0, bool(rope.traditional), int(rope.dims)
    raise TypeError(f"unsupported RoPE variant {type(rope).__name__}")


def unsupported(model: nn.Module) -> str | None:
    """Why the kernels cannot run this model, or None if they can."""
    args = getattr(model, "args", None)
    arch = getattr(args, "model_type", None)
    if arch not in ARCHS:
        return f"architecture {arch!r} (supported: {', '.join(ARCHS)})"
    if any(t != "full_attention" for t in (getattr(args, "layer_types", None) or [])):
        return "sliding-window attention layers"
    if getattr(args, "sliding_window", None) and arch == "mistral":
        return "sliding-window attention"
    try:
        layer = model.model.layers[0]
        _rope(layer.self_attn.rope)
        if any(math.prod(p.shape) and p.shape[-1] % 32 for p in (layer.self_attn.q_proj.weight,)):
            pass
    except (AttributeError, TypeError) as e:
        return str(e)
    if args.hidden_size % 32 or args.intermediate_size % 32:
        return "hidden or intermediate size not a multiple of 32"
    return None


@dataclass
class _Layer:
    norm_in: mx.array
    qkv: list[Weights]  # q|k|v fused; split where their forms differ (see `_fuse`)
    qkv_bias: mx.array | None
    o: Weights
    o_bias: mx.array | None
    norm_post: mx.array
    gate_up: list[Weights]
    gate_up_bias: mx.array | None
    down: Weights
    down_bias: mx.array | None


def _fuse(parts: list[Weights]) -> list[Weights]:
    """Concatenate runs of parts of the same form. A Q4_K_M file stores q and k in Q4_K and v
    in Q6_K: one fused matrix in the wider form would add bytes (and memory reads) to q and k."""
    runs: list[list[Weights]] = []
    for p in parts:
        if runs and runs[-1][-1].kind == p.kind:
            runs[-1].append(p)
        else:
            runs.append([p])
    return [pack.concat(r) for r in runs]


# Rows up to which a step runs a layer as one node. Above it (prefills) the layer runs as its
# separate ops: the one node's big intermediates would be allocated inside its task, on MLX's
# stream thread, and that made the SmolLM2 eval's prefill-bound record pass ~7% slower than the
# separate ops, whose outputs MLX allocates on the scheduling thread (docs/archive/
# benchmarks-journal.md, "One graph node a layer").
LAYER_NODE_ROWS = 64


def _qlinear(N, x: mx.array, parts: list[Weights], bias: mx.array | None) -> mx.array:
    if len(parts) == 1:
        return parts[0].linear(N, x, bias=bias)
    y = mx.concatenate([p.linear(N, x) for p in parts], axis=-1)
    return y if bias is None else y + bias


def _parts(parts: list[Weights]) -> tuple[list[int], list[mx.array]]:
    """A fused matrix's parts as the layer ops take them: their forms, and their arrays in order."""
    specs = [p.spec() for p in parts]
    return [f for f, _ in specs], [a for _, arrays in specs for a in arrays]


def _cat_bias(parts: list[mx.array | None], sizes: list[int]) -> mx.array | None:
    if all(b is None for b in parts):
        return None
    return mx.concatenate([b if b is not None else mx.zeros((n,), mx.float32) for b, n in zip(parts, sizes)])


class NativeLM:
    """Forward passes of a decoder on the CPU kernels; see the module docstring."""

    def __init__(self, ops, layers: list[_Layer], embed: Weights, head: Weights, norm: mx.array, eps: float,
                 n_heads: int, n_kv_heads: int, head_dim: int, scale: float, rope: tuple):
        self.ops, self.layers, self.embed, self.head_w, self.norm, self.eps = ops, layers, embed, head, norm, eps
        self.n_heads, self.n_kv_heads, self.head_dim, self.scale = n_heads, n_kv_heads, head_dim, scale
        self.inv_freq, self.rope_scale, self.traditional, _ = rope
        # per layer, the arguments of its `decoder_layer` node before and after the cache's that
        # never change (built once: a decode step should spend its Python time on nothing it
        # could have done at load)
        self._pre = [(*_parts(l.qkv), l.qkv_bias) for l in layers]
        self._post = [(*l.o.spec(), l.o_bias, l.norm_post, eps, *_parts(l.gate_up), l.gate_up_bias, *l.down.spec(),
                       l.down_bias) for l in layers]

    @classmethod
    def build(cls, model: nn.Module, ops, stored: dict[str, Weights] | None = None) -> "NativeLM":
        """stored: weights made from the GGUF's K-quant blocks by module path
        ("model.layers.0.mlp.down_proj", `repack.stored_weights`), used instead of repacking the
        module's own (affine) weights."""
        why = unsupported(model)
        if why:
            raise ValueError(f"the CPU kernels do not support this model: {why}")
        stored = stored or {}
        layers = []
        for i, blk in enumerate(model.model.layers):
            at, mlp = blk.self_attn, blk.mlp

            def lin(mod: nn.Module, path: str):
                return _linear(mod, stored.get(f"model.layers.{i}.{path}"))

            (q, qb), (k, kb), (v, vb) = lin(at.q_proj, "self_attn.q_proj"), lin(at.k_proj, "self_attn.k_proj"), \
                lin(at.v_proj, "self_attn.v_proj")
            o, ob = lin(at.o_proj, "self_attn.o_proj")
            (g, gb), (u, ub) = lin(mlp.gate_proj, "mlp.gate_proj"), lin(mlp.up_proj, "mlp.up_proj")
            d, db = lin(mlp.down_proj, "mlp.down_proj")
            layers.append(_Layer(
                norm_in=blk.input_layernorm.weight.astype(mx.float32),
                qkv=_fuse([q, k, v]), qkv_bias=_cat_bias([qb, kb, vb], [q.shape[0], k.shape[0], v.shape[0]]),
                o=o, o_bias=ob, norm_post=blk.post_attention_layernorm.weight.astype(mx.float32),
                gate_up=_fuse([g, u]), gate_up_bias=_cat_bias([gb, ub], [g.shape[0], u.shape[0]]),
                down=d, down_bias=db,
            ))
        embed = _embedding(model.model.embed_tokens, stored.get("model.embed_tokens"))
        lm_head = getattr(model, "lm_head", None)
        tied = lm_head is None or getattr(model.args, "tie_word_embeddings", False)
        head = embed if tied else _linear(lm_head, stored.get("lm_head"))[0]
        mx.eval(_arrays(layers))
        return cls._over(model, ops, layers, embed, head)

    @classmethod
    def _over(cls, model: nn.Module, ops, layers: list[_Layer], embed: Weights, head: Weights) -> "NativeLM":
        args, at0 = model.args, model.model.layers[0].self_attn
        head_dim = at0.head_dim if hasattr(at0, "head_dim") else args.hidden_size // args.num_attention_heads
        lm = cls(ops, layers, embed, head, model.model.norm.weight.astype(mx.float32), float(args.rms_norm_eps),
                 at0.n_heads, at0.n_kv_heads, int(head_dim), float(at0.scale), _rope(at0.rope))
        # Every derived array evaluated here, on the loading thread: a lazy one first evaluated from
        # another thread (the chat app's answer worker) fails with MLX's "There is no Stream(cpu, 0)
        # in current thread".
        mx.eval(_arrays(lm))
        return lm

    def state(self) -> dict[str, mx.array]:
        """Every array the kernels read, by name (for `from_state`; the repack cache saves it)."""
        out = {}
        tops = {"embed": self.embed} if self.head_w is self.embed else {"embed": self.embed, "head": self.head_w}
        for i, l in enumerate(self.layers):
            for f in fields(_Layer):
                x = getattr(l, f.name)
                if isinstance(x, list):
                    tops.update({f"layers.{i}.{f.name}.{j}": p for j, p in enumerate(x)})
                else:
                    tops[f"layers.{i}.{f.name}"] = x
        for name, x in tops.items():
            if isinstance(x, Packed):
                out.update({f"{name}.q": x.q, f"{name}.scales": x.scales, f"{name}.biases": x.biases})
            elif isinstance(x, KBlocks):
                out.update({f"{name}.blocks": x.blocks, f"{name}.qtype": mx.array(x.qtype, dtype=mx.int32)})
            elif x is not None:
                out[name] = x
        return out

    @classmethod
    def from_state(cls, model: nn.Module, ops, arrays: dict[str, mx.array]) -> "NativeLM":
        """The engine `build(model)` made, from its `state()`; the model gives only the shapes."""
        def weights(name: str) -> Weights | None:
            if f"{name}.blocks" in arrays:
                return KBlocks(arrays[f"{name}.blocks"], int(arrays[f"{name}.qtype"].item()))
            if f"{name}.q" not in arrays:
                return None
            q, s = arrays[f"{name}.q"], arrays[f"{name}.scales"]
            # Q4_K tiles: uint8 scales, 4 bits; Q6_K tiles: int8 scales, 6 bits; affine: from the shapes
            bits = 4 if s.dtype == mx.uint8 else 6 if s.dtype == mx.int8 else int(q.shape[1]) * 8 // (int(s.shape[1]) * pack.QG)
            return Packed(q, s, arrays[f"{name}.biases"], bits)

        layers = []
        for i in range(len(model.model.layers)):
            kw = {}
            for f in fields(_Layer):
                name = f"layers.{i}.{f.name}"
                parts = [w for j in range(3) if (w := weights(f"{name}.{j}")) is not None]
                kw[f.name] = parts or weights(name)
                if kw[f.name] is None:
                    kw[f.name] = arrays.get(name)
            layers.append(_Layer(**kw))
        embed = weights("embed")
        return cls._over(model, ops, layers, embed, weights("head") or embed)

    @property
    def nbytes(self) -> int:
        total = self.embed.nbytes + (0 if self.head_w is self.embed else self.head_w.nbytes)
        for l in self.layers:
            total += sum(p.nbytes for p in l.qkv + l.gate_up) + l.o.nbytes + l.down.nbytes
        return total

    def _positions(self, c: Any) -> tuple[mx.array, mx.array | None, int]:
        """(RoPE position of each row's next token, per-row padding, where the padding starts)."""
        if isinstance(c, SharedPrefixCache):
            return c.base + c.offset, None, 0
        if isinstance(c, BatchKVCache):
            return c.offset, c.left_padding, int(getattr(c, "prefix_len", 0))
        if isinstance(c, KVCache):
            return mx.array([c.offset], dtype=mx.int32), None, 0
        raise TypeError(f"the CPU kernels support KVCache and BatchKVCache, not {type(c).__name__}")

    def hidden(self, tokens: mx.array, cache: list[Any], last: bool = False, prompt: bool = False) -> mx.array:
        """Final-norm hidden states (B, L, H) for tokens (B, L); advances every layer's cache.

        `last`: only the last position's state is wanted, (B, 1, H). The last layer then runs its
        attention, output projection and MLP for that position alone (its keys and values are
        still written for every position), as llama.cpp does for outputs nobody reads: 1/28 of
        the 1.5B's prefill. A row's bits do not depend on which other rows run beside it
        (`attention` and the matrix kernels compute each row alone), so the result is the same.

        `prompt`: the tokens are a prompt's (a prefill, not a decode step or guessed tokens), whose
        attention runs on AMX-BF16 tiles where granted (csrc/attn_tiles.h). The caller says so, not
        the shape, so a prompt's bits never depend on its batch, padding or chunking.
        """
        N = self.ops
        B, L = tokens.shape
        x = self.embed.embed(N, tokens)
        pos, pad, hole = self._positions(cache[0])
        cos, sin = N.rope_table(pos, self.inv_freq, B, L, self.rope_scale)
        heads = (self.n_heads, self.n_kv_heads, self.head_dim, self.traditional)
        final = self.layers[-1]
        for layer, c, pre, post in zip(self.layers, cache, self._pre, self._post):
            batch = isinstance(c, BatchKVCache)
            prev = c._idx if batch else c.offset
            if (B * L <= LAYER_NODE_ROWS and not isinstance(c, SharedPrefixCache) and c.keys is not None
                    and prev + L <= c.keys.shape[2]):
                # a decode step whose keys fit in the cache's buffers: the whole layer as one node,
                # which writes them in place (mlx-lm's update_and_fetch would add four nodes)
                x, c.keys, c.values = N.decoder_layer(x, layer.norm_in, self.eps, *pre, cos, sin, *heads, c.keys, c.values,
                                                      prev, self.scale, pad, hole, *post, tiles=prompt)
                c.offset += L  # as update_and_fetch counts
                if batch:
                    c._idx += L
                continue
            xn = N.rms_norm(x, layer.norm_in, self.eps)
            qkv = _qlinear(N, xn, layer.qkv, layer.qkv_bias)
            q, k, v = N.rope_split(qkv, cos, sin, *heads)
            keys, values = c.update_and_fetch(k, v)
            if last and layer is final and L > 1:
                q, x = q[:, :, -1:, :], x[:, -1:, :]
            if isinstance(c, SharedPrefixCache):
                a = N.attention(q, keys, values, self.scale, None, 0, c.shared_keys, c.shared_values, c.rows,
                                c.shared_pad, c.shared_hole, tiles=prompt)
            else:
                a = N.attention(q, keys, values, self.scale, pad, hole, tiles=prompt)
            h = layer.o.linear(N, a, bias=layer.o_bias, residual=x)
            hn = N.rms_norm(h, layer.norm_post, self.eps)
            if len(layer.gate_up) == 1 and layer.gate_up_bias is None:  # one gate|up matrix: SwiGLU in its product
                s = layer.gate_up[0].linear(N, hn, swiglu=True)
            else:
                s = N.swiglu(_qlinear(N, hn, layer.gate_up, layer.gate_up_bias))
            x = layer.down.linear(N, s, bias=layer.down_bias, residual=h)
        return N.rms_norm(x[:, -1:, :] if last else x, self.norm, self.eps)

    def head(self, h: mx.array) -> mx.array:
        return self.head_w.linear(self.ops, h)

    def __call__(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        return self.head(self.hidden(tokens, cache))


def _arrays(obj, depth: int = 5) -> list[mx.array]:
    """The mx.arrays held by `obj` (its fields, lists and tuples, `depth` levels down). The
    deepest are a layer's split parts: NativeLM.layers[i].qkv[j].scales is 5 levels down."""
    if isinstance(obj, mx.array):
        return [obj]
    if depth == 0:
        return []
    if isinstance(obj, (list, tuple)):
        items = obj
    elif isinstance(obj, dict):
        items = list(obj.values())
    elif type(obj).__module__.startswith("targ_mlx.runtime.native") and hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return []
    return [a for x in items for a in _arrays(x, depth - 1)]
