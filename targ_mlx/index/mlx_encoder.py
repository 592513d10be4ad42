"""The `mlx` encoder backends: a BERT sentence encoder (all-MiniLM-L6-v2 and other mean-pooling
BERTs) run by MLX in float32 without torch (`mlx`), or with its matrix products in bfloat16
(`mlx-bf16`: float32 sums, norms, softmax and pooling, as torch's bfloat16 autocast computes).

It computes the function the torch backend computes (the largest difference on 256 real chunks
was 1.6e-7 per coordinate), so an index built with either is searched and extended with either
(`encoder.family`). What it saves is torch itself: loading sentence-transformers made the first
search of every `targ ask` cost 3.4 s, and torch's threads fight the OpenBLAS that MLX binds in
the same process. On a CPU the matrix products run on that OpenBLAS and the rest on this
project's kernels (`runtime/native/csrc/bert.h`: exact-erf GELU, LayerNorm with its residual,
bidirectional attention over padded rows); on a Mac (Metal) and with mlx[cuda], on MLX's own ops.
`mlx-bf16` runs its products on the kernels' `bf16_linear` (`csrc/bf16gemm.h`, AVX512-BF16), with
each weight packed once at load.

Texts are sorted by length and batched, so little is padded; a text's vector depends only on its
own tokens (rows are independent, attention stops at each row's length).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

BACKEND, BACKEND_BF16 = "mlx", "mlx-bf16"
_GELU_C = 0.7071067811865476


def unusable(folder: Path | str, bf16: bool = False) -> str | None:
    """Why the mlx backend (`bf16`: mlx-bf16) cannot run `folder`'s model here, or None when it can."""
    folder = Path(folder)
    try:
        cfg = json.loads((folder / "config.json").read_text())
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    except (OSError, ValueError):
        return f"{folder} is not a local sentence-transformers folder"
    if cfg.get("model_type") != "bert" or cfg.get("position_embedding_type", "absolute") != "absolute":
        return f"{folder} is not an absolute-position BERT ({cfg.get('model_type')})"
    if not pooling.get("pooling_mode_mean_tokens") or not (folder / "model.safetensors").is_file():
        return f"{folder} is not a mean-pooling model with model.safetensors"
    import mlx.core as mx

    if sys.platform == "darwin" or mx.default_device() != mx.cpu:
        # Metal or mlx[cuda]: MLX's own ops (checked on an H100: BENCHMARKS.md, row "GPU:
        # encoder")
        return "bfloat16 products are the CPU kernels'" if bf16 else None
    from targ_mlx import _blas
    from targ_mlx.runtime import native

    if _blas.BLAS_PATH is None:
        return f"MLX's CPU matrix products would run on the reference BLAS ({_blas.BLAS_STATUS})"
    if native.module() is None:
        return f"the CPU kernels are unavailable ({native.status()})"
    if bf16 and not native.module().bf16_products():
        return f"the CPU kernels were built without AVX512-BF16 ({native.module().simd()})"
    if bf16 and (cfg["hidden_size"] % 16 or cfg["intermediate_size"] % 16):
        return "its widths are not multiples of 16, which bfloat16 pairs in 16 lanes need"
    return None


