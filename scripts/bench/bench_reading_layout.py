"""Does the reading prompt's layout make the model answer from the passage that holds the answer
(issue 55)? The same packed passages as an eval cell's Always branch, re-answered in other
layouts, on the questions whose read context holds an answer string (read-hit), paired against
the layout the cell recorded ("today": `prompts.messages`' "Context: ... Question: ..."):

- sandwich: the question before the context and again after it;
- instructed: today's, with "answer from the passage that is about it; other passages may be
  off-topic" before the question;
- reversed: today's with the passages in reverse rank order (the best one next to the question);
- today: the recorded layout again (it must give the recorded answers: the check that the
  passages, prompt and model are the cell's);
- shown: today's, after two reading examples (a context of two passages, one off-topic, and the
  short answer the on-topic one gives) in place of the closed-book examples' last turns;
- quote: the same examples answered as "Evidence: <the sentence that answers>\nAnswer: <short>": the
  model copies the sentence it answers from before it answers (decoded 64 tokens longer);
- contrast: today's layout decoded context-aware (Shi et al. 2023, CAD): each greedy token maximises
  (1 + a) log p(y | context, q) - a log p(y | q), the closed-book prompt run beside it as a second
  row, among the tokens whose p(y | context, q) is at least b times the best one's (`--alpha`,
  `--beta`): the model's prior is subtracted where the passage says otherwise.

The passages come from the index's passages.db by the records' keys, packed again to the cell's
token budget (a record that no longer packs to its recorded passages stops the run). Answers are
scored as the eval scores them. Resumes: each layout's answers go to --out/<layout>.jsonl.

    python scripts/bench/bench_reading_layout.py results/qwen2.5-coder-1.5b/large-hybrid/nq_open \\
        --index index/large-bm25 --n 120 --layouts sandwich instructed reversed
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

import numpy as np  # noqa: E402

from targ_mlx import pipeline, prompts  # noqa: E402
from targ_mlx.eval.metrics import bootstrap_ci, score_all  # noqa: E402
from targ_mlx.eval.record import passage_lookup, recorded_context  # noqa: E402
from targ_mlx.matching import contains  # noqa: E402
from targ_mlx.runtime import batch  # noqa: E402
from targ_mlx.runtime.backbone import load_backbone  # noqa: E402

OFF_TOPIC = "Answer the question from the passage that is about it; other passages may be off-topic."
LAYOUTS = ("today", "sandwich", "instructed", "reversed", "shown", "quote", "contrast")
# reading examples: the answer is in one passage, the other offers a near-miss of the same kind
# (none of these subjects is asked in shared/data/qa)
READ_EXAMPLES = (
    ("[Sydney Harbour Bridge] The Sydney Harbour Bridge is a steel arch bridge across Sydney Harbour. "
     "It was designed by John Bradfield and opened in 1932.\n[Sydney Opera House] The Sydney Opera House "
     "is a performing arts centre on Sydney Harbour. It was designed by the Danish architect Jorn Utzon "
     "and opened in 1973.", "who designed the sydney opera house",
     "It was designed by the Danish architect Jorn Utzon and opened in 1973.", "Jorn Utzon"),
    ("[Corinth Canal] The Corinth Canal connects the Gulf of Corinth with the Saronic Gulf. It was "
     "completed in 1893.\n[Suez Canal] The Suez Canal is a sea-level waterway connecting the Mediterranean "
     "Sea to the Red Sea. After ten years of construction, it was opened on 17 November 1869.",
     "when was the suez canal opened",
     "After ten years of construction, it was opened on 17 November 1869.", "17 November 1869"),
)
QUOTE_SYSTEM = ("You are a helpful assistant. Answer from the context. First copy the one sentence of the "
                "context that answers the question after 'Evidence:', then give a short answer only (a name, "
                "date, number or short phrase) after 'Answer:'.")
QUOTE_EXTRA = 64


def user_turn(question: str, lines: list[str], layout: str) -> str:
    context = "\n".join(lines[::-1] if layout == "reversed" else lines)
    if layout == "sandwich":
        return f"Question: {question}\n\nContext:\n{context}\n\nQuestion: {question}"
    if layout == "instructed":
        return f"Context:\n{context}\n\n{OFF_TOPIC}\nQuestion: {question}"
    return f"Context:\n{context}\n\nQuestion: {question}"


def reading_examples(quote: bool) -> list[dict]:
    out = []
    for ctx, q, sentence, a in READ_EXAMPLES:
        out += [{"role": "user", "content": f"Context:\n{ctx}\n\nQuestion: {q}"},
                {"role": "assistant", "content": f"Evidence: {sentence}\nAnswer: {a}" if quote else a}]
    return out


def quoted_answer(text: str) -> str:
    """The answer after the last 'Answer:' (the whole text where the model wrote none)."""
    return text.rsplit("Answer:", 1)[-1].strip() if "Answer:" in text else text.strip()


def chat(question: str, packed: prompts.PackedContext, layout: str, style: str) -> list[dict]:
    """`prompts.messages` with the user turn laid out otherwise (the system turn and examples kept)."""
    msgs = prompts.messages(question, packed.text, style)
    if layout == "shown":
        msgs = msgs[:1] + msgs[1:-1][:-4] + reading_examples(False) + msgs[-1:]
    elif layout == "quote":
        msgs = [{"role": "system", "content": QUOTE_SYSTEM}] + reading_examples(True) + msgs[-1:]
    return msgs[:-1] + [{"role": "user", "content": user_turn(question, [p.format() for p in packed.passages], layout)}]


def contrast_batch(bb, with_ctx: list[list[int]], closed: list[list[int]], cap: int, alpha: float,
                   beta: float) -> list[list[int]]:
    """Greedy context-aware decoding of B questions: rows 0..B-1 read the context, rows B..2B-1 the
    closed-book prompt; both rows of a question are fed the token chosen from their contrast. The
    two prompts are prefilled apart (padding the short one to the long one's width would double
    the prefill)."""
    import mlx.core as mx
    b = len(with_ctx)
    ctx_logits, ctx_cache = batch.prefill_batch(bb, with_ctx)
    cb_logits, cb_cache = batch.prefill_batch(bb, closed)
    eos = bb.tokenizer.eos_ids
    out: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    for t in range(cap):
        ctx = ctx_logits - mx.logsumexp(ctx_logits, axis=-1, keepdims=True)
        cb = cb_logits - mx.logsumexp(cb_logits, axis=-1, keepdims=True)
        score = (1 + alpha) * ctx - alpha * cb
        plausible = ctx >= (mx.max(ctx, axis=-1, keepdims=True) + float(np.log(beta)))
        y = mx.argmax(mx.where(plausible, score, -mx.inf), axis=-1).astype(mx.int32)
        ys = y.tolist()
        for i, tok in enumerate(ys):
            if not done[i]:
                out[i].append(tok)
                done[i] = tok in eos
        if all(done):
            break
        ctx_logits, cb_logits = bb.step(y, ctx_cache), bb.step(y, cb_cache)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cell", type=Path, help="an eval cell folder (records.jsonl, config.json)")
    ap.add_argument("--index", required=True, type=Path, help="an index holding the recorded passages")
    ap.add_argument("--n", type=int, default=120, help="read-hit questions, in the cell's order")
    ap.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS[1:]))
    ap.add_argument("--out", type=Path, default=Path("runs/reading_layout"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--all", action="store_true", help="every question in the cell's order, not only read-hit ones")
    ap.add_argument("--alpha", type=float, default=0.5, help="contrast: the closed-book prior's weight")
    ap.add_argument("--beta", type=float, default=0.1, help="contrast: tokens below this share of the best are not chosen")
    args = ap.parse_args(argv)
    cfg = json.loads((args.cell / "config.json").read_text())
    budget, cap, style = int(cfg["settings"]["context_tokens"]), int(cfg["settings"]["max_tokens"]), cfg["settings"]["prompt_style"]
    bb = load_backbone(cfg["model"])
    tok = bb.tokenizer
    lookup = passage_lookup(args.index)
    picked = []
    for line in open(args.cell / "records.jsonl", encoding="utf-8"):
        r = json.loads(line)
        try:
            packed = recorded_context(r, lookup, tok, budget)
        except (LookupError, ValueError) as e:
            sys.exit(f"{args.cell}: {e}; pass the --index the cell was recorded over")
        if args.all or contains(packed.text, r["answers"]):
            picked.append((r, packed))
        if len(picked) == args.n:
            break
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"date": str(date.today()), "cell": str(args.cell), "model": cfg["model"], "n": len(picked), "layouts": {}}
    for layout in args.layouts:
        tag = f"{layout}-a{args.alpha:g}-b{args.beta:g}" if layout == "contrast" else layout
        path = args.out / f"{args.cell.parent.name}-{args.cell.name}-{tag}{'-all' if args.all else ''}.jsonl"
        done = {json.loads(x)["id"] for x in open(path)} if path.exists() else set()
        todo = [(r, p) for r, p in picked if r["id"] not in done]
        n_new = cap + (QUOTE_EXTRA if layout == "quote" else 0)  # tokens decoded a question
        for i in range(0, len(todo), 8):
            part = todo[i: i + 8]
            seqs = [tok.chat_ids(chat(r["question"].strip(), p, layout, style)) for r, p in part]
            if layout == "contrast":
                closed = [tok.chat_ids(prompts.messages(r["question"].strip(), None, style)) for r, _ in part]
                decoded = contrast_batch(bb, seqs, closed, cap, args.alpha, args.beta)
            else:
                decoded = batch.greedy_batch(bb, seqs, n_new).tokens
            with open(path, "a", encoding="utf-8") as f:
                for (r, _), toks in zip(part, decoded):
                    ans, _ = pipeline.answer_text(bb, toks, n_new)
                    ans = quoted_answer(ans) if layout == "quote" else ans
                    f.write(json.dumps({"id": r["id"], "answer": ans, "acc": score_all(ans, r["answers"])["acc"],
                                        "recorded": r["always"]["answer"], "recorded_acc": r["always"]["acc"]}) + "\n")
        rows = [json.loads(x) for x in open(path)]
        est, lo, hi = bootstrap_ci(np.array([x["acc"] - x["recorded_acc"] for x in rows]), n=2000)
        result["layouts"][tag] = {"n": len(rows), "right": round(float(np.mean([x["acc"] for x in rows])), 4),
                                     "recorded_right": round(float(np.mean([x["recorded_acc"] for x in rows])), 4),
                                     "minus_recorded": [round(est, 4), round(lo, 4), round(hi, 4)],
                                     "same_answer": sum(x["answer"] == x["recorded"] for x in rows)}
        print(tag, json.dumps(result["layouts"][tag]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
