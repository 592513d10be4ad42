"""How much repacking a K-quant GGUF for the kernels changes the model (targ_mlx.runtime.gguf_blocks).

The reference is the float32 model dequantized by the `gguf` package. It decodes 64 greedy
tokens for each of 50 NQ-Open questions (chat prompts, batched). Each candidate (the same file
repacked as affine groups of 32, scales/biases stored in float16 or float32, then dequantized
back to float32 so that only the repacking differs) is run teacher-forced on those tokens.
Reported: greedy-token agreement (the candidate's argmax equals the reference's token) and mean
|delta logit| over all 50 x 64 positions and the whole vocabulary (reference logits kept in
float16 to halve their memory: rounding below 0.01 at logits under 20).

    python scripts/bench/bench_repack.py --model qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads: importing targ_mlx alone binds nothing (MLX's reference BLAS is ~30x slower)
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from targ_mlx import prompts
from targ_mlx.runtime import batch, gguf
from targ_mlx.runtime.backbone import ALIASES, Backbone, alias_path
from targ_mlx.runtime.tokenizer import tokenizer_from_gguf

QUESTIONS = Path(__file__).resolve().parents[3] / "shared" / "data" / "aligned" / "nq_open_dev_gold.jsonl"


def run(bb: Backbone, seqs: list[list[int]], n: int, forced: np.ndarray | None,
        keep_half: bool = False) -> tuple[np.ndarray, list]:
    """(tokens (B, n), per-step logits): greedy, or teacher-forced on `forced`."""
    logits, cache = batch.prefill_batch(bb, seqs)
    toks, outs = [], []
    for i in range(n):
        outs.append(logits.astype(mx.float16) if keep_half else logits)
        y = mx.argmax(logits, axis=-1) if forced is None else mx.array(forced[:, i])
        toks.append(y)
        logits = bb.step(y, cache)
        mx.eval(logits, y)
    return np.stack([np.array(t) for t in toks], 1), outs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="alias or .gguf path")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args(argv)
    path = alias_path(args.model) if args.model in ALIASES else args.model
    t0 = time.perf_counter()
    ref = gguf.load_gguf(path, dtype="float32")  # gguf-py's dequantization, every tensor
    tok = tokenizer_from_gguf(ref.metadata, path)
    bb = Backbone(model=ref.model, tokenizer=tok, model_id="reference", context_length=ref.context_length,
                  dtype="float32")
    with open(QUESTIONS, encoding="utf-8") as f:
        qs = [json.loads(line)["question"] for _, line in zip(range(args.prompts), f)]
    seqs = [tok.chat_ids(prompts.messages(q)) for q in qs]
    tokens, ref_logits = run(bb, seqs, args.tokens, None, keep_half=True)  # 1 GB, not 2
    print(f"reference: {len(seqs)} x {args.tokens} greedy tokens in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for name, dt in (("float16", mx.float16), ("float32", mx.float32)):
        t0 = time.perf_counter()
        gguf.SCALE_DTYPE = dt
        raw, _ = gguf.read_gguf(path, keep_blocks=True)
        flat = gguf._rename(raw)
        del raw
        for tname in [n for n in flat if n.endswith(".weight")]:  # one at a time: bounded memory
            part = {k: flat[k] for k in (tname, tname[:-6] + "scales", tname[:-6] + "biases") if k in flat}
            w = gguf.dequantize_all(part, mx.float32)[tname]
            mx.eval(w)
            bb.model.load_weights([(tname, w)], strict=False)
        del flat
        _, outs = run(bb, seqs, args.tokens, tokens)
        agree = float(np.mean([(np.array(mx.argmax(o, -1)) == tokens[:, i]).mean() for i, o in enumerate(outs)]))
        delta = float(np.mean([mx.abs(o - r).mean().item() for o, r in zip(outs, ref_logits)]))
        worst = float(max(mx.abs(o - r).max().item() for o, r in zip(outs, ref_logits)))
        rows.append((name, agree, delta, worst))
        print(f"| repacked, scales/biases {name} | {agree:.4f} | {delta:.4f} | {worst:.3f} | "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    print("\n| candidate | greedy-token agreement | mean abs delta logit | max abs delta logit |\n|---|---|---|---|")
    for name, agree, delta, worst in rows:
        print(f"| repacked, scales/biases {name} | {agree:.4f} | {delta:.4f} | {worst:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
