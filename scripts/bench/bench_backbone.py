"""Backbone speed: MLX (this project's loader) vs llama.cpp on the same GGUF, side by side.

Each round times, back to back on the same prompt: MLX prefill, MLX greedy decode, llama.cpp
prefill, llama.cpp greedy decode; each MLX run is bracketed by two llama.cpp runs and ratios
are taken per round (the machine is shared and noisy), medians reported. Variants:

    kernels         the default on CPU: the GGUF's own 4/8-bit weights on targ_mlx.runtime.native
    kernels-batch6  the same, 6 rows decoded together (the variance gate's draft)
    kernels-tiles   the kernels with every K-quant matrix repacked into 16-column tiles
                    (TARG_MLX_KQUANT=repacked), to compare with the blocks read as stored
    kernels-4k      the kernels with their weights kept on 4 KB pages (a second copy), against
                    `kernels` on 2 MB pages (--huge-pages; targ_mlx/runtime/native/pages.py)
    mlx-fp32        mlx-lm's own layers, weights dequantized to float32, OpenBLAS (no kernels)
    mlx-q4          mlx-lm's own quantized layers (MLX's CPU quantized matmul; no kernels)

    python scripts/bench/bench_backbone.py --rounds 5 --output-dir runs/bench_backbone

llama.cpp runs through llama-cpp-python, or with --llama-bench PATH through llama.cpp's own
llama-bench binary, one call per round (its pp at depth 0 and tg at the prompt's depth, as here:
where the Python binding crashed, on the lent Intel machine).

llama.cpp either uses the file's weights as mapped or repacks them (its default: CPU_REPACK, AMX
tiles where the CPU has them), and which is faster depends on the CPU and the block type (on a
Zen 4 repacking made the 1.5B's prefill slower and its decode faster), so `--llama-buffers both`
times it both ways in the same rounds, each bracketing every MLX run; `mapped` is the default
(repacking crashed in one VM that hid AMX tile state).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads
import mlx.core as mx
import numpy as np

from targ_mlx.runtime import native
from targ_mlx.runtime.native import pages
from targ_mlx._blas import BLAS_STATUS
from targ_mlx.runtime.backbone import alias_path, load_backbone

TEXT = ("The history of the Roman Empire covers the history of ancient Rome from the fall of the Roman "
        "Republic in 27 BC until the abdication of Romulus Augustulus in AD 476 in the West. ") * 40


def mlx_round(bb, prompt, n_decode, batch=1):
    cache = bb.make_cache()
    t0 = time.perf_counter()
    logits = bb.prefill(prompt, cache)
    mx.eval(logits)
    t1 = time.perf_counter()
    if batch > 1:  # as the variance draft does: rows share the prompt's keys on the kernels
        cache = bb.engine.share_rows(cache, [0] * batch)
        logits = mx.repeat(logits, batch, axis=0)
    y = mx.argmax(logits, axis=-1)
    mx.async_eval(y)
    for _ in range(n_decode):  # pipelined as in targ_mlx.runtime.draft: schedule, then read back
        nxt = mx.argmax(bb.step(y, cache), axis=-1)
        mx.async_eval(nxt)
        y.tolist()
        y = nxt
    y.tolist()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def llama_round(llm, prompt, n_decode):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    for _ in range(n_decode):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        llm.eval([tok])
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


class LlamaBench:
    """llama.cpp's llama-bench as the peer: per round one run of a prompt-sized prefill (pp, depth
    0) and of greedy decode steps after the prompt (tg, depth = the prompt), its own timings."""

    def __init__(self, exe, model, threads, repack):
        self.cmd = [exe, "-m", model, "-t", str(threads), "-r", "1", "-o", "jsonl", "--repack", str(int(repack))]

    def round(self, prompt, n_decode):
        n = len(prompt)
        out = subprocess.run(self.cmd + ["-p", str(n), "-n", str(n_decode), "-d", f"0,{n}"],
                             capture_output=True, text=True, check=True).stdout
        tests = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        pp = next(t for t in tests if t["n_prompt"] == n and t["n_gen"] == 0 and t["n_depth"] == 0)
        tg = next(t for t in tests if t["n_gen"] == n_decode and t["n_prompt"] == 0 and t["n_depth"] == n)
        return pp["avg_ns"] / 1e9, tg["avg_ns"] / 1e9


def llama_params(repack: bool):
    """Make the next Llama() repack its weights (llama.cpp's default: extra buffer types, CPU_REPACK
    and AMX where the CPU reports it) or use them as mapped from the file. Repacking for AMX
    segfaulted in one VM that did not grant AMX tile state (even built with GGML_AMX_*=OFF); it
    ran on a Zen 4 and on an Intel Xeon with AMX, where the two differ (BENCHMARKS.md, rows
    "kernels vs llama.cpp")."""
    import llama_cpp

    default = getattr(llama_cpp, "_targ_default_params", llama_cpp.llama_model_default_params)
    llama_cpp._targ_default_params = default

    def params():
        p = default()
        p.use_extra_bufts = repack
        return p

    # Llama() reads the defaults when it loads the model: set them before each load
    llama_cpp.llama_model_default_params = params
    llama_cpp.llama.llama_cpp.llama_model_default_params = params


def roofline(bb, path):
    """Decode at batch 1 streams every weight once per token: bytes/token over memory bandwidth
    bounds tokens/s. Bandwidth is measured here with a numpy reduction over 512 MB."""
    big = np.ones(128 * 1024 * 1024, dtype=np.float32)
    big.sum()
    t0 = time.perf_counter()
    for _ in range(5):
        big.sum()
    bw = 5 * big.nbytes / (time.perf_counter() - t0)
    mlx_bytes = bb.engine.nbytes
    gguf_bytes = os.path.getsize(path)
    return {"bandwidth_GB_s": bw / 1e9, "kernel_weight_bytes": mlx_bytes, "gguf_weight_bytes": gguf_bytes,
            "kernels_decode_bound_tok_s": bw / mlx_bytes, "llama_decode_bound_tok_s": bw / gguf_bytes}


def main(argv=None):
    faulthandler.enable()  # a segfault in llama.cpp or the kernels prints the Python stack, where it can
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="alias or .gguf path (default smollm2-135m)")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads for both sides: llama.cpp's and the kernels' (TARG_MLX_THREADS, unless set)")
    ap.add_argument("--variants", default="kernels,kernels-batch6,mlx-fp32",
                    help="comma list of kernels | kernels-batch6 | kernels-tiles | kernels-4k | mlx-fp32 | mlx-q4 "
                         "(kernels-4k: a second copy of the weights kept on 4 KB pages)")
    ap.add_argument("--huge-pages", choices=("collapse", "advise", "off"), default="collapse",
                    help="the kernels' weights on 2 MB pages now (default: as the eval, server and chat load "
                         "them), when the kernel gets to it (advise: as `targ ask` loads them), or never")
    ap.add_argument("--llama-buffers", choices=("mapped", "repacked", "both"), default="mapped",
                    help="llama.cpp's weights as mapped (default), repacked as llama.cpp does by default "
                         "(CPU_REPACK, AMX where the CPU has it), or both in the same rounds")
    ap.add_argument("--extra-bufts", action="store_const", const="repacked", dest="llama_buffers",
                    help="the same as --llama-buffers repacked")
    ap.add_argument("--llama-bench", metavar="PATH",
                    help="time llama.cpp with this llama-bench binary instead of llama-cpp-python")
    ap.add_argument("--output-dir", default="runs/bench_backbone")
    args = ap.parse_args(argv)
    # the kernels read it when they first run; without it, --threads 1 timed one llama.cpp thread
    # against the kernels' two
    os.environ.setdefault("TARG_MLX_THREADS", str(args.threads))
    if args.llama_bench is None:
        try:
            from llama_cpp import Llama
        except ImportError:
            sys.exit("llama-cpp-python is not installed: pip install -e '.[bench]' (builds llama.cpp from source, "
                     "~7 min), or give --llama-bench PATH")
    elif not os.access(args.llama_bench, os.X_OK):
        sys.exit(f"--llama-bench {args.llama_bench}: not an executable file (build llama.cpp's llama-bench target)")
    path = alias_path(args.model) if not args.model.endswith(".gguf") else args.model
    variants = args.variants.split(",")
    if native.module() is None:
        sys.exit(f"the CPU kernels are unavailable: {native.status()}")
    models = {"kernels": load_backbone(args.model, kernels=True, huge_pages=args.huge_pages)}  # by name
    if "kernels-4k" in variants:
        models["kernels-4k"] = load_backbone(args.model, kernels=True, huge_pages="off")
    if "kernels-tiles" in variants:
        before = os.environ.get("TARG_MLX_KQUANT")
        os.environ["TARG_MLX_KQUANT"] = "repacked"  # read when the model loads
        models["kernels-tiles"] = load_backbone(args.model, kernels=True)
        if before is None:
            del os.environ["TARG_MLX_KQUANT"]
        else:
            os.environ["TARG_MLX_KQUANT"] = before
    if "mlx-fp32" in variants:
        models["mlx-fp32"] = load_backbone(args.model, dtype="float32", kernels=False)
    if "mlx-q4" in variants:
        models["mlx-q4"] = load_backbone(args.model, dtype="quantized", kernels=False)
    buffers = ("mapped", "repacked") if args.llama_buffers == "both" else (args.llama_buffers,)
    peers = {}
    for b in buffers:
        if args.llama_bench:
            peers[b] = LlamaBench(args.llama_bench, path, args.threads, b == "repacked").round
            continue
        llama_params(b == "repacked")
        # llama-cpp-python keeps n_batch rows of logits, which llama_round indexes by position: a
        # prompt over 512 tokens needs n_batch up to the context (llama.cpp still computes in
        # micro-batches of 512, n_ubatch's default)
        n_ctx = max(2048, args.prompt_tokens + args.decode_tokens + 8)
        llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=512 if args.prompt_tokens + args.decode_tokens <= 512 else n_ctx,
                    n_threads=args.threads, verbose=False)
        peers[b] = lambda prompt, n, llm=llm: llama_round(llm, prompt, n)
    prompt = models["kernels"].tokenizer.encode(TEXT)[: args.prompt_tokens]
    rows = {(v, b): [] for v in variants for b in buffers}
    for r in range(args.rounds + 1):  # round 0 warms caches and is dropped
        ref = {b: timed(prompt, args.decode_tokens) for b, timed in peers.items()}
        for v in variants:
            bb = models[v if v in models else "kernels"]
            batch = 6 if v.endswith("batch6") else 1
            got = mlx_round(bb, prompt, args.decode_tokens, batch)
            ref2 = {b: timed(prompt, args.decode_tokens) for b, timed in peers.items()}  # bracket each MLX run
            for b in buffers:
                lp = (ref[b][0] + ref2[b][0]) / 2
                ld = (ref[b][1] + ref2[b][1]) / 2
                print(f"round {r} {v}: MLX prefill {got[0]:.2f}s decode {got[1]:.2f}s | llama.cpp ({b}) prefill "
                      f"{lp:.2f}s decode {ld:.2f}s", flush=True)
                if r > 0:
                    rows[v, b].append({"mlx_prefill_s": got[0], "mlx_decode_s": got[1], "llama_prefill_s": lp,
                                       "llama_decode_s": ld, "prefill_ratio": lp / got[0],
                                       "decode_ratio": ld / got[1] * batch})
            ref = ref2
    summary = {}
    for (v, b), rs in rows.items():
        med = lambda k: statistics.median(x[k] for x in rs)  # noqa: E731
        summary[v if len(buffers) == 1 else f"{v} vs {b}"] = {
            "mlx_prefill_tok_s": args.prompt_tokens / med("mlx_prefill_s"),
            "mlx_decode_tok_s": args.decode_tokens * (6 if v.endswith("batch6") else 1) / med("mlx_decode_s"),
            "llama_prefill_tok_s": args.prompt_tokens / med("llama_prefill_s"),
            "llama_decode_tok_s": args.decode_tokens / med("llama_decode_s"),
            "prefill_ratio": med("prefill_ratio"),
            "decode_ratio": med("decode_ratio"),
        }
    summary["roofline"] = roofline(models["kernels"], path)
    meta = {"llama_cpp_buffers": list(buffers), "llama_cpp": "llama-bench" if args.llama_bench else "llama-cpp-python", "date": str(date.today()), "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.platform()}",
            "blas": BLAS_STATUS, "kernels": native.status(), "model": path, "prompt_tokens": args.prompt_tokens,
            "decode_tokens": args.decode_tokens, "rounds": args.rounds, "load_avg": os.getloadavg(),
            "huge_pages": {"mode": args.huge_pages, "weights_bytes": models["kernels"].info.get("huge_pages", 0),
                           "anon_huge_bytes": pages.anon_huge_bytes()}}
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "bench_backbone.json"), "w") as f:
        json.dump({"meta": meta, "summary": summary, "rounds": {f"{v} vs {b}": rs for (v, b), rs in rows.items()}}, f, indent=2)
    print(json.dumps(meta))
    print(f"{'variant':22} {'MLX prefill':>12} {'llama prefill':>14} {'ratio':>6} {'MLX decode':>11} {'llama decode':>13} {'ratio':>6}")
    print("roofline (batch-1 decode is memory-bound):", json.dumps(summary["roofline"]))
    for v, s in summary.items():
        if v == "roofline":
            continue
        print(f"{v:22} {s['mlx_prefill_tok_s']:10.0f}/s {s['llama_prefill_tok_s']:12.0f}/s {s['prefill_ratio']:6.2f} "
              f"{s['mlx_decode_tok_s']:9.1f}/s {s['llama_decode_tok_s']:11.1f}/s {s['decode_ratio']:6.2f}")


if __name__ == "__main__":
    main()
