"""How exact would an int8 encoder be? Fake-quantization of the MLX encoder's matrix products,
scored by recall@5 against float32's own top 5 (the encoder benchmark's agreement protocol).

Each scheme rounds the weights of every matrix product (qkv, attention output, FFN up, FFN down)
to int8 with one scale per output channel or per group of 32 along the inner dimension (Q8_0's
blocks), and the activations entering them to int8 with one scale per token or per group of 32
along the inner dimension, or leaves them in float32. The
products are then computed in float32 on the rounded values, which is what an int8 kernel with
exact int32 sums computes, so this measures the rounding alone, not a kernel.

    python scripts/bench/bench_encoder_quant.py --passages 1000 --questions 500 [--schemes "Q8_0"]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

from targ_mlx._blas import bind_openblas

bind_openblas()  # before mlx.core loads
import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_encoder import NQ_DEV, agreement_with, chunks  # noqa: E402

MATS = ("qkv", "o", "up", "down")
# name: (weight products rounded, activation scale: "token" | "group32" | None for float32,
#        weight scale: "channel" | "group32")
SCHEMES = {
    "w8 per channel, a8 per token": (MATS, "token", "channel"),
    "w8 per channel, a8 per token, FFN down in float": (("qkv", "o", "up"), "token", "channel"),
    "w8 per channel, a8 per token, qkv + FFN up only": (("qkv", "up"), "token", "channel"),
    "w8 per channel, a8 per group of 32": (MATS, "group32", "channel"),
    "w8 per channel, activations float32": (MATS, None, "channel"),
    "w8 per group of 32 (Q8_0), a8 per group of 32": (MATS, "group32", "group32"),
    "w8 per group of 32 (Q8_0), activations float32": (MATS, None, "group32"),
}


def round_weights(w, how="channel"):  # (in, out): one scale per output channel, or per 32 inputs of it
    g = w.reshape(w.shape[0] // 32, 32, w.shape[1]) if how == "group32" else w[None]
    s = mx.maximum(mx.max(mx.abs(g), axis=1, keepdims=True), 1e-12) / 127.0
    return (mx.round(g / s) * s).reshape(w.shape)


def round_activations(x, how):
    if how is None:
        return x
    shape = x.shape
    g = x.reshape(*shape[:-1], shape[-1] // 32, 32) if how == "group32" else x
    s = mx.maximum(mx.max(mx.abs(g), axis=-1, keepdims=True), 1e-12) / 127.0
    return (mx.round(g / s) * s).reshape(shape)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passages", type=int, default=1000)
    ap.add_argument("--questions", type=int, default=500)
    ap.add_argument("--output-dir", type=Path)
    ap.add_argument("--schemes", default="", help="only the schemes whose name contains this text")
    args = ap.parse_args(argv)
    from targ_mlx.index.encoder import load_encoder

    enc = load_encoder(backend="mlx")
    bert = enc.model
    cs = chunks(args.passages)
    titles, texts = [c.title for c in cs], [c.text for c in cs]
    with open(NQ_DEV) as f:
        qs = [json.loads(line)["question"] for line in itertools.islice(f, args.questions)]
    t0 = time.perf_counter()
    ref, ref_q = enc.encode_passages(titles, texts), enc.encode_queries(qs)
    print(f"float32: {args.passages} passages, {len(qs)} questions in {time.perf_counter() - t0:.0f} s", flush=True)
    top_ref = np.argsort(-(ref_q @ ref.T), axis=1)[:, :5]
    float_layers, float_addmm = bert.layers, mx.addmm
    out = {}
    for name, (mats, act, wscale) in SCHEMES.items():
        if args.schemes not in name:
            continue
        layers = [{**lay, **{f"{m}_w": round_weights(lay[f"{m}_w"], wscale) for m in mats}} for lay in float_layers]
        mx.eval(layers)
        rounded = {id(lay[f"{m}_w"]) for lay in layers for m in mats}
        mx.addmm = lambda b, x, w: float_addmm(b, round_activations(x, act) if id(w) in rounded else x, w)
        bert.layers = layers
        try:
            vecs, vq = enc.encode_passages(titles, texts), enc.encode_queries(qs)
        finally:
            mx.addmm, bert.layers = float_addmm, float_layers
        out[name] = agreement_with(top_ref, vq, vecs, ref)
        print(f"  {name:50} recall@5 {out[name]['recall@5']:.4f}  top-1 {out[name]['top1_agreement']:.3f}  "
              f"cosine min {out[name]['passage_cosine_min']:.5f}", flush=True)
    if args.output_dir:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        (args.output_dir / "results.json").write_text(json.dumps(
            {"passages": args.passages, "questions": len(qs), "schemes": out}, indent=2))


if __name__ == "__main__":
    main()
