"""Prefill and decode on AMX tiles against the VNNI kernels, side by side in one process.

Each round times, for every prompt length, a prefill with the kernels' engine set to VNNI and
one set to AMX (`set_amx`), in alternating order, then greedy decode steps both ways (decode
takes one row: the VNNI kernels run it either way, so its ratio shows only noise). Ratios are
taken per round (the machine is shared and noisy); min and median are reported. The outputs of
both engines are compared bit for bit on every prefill.

    python scripts/bench/bench_amx.py --model qwen2.5-coder-1.5b --rounds 3
    python scripts/bench/bench_amx.py --model smollm2-135m --lengths 64,256,512,1024 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads
import mlx.core as mx


def prefill_s(bb, ids):
    """(wall seconds, process CPU seconds, logits): the CPU time leaves out the time other
    processes held the cores (it counts the pool's short spins between kernels too)."""
    cache = bb.make_cache()
    t0, c0 = time.perf_counter(), time.process_time()
    logits = bb.prefill(ids, cache)
    mx.eval(logits)
    return time.perf_counter() - t0, time.process_time() - c0, logits


def decode_s(bb, ids, steps):
    cache = bb.make_cache()
    y = mx.argmax(bb.prefill(ids, cache), axis=-1)
    mx.eval(y)
    t0 = time.perf_counter()
    for _ in range(steps):
        y = mx.argmax(bb.step(y, cache), axis=-1)
        mx.eval(y)
    return (time.perf_counter() - t0) / steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="alias or .gguf path")
    ap.add_argument("--lengths", default="64,256,512,1024", help="prompt lengths, comma-separated")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    from targ_mlx.runtime.backbone import load_backbone
    from targ_mlx.runtime.native import module

    N = module()
    if N is None or not N.amx_status().startswith("on"):
        raise SystemExit(f"AMX tiles are not in use here: {N.amx_status() if N else 'no kernels'}")
    bb = load_backbone(args.model)
    lengths = [int(s) for s in args.lengths.split(",")]
    times = {(L, e): [] for L in lengths for e in ("vnni", "amx")}
    cpu = {(L, e): [] for L in lengths for e in ("vnni", "amx")}
    ratios = {L: [] for L in lengths}
    cpu_ratios = {L: [] for L in lengths}
    dec = {"vnni": [], "amx": []}
    for r in range(args.rounds + 1):  # round 0 warms up and is dropped
        for L in lengths:
            ids = [(i * 7919) % 30000 + 100 for i in range(L)]
            got = {}
            for e in (("vnni", "amx") if r % 2 else ("amx", "vnni")):
                N.set_amx(e)
                t, c, logits = prefill_s(bb, ids)
                got[e] = logits
                if r:
                    times[(L, e)].append(t)
                    cpu[(L, e)].append(c)
            if not mx.array_equal(got["vnni"], got["amx"]):
                raise SystemExit(f"AMX and VNNI logits differ at {L} tokens")
            if r:
                ratios[L].append(times[(L, "vnni")][-1] / times[(L, "amx")][-1])
                cpu_ratios[L].append(cpu[(L, "vnni")][-1] / cpu[(L, "amx")][-1])
        ids = [(i * 7919) % 30000 + 100 for i in range(32)]
        for e in ("vnni", "amx"):
            N.set_amx(e)
            s = decode_s(bb, ids, args.decode_tokens)
            if r:
                dec[e].append(s)
    N.set_amx("amx")
    print(f"model {args.model}, {args.rounds} rounds, {N.threads()} threads, AMX: {N.amx_status()}")
    print("| prompt | VNNI tok/s (best, median) | AMX tok/s (best, median) | AMX/VNNI wall per round (min, median) "
          "| AMX/VNNI process CPU time (min, median) |")
    print("|---|---|---|---|---|")
    for L in lengths:
        v, a = times[(L, "vnni")], times[(L, "amx")]
        print(f"| {L} | {L / min(v):.0f}, {L / statistics.median(v):.0f} | {L / min(a):.0f}, {L / statistics.median(a):.0f} "
              f"| {min(ratios[L]):.2f}x, {statistics.median(ratios[L]):.2f}x "
              f"| {min(cpu_ratios[L]):.2f}x, {statistics.median(cpu_ratios[L]):.2f}x |")
    dv, da = dec["vnni"], dec["amx"]
    print(f"| decode | {1 / min(dv):.1f}, {1 / statistics.median(dv):.1f} | {1 / min(da):.1f}, {1 / statistics.median(da):.1f} "
          f"| {statistics.median([x / y for x, y in zip(dv, da)]):.2f}x (median) | |")


if __name__ == "__main__":
    main()
