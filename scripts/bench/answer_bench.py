"""What the answer benches share (bench_reader_latency, bench_overlap, bench_lookup, bench_app_path):
their flags, the held-out questions they ask (NQ-Open dev from question 500 on, past the eval's
500), the model, index and assistant they open as the apps do, and one JSON result printed and kept."""

from __future__ import annotations

import argparse
import json
import os
import platform
from datetime import date

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "qa", "nq_open_dev.jsonl")


def parser(description: str, n: int) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--index", required=True)
    ap.add_argument("--retriever", default=None)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--data-file", default=DATA)
    ap.add_argument("--n", type=int, default=n)
    ap.add_argument("--offset", type=int, default=500, help="first question (past the eval's 500)")
    ap.add_argument("--json")
    return ap


def questions(args) -> list[str]:
    with open(args.data_file) as f:
        return [json.loads(line)["question"] for line in f][args.offset: args.offset + args.n]


def open_parts(args):
    """The backbone and the index's retriever (encoder loaded), as the apps open them."""
    from targ_mlx.index import load_encoders, open_indexes
    from targ_mlx.runtime.backbone import load_backbone

    return load_backbone(args.model), load_encoders(open_indexes([args.index], retriever=args.retriever))


def apps_assistant(args, questions: list[str]):
    """The assistant as the apps make it (`Settings.from_config`; the gate --gate names, where the
    script has one), over `open_parts`, warmed up on the first question (weights touched, graphs
    built, encoder loaded)."""
    from targ_mlx.assistant import Assistant, Settings
    from targ_mlx.config import Config

    bb, r = open_parts(args)
    flags = {"gate": args.gate} if getattr(args, "gate", None) else {}
    ask = Assistant(bb, r, Settings.from_config(Config(), bb.model_id, **flags))
    ask.answer(questions[0])
    return ask


def report(args, n: int, **figures) -> dict:
    """The result with its date, machine, model and index: printed, and written to --json."""
    out = {"date": str(date.today()), "machine": platform.processor() or platform.machine(), "model": args.model,
           "index": args.index, "n": n, **figures}
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out
