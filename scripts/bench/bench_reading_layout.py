"""Does the reading prompt's layout make the model answer from the passage that holds the answer
(issue 55)? The same packed passages as an eval cell's Always branch, re-answered in other
layouts, on the questions whose read context holds an answer string (read-hit), paired against
the layout the cell recorded ("today": `prompts.messages`' "Context: ... Question: ..."):

- sandwich: the question before the context and again after it;
- instructed: today's, with "answer from the passage that is about it; other passages may be
  off-topic" before the question;
- reversed: today's with the passages in reverse rank order (the best one next to the question);
- today: the recorded layout again (it must give the recorded answers: the check that the
  passages, prompt and model are the cell's).

The passages come from the index's passages.db by the records' keys, packed again to the cell's
token budget (a record that no longer packs to its recorded passages stops the run). Answers are
scored as the eval scores them. Resumes: each layout's answers go to --out/<layout>.jsonl.

    python scripts/bench/bench_reading_layout.py results/qwen2.5-coder-1.5b/large-hybrid/nq_open \\
        --index index/large-bm25 --n 120 --layouts sandwich instructed reversed
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from datetime import date
from pathlib import Path

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

import numpy as np  # noqa: E402

from targ_mlx import pipeline, prompts  # noqa: E402
from targ_mlx.eval.metrics import bootstrap_ci, score_all  # noqa: E402
from targ_mlx.matching import contains  # noqa: E402
from targ_mlx.retrieval import Passage  # noqa: E402
from targ_mlx.runtime import batch  # noqa: E402
from targ_mlx.runtime.backbone import load_backbone  # noqa: E402

OFF_TOPIC = "Answer the question from the passage that is about it; other passages may be off-topic."
LAYOUTS = ("today", "sandwich", "instructed", "reversed")


def user_turn(question: str, lines: list[str], layout: str) -> str:
    context = "\n".join(lines[::-1] if layout == "reversed" else lines)
    if layout == "sandwich":
        return f"Question: {question}\n\nContext:\n{context}\n\nQuestion: {question}"
    if layout == "instructed":
        return f"Context:\n{context}\n\n{OFF_TOPIC}\nQuestion: {question}"
    return f"Context:\n{context}\n\nQuestion: {question}"


def chat(question: str, packed: prompts.PackedContext, layout: str, style: str) -> list[dict]:
    """`prompts.messages` with the user turn laid out otherwise (the system turn and examples kept)."""
    msgs = prompts.messages(question, packed.text, style)
    return msgs[:-1] + [{"role": "user", "content": user_turn(question, [p.format() for p in packed.passages], layout)}]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cell", type=Path, help="an eval cell folder (records.jsonl, config.json)")
    ap.add_argument("--index", required=True, type=Path, help="an index holding the recorded passages")
    ap.add_argument("--n", type=int, default=120, help="read-hit questions, in the cell's order")
    ap.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS[1:]))
    ap.add_argument("--out", type=Path, default=Path("runs/reading_layout"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    cfg = json.loads((args.cell / "config.json").read_text())
    budget, cap, style = int(cfg["settings"]["context_tokens"]), int(cfg["settings"]["max_tokens"]), cfg["settings"]["prompt_style"]
    bb = load_backbone(cfg["model"])
    tok = bb.tokenizer
    db = sqlite3.connect(f"file:{args.index / 'passages.db'}?mode=ro", uri=True)
    picked = []
    for line in open(args.cell / "records.jsonl", encoding="utf-8"):
        r = json.loads(line)
        hits = [Passage(k, *db.execute("SELECT title, text FROM passages WHERE key = ?", (k,)).fetchone(), 0.0)
                for k, *_ in r["always"]["passages"]]
        packed = prompts.pack_context(hits, budget, tok.encode, tok.decode)
        if [p.key for p in packed.passages] != [p[0] for p in r["always"]["passages"]]:
            sys.exit(f"{r['id']}: its passages no longer pack to the recorded ones at {budget} tokens")
        if contains(packed.text, r["answers"]):
            picked.append((r, packed))
        if len(picked) == args.n:
            break
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"date": str(date.today()), "cell": str(args.cell), "model": cfg["model"], "n": len(picked), "layouts": {}}
    for layout in args.layouts:
        path = args.out / f"{args.cell.parent.name}-{args.cell.name}-{layout}.jsonl"
        done = {json.loads(x)["id"] for x in open(path)} if path.exists() else set()
        todo = [(r, p) for r, p in picked if r["id"] not in done]
        for i in range(0, len(todo), 8):
            part = todo[i: i + 8]
            dec = batch.greedy_batch(bb, [tok.chat_ids(chat(r["question"].strip(), p, layout, style)) for r, p in part], cap)
            with open(path, "a", encoding="utf-8") as f:
                for (r, _), toks in zip(part, dec.tokens):
                    ans, _ = pipeline.answer_text(bb, toks, cap)
                    f.write(json.dumps({"id": r["id"], "answer": ans, "acc": score_all(ans, r["answers"])["acc"],
                                        "recorded": r["always"]["answer"], "recorded_acc": r["always"]["acc"]}) + "\n")
        rows = [json.loads(x) for x in open(path)]
        est, lo, hi = bootstrap_ci(np.array([x["acc"] - x["recorded_acc"] for x in rows]), n=2000)
        result["layouts"][layout] = {"n": len(rows), "right": round(float(np.mean([x["acc"] for x in rows])), 4),
                                     "recorded_right": round(float(np.mean([x["recorded_acc"] for x in rows])), 4),
                                     "minus_recorded": [round(est, 4), round(lo, 4), round(hi, 4)],
                                     "same_answer": sum(x["answer"] == x["recorded"] for x in rows)}
        print(layout, json.dumps(result["layouts"][layout]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
