"""Where a prefill's time goes, op by op, on the CPU kernels.

Runs `NativeLM.hidden`'s layer loop by hand with an `mx.eval` after every kernel call (so each
is timed alone; the sum is close to the fused forward, which also evaluates op by op on the CPU),
best of `--rounds` per op, summed over the layers and grouped by what the op is: each matrix by
its stored form (Q4_K tiles, Q6_K rows, affine tiles), and the norms, RoPE, attention, SwiGLU.
Tells which part to make faster before making any of it faster (docs/archive/
benchmarks-journal.md, "Where the 1.5B's prefill goes").

    python scripts/kernels/profile_prefill.py --model qwen2.5-coder-1.5b --tokens 256
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads
import mlx.core as mx
from mlx_lm.models.cache import KVCache


def _form(w) -> str:
    from targ_mlx.runtime.native.pack import KBlocks

    if isinstance(w, KBlocks):
        return {12: "Q4_K rows", 14: "Q6_K rows"}.get(int(w.qtype), f"type {w.qtype} rows")
    s = getattr(w, "scales", None)
    if s is not None and s.dtype == mx.uint8:
        return "Q4_K tiles"
    return "Q6_K tiles" if w.bits == 6 else f"affine {w.bits}-bit tiles"


def profile(lm, tokens: mx.array, rounds: int) -> dict[str, list[float]]:
    """Seconds per op group (best round each) and multiply-adds, for one prefill of `tokens`."""
    N = lm.ops
    B, L = tokens.shape
    best: dict[tuple[int, str], float] = {}
    macs: dict[str, float] = defaultdict(float)

    def timed(key, f):
        t0 = time.perf_counter()
        out = f()
        mx.eval(out)
        dt = time.perf_counter() - t0
        best[key] = min(best.get(key, dt), dt)
        return out

    for r in range(rounds):
        cache = [KVCache() for _ in lm.layers]
        x = timed((-1, "embedding"), lambda: lm.embed.embed(N, tokens))
        pos = mx.array([0], dtype=mx.int32)
        cos, sin = N.rope_table(pos, lm.inv_freq, B, L, lm.rope_scale)
        mx.eval(cos, sin)
        for i, (layer, c) in enumerate(zip(lm.layers, cache)):

            def fused(name, parts, inp, bias):  # q|k|v or gate|up, each stored form timed apart
                outs = []
                for j, p in enumerate(parts):
                    outs.append(timed((i, f"{name}.{j}|{_form(p)}"), lambda p=p: p.linear(N, inp)))
                    if r == 0:
                        macs[_form(p)] += B * L * p.shape[0] * p.shape[1]
                y = mx.concatenate(outs, axis=-1) if len(outs) > 1 else outs[0]
                return timed((i, f"{name} concat|concat + bias"), lambda: y if bias is None else y + bias)

            xn = timed((i, "rms_norm"), lambda: N.rms_norm(x, layer.norm_in, lm.eps))
            qkv = fused("qkv", layer.qkv, xn, layer.qkv_bias)
            q, k, v = timed((i, "rope_split"), lambda: N.rope_split(qkv, cos, sin, lm.n_heads, lm.n_kv_heads,
                                                                     lm.head_dim, lm.traditional))
            keys, values = c.update_and_fetch(k, v)
            a = timed((i, "attention"), lambda: N.attention(q, keys, values, lm.scale, None, 0, tiles=True))  # a prompt's
            h = timed((i, f"o|{_form(layer.o)}"), lambda: layer.o.linear(N, a, bias=layer.o_bias, residual=x))
            hn = timed((i, "rms_norm"), lambda: N.rms_norm(h, layer.norm_post, lm.eps))
            if len(layer.gate_up) == 1 and layer.gate_up_bias is None:  # as the model runs it: SwiGLU in the product
                p = layer.gate_up[0]
                s = timed((i, f"gate_up|{_form(p)}"), lambda: p.linear(N, hn, swiglu=True))
                if r == 0:
                    macs[_form(p)] += B * L * p.shape[0] * p.shape[1]
            else:
                gu = fused("gate_up", layer.gate_up, hn, layer.gate_up_bias)
                s = timed((i, "swiglu"), lambda: N.swiglu(gu))
            x = timed((i, f"down|{_form(layer.down)}"), lambda: layer.down.linear(N, s, bias=layer.down_bias,
                                                                                   residual=h))
            if r == 0:
                for p in (layer.o, layer.down):
                    macs[_form(p)] += B * L * p.shape[0] * p.shape[1]
        hn = timed((-1, "final norm"), lambda: N.rms_norm(x, lm.norm, lm.eps))
        timed((-1, f"head (last token)|{_form(lm.head_w)}"), lambda: lm.head(hn[:, -1:]))
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (_, name), dt in best.items():
        g = name.split("|")[-1] if "|" in name and not name.startswith("head") else name
        groups[g][0] += dt
    for g, m in macs.items():
        groups[g][1] = m
    return dict(groups)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="alias or .gguf path")
    p.add_argument("--tokens", type=int, default=256, help="prompt length")
    p.add_argument("--rounds", type=int, default=3, help="best of this many prefills per op")
    args = p.parse_args(argv)

    from targ_mlx.runtime.backbone import load_backbone
    from targ_mlx.runtime.native import status

    bb = load_backbone(args.model, kernels=True)
    lm = bb.engine.lm
    print(f"kernels: {status()}; model {args.model}, {args.tokens} tokens, best of {args.rounds}")
    tokens = mx.array([[(7 * i + 11) % 30000 + 100 for i in range(args.tokens)]], dtype=mx.int32)
    groups = profile(lm, tokens, args.rounds)
    total = sum(t for t, _ in groups.values())
    print(f"sum of ops: {total * 1e3:.1f} ms = {args.tokens / total:.0f} tok/s")
    print("| op | ms | share | GMAC/s |")
    print("|---|---|---|---|")
    for g, (t, m) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        rate = f"{m / t / 1e9:.0f}" if m else ""
        print(f"| {g} | {t * 1e3:.1f} | {100 * t / total:.1f}% | {rate} |")


if __name__ == "__main__":
    main()