class _Ops:
    """The encoder's layers on this project's CPU kernels (the products: MLX's float32 ones, or the
    kernels' bfloat16 ones for mlx-bf16), or on MLX's own ops elsewhere."""

    def __init__(self, bf16: bool = False):
        import mlx.core as mx

        self.mx = mx
        self.bf16 = bf16  # the kernels' attention in bfloat16 too, as torch's autocast runs it
        self.k = None
        if sys.platform != "darwin" and mx.default_device() == mx.cpu:
            from targ_mlx.runtime import native

            self.k = native.module()

    def layer_norm(self, x, w, b, eps, residual=None):
        if self.k is not None:
            return self.k.layer_norm(x, w, b, eps, residual=residual)
        return self.mx.fast.layer_norm(x if residual is None else x + residual, w, b, eps)

    def linear(self, x, w, b, gelu: bool = False):
        """x @ w + b (then GELU): w float32 (in, out) for MLX's product, or bf16_pack's pairs for
        the kernels', which apply the GELU to each tile as it is made."""
        if w.dtype == self.mx.uint16:
            return self.k.bf16_linear(x, w, b, gelu=gelu)
        y = self.mx.addmm(b, x, w)
        return self.gelu(y) if gelu else y

    def gelu(self, x):
        if self.k is not None:
            return self.k.gelu(x)
        return x * 0.5 * (1 + self.mx.erf(x * _GELU_C))

    def attention(self, qkv, lengths, heads: int, scale: float, rows, L: int):
        """qkv (T, 3H), the sequences' rows one after another -> (T, H), each sequence attending
        over its own lengths[b] rows. MLX's fused attention wants padded (B, L) rows, so there
        they are scattered out to `rows` (each real row's place in B x L) and gathered back; the
        kernels take them packed."""
        if self.k is not None:
            return self.k.bidir_attention(qkv, lengths, heads, scale, bf16=self.bf16)
        mx = self.mx
        B, W = lengths.shape[0], qkv.shape[-1]
        mask = mx.arange(L)[None, :] < lengths[:, None]  # (B, L): the real rows
        q, k, v = (mx.zeros((B * L, W), qkv.dtype).at[rows].add(qkv)
                   .reshape(B, L, 3, heads, W // 3 // heads).transpose(2, 0, 3, 1, 4))
        bias = mx.where(mask, 0.0, -mx.inf)[:, None, None, :]
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=bias.astype(q.dtype))
        return out.transpose(0, 2, 1, 3).reshape(B * L, W // 3)[rows]


class MlxBert:
    """A mean-pooling BERT sentence embedder with the `encode` / dimension API `encoder.Encoder` uses."""

    def __init__(self, folder: Path | str, bf16: bool = False):
        import mlx.core as mx
        from tokenizers import Tokenizer

        folder = Path(folder)
        why = unusable(folder, bf16)
        if why:
            name, fix = (BACKEND_BF16, BACKEND) if bf16 else (BACKEND, "torch")
            raise ValueError(f"the {name} encoder backend cannot run here: {why}; fix: use --backend {fix}")
        cfg = json.loads((folder / "config.json").read_text())
        st = folder / "sentence_bert_config.json"
        max_len = json.loads(st.read_text()).get("max_seq_length", 512) if st.is_file() else 512
        self.max_len = min(int(max_len), int(cfg["max_position_embeddings"]))
        self.heads, self.eps = int(cfg["num_attention_heads"]), float(cfg["layer_norm_eps"])
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_len)
        self.tokenizer.no_padding()
        w = mx.load(str(folder / "model.safetensors"))
        w = {k.removeprefix("bert."): v.astype(mx.float32) for k, v in w.items()}
        self.emb = (w["embeddings.word_embeddings.weight"], w["embeddings.position_embeddings.weight"],
                    w["embeddings.token_type_embeddings.weight"][0],
                    w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self.layers = []
        for i in range(int(cfg["num_hidden_layers"])):
            p = f"encoder.layer.{i}."

            def t(name):  # (out, in) -> (in, out): x @ W^T as one contiguous matmul operand
                return mx.contiguous(w[p + name + ".weight"].T)

            qkv = [p + f"attention.self.{n}" for n in ("query", "key", "value")]
            self.layers.append({
                "qkv_w": mx.contiguous(mx.concatenate([w[n + ".weight"] for n in qkv]).T),
                "qkv_b": mx.concatenate([w[n + ".bias"] for n in qkv]),
                "o_w": t("attention.output.dense"), "o_b": w[p + "attention.output.dense.bias"],
                "ln1": (w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"]),
                "up_w": t("intermediate.dense"), "up_b": w[p + "intermediate.dense.bias"],
                "down_w": t("output.dense"), "down_b": w[p + "output.dense.bias"],
                "ln2": (w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"]),
            })
        self.ops = _Ops(bf16)
        if bf16:  # each product's weight as bfloat16 pairs, once; the float32 copy is dropped
            for lay in self.layers:
                for name in ("qkv_w", "o_w", "up_w", "down_w"):
                    lay[name] = self.ops.k.bf16_pack(lay[name])
        mx.eval(self.emb, self.layers)
        self.hidden = int(cfg["hidden_size"])
        self.mx = mx

    def get_sentence_embedding_dimension(self) -> int:
        return self.hidden

    def _forward(self, ids, lengths):
        """ids (B, L) padded -> (B, H) mean-pooled. Every layer runs on the real tokens only, packed
        one sequence after another (T = sum of lengths rows, not B x L); the last layer's rows go
        back to their padded places for the pooling, so a vector's bits are those of the padded
        computation (rows are independent, and padding added zeros)."""
        mx, ops = self.mx, self.ops
        B, L = ids.shape
        H = self.hidden
        word, pos, typ, ln_w, ln_b = self.emb
        real = np.arange(L)[None, :] < np.asarray(lengths)[:, None]
        rows = mx.array(np.flatnonzero(real))  # each real token's place in the padded (B * L)
        ids_p, pos_p = ids.reshape(-1)[rows], mx.array(np.nonzero(real)[1])
        x = ops.layer_norm(word[ids_p] + pos[pos_p] + typ, ln_w, ln_b, self.eps)
        scale = (H // self.heads) ** -0.5
        for lay in self.layers:
            qkv = ops.linear(x, lay["qkv_w"], lay["qkv_b"])
            a = ops.attention(qkv, lengths, self.heads, scale, rows, L)
            x = ops.layer_norm(ops.linear(a, lay["o_w"], lay["o_b"]), *lay["ln1"], self.eps, residual=x)
            u = ops.linear(x, lay["up_w"], lay["up_b"], gelu=True)
            x = ops.layer_norm(ops.linear(u, lay["down_w"], lay["down_b"]), *lay["ln2"], self.eps, residual=x)
            # One layer at a time: evaluated as one graph, all six layers' intermediates stay alive
            # (560 MB for 32 x 131 tokens, not 206) and every fresh buffer is page-faulted in, which
            # made a batch 20-30% slower on the CPU.
            mx.eval(x)
        x = mx.zeros((B * L, H), x.dtype).at[rows].add(x).reshape(B, L, H)
        mask = mx.array(real.astype(np.float32))[..., None]
        return (x * mask).sum(1) / mx.maximum(mask.sum(1), 1e-9)

    def encode(self, texts: Sequence[str], batch_size: int = 32, normalize_embeddings: bool = True,
               **_ignored) -> np.ndarray:
        """Mean-pooled embeddings of `texts` in their order (L2-normalised unless told otherwise)."""
        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        if not texts:
            return out
        encs = self.tokenizer.encode_batch(list(texts))
        order = sorted(range(len(encs)), key=lambda i: -len(encs[i].ids))  # longest first: little padding
        for s in range(0, len(order), max(1, batch_size)):
            rows = order[s:s + batch_size]
            L = max(len(encs[i].ids) for i in rows)
            ids = np.zeros((len(rows), L), dtype=np.int32)
            lengths = np.empty(len(rows), dtype=np.int32)
            for r, i in enumerate(rows):
                n = len(encs[i].ids)
                ids[r, :n], lengths[r] = encs[i].ids, n
            v = self._forward(self.mx.array(ids), self.mx.array(lengths))
            out[rows] = np.asarray(v)
        if normalize_embeddings:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out
