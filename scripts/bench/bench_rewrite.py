"""Standalone retrieval queries for follow-ups, judged on TREC CAsT against the manual rewrites.

For every turn with earlier turns, the index is searched with the organisers' manual rewrite
(the reference) and with each way of forming the query; a way is as good as the passages it
shares with the reference's top 5:
  overlap@5   |top5(query) & top5(rewrite)| / 5
  recall@20   |top20(query) & top5(rewrite)| / 5
Ways: `none` (the question as asked), `questions-1/2/all` (that many earlier questions + the
question: `conversation.questions_query`), `answer` / `questions-1+answer` / `questions-all+answer`
(that many earlier questions + what the previous answer says beyond its question + the question:
`conversation.answer_query`), `answer-whole` (the previous answer as given + the question),
`fused-equal` (questions-all and answer-whole, each searched, rankings fused by
reciprocal rank: `retrieval.fuse`), `fused` (the default: the question as asked beside those two,
weighted by how much the question leans on the earlier turns: `conversation.fused_forms`),
`model` (the backbone rewrites it: `conversation.model_rewrite`, one short greedy generation, timed).

Topic switches: every turn with earlier turns is also asked with the first question of the next
conversation in its place (a new topic, standalone by construction); a way keeps the switched
question's own search when its top 5 overlaps the question's standalone top 5 (switch@5) and when 2
of the standalone top 3 are in its top 3 (switch 2/3).

`--tune` picks `fused`'s weights on the even-numbered conversations (recall@20 on CAsT, switch@5
on the switches, their mean) from a small grid and reports the pick on the odd-numbered ones.

CAsT gives the earlier questions but not the answers, so the assistant's own are generated: every
question of a conversation is answered once, in order, as the chat app answers it with the gate
`never` (closed-book `Assistant.answer`: greedy, <= 32 tokens, after the earlier turns with their
generated answers). They are cached in `--answers` (JSONL, one row per conversation turn), so a
second run reuses them. The model also rewrites a seeded sample (`--model-limit`; 0 skips it),
on which every way is scored too.

`--example Q1 Q2` answers Q1 with retrieval (gate `always`, the real `Assistant`) and prints, for
Q2 after it, each way's query and top-5 titles, and what the assistant itself searches with the
default way.

    python scripts/bench/bench_rewrite.py --index index/vital-articles-minilm --model-limit 0
    python scripts/bench/bench_rewrite.py --index index/vital-articles-minilm --model-limit 0 \
        --example "who painted the mona lisa" "when was he born?"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import time
from datetime import date

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

from targ_mlx.conversation import (ASKED_WEIGHT, CONTEXT_WEIGHT, SearchForm, Turn, answer_query, fused_forms,
                                   model_rewrite, questions_query)
from targ_mlx.retrieval import FUSE_DEPTH, fuse

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "conv", "trec_cast_2019_2020.jsonl")
CHEAP = {"none": 0, "questions-1": 1, "questions-2": 2, "questions-all": None}  # earlier questions kept
WITH_ANSWER = {"answer": 0, "questions-1+answer": 1, "questions-all+answer": None}  # ... + the last answer
WAYS = {name: (questions_query, kept) for name, kept in CHEAP.items()} | {
    name: (answer_query, kept) for name, kept in WITH_ANSWER.items()}


WAYS["answer-whole"] = (lambda question, history, kept: answer_query(question, history, whole=True), None)
# the default before the question as asked joined it: questions-all and answer-whole, equal weights
WAYS["fused-equal"] = (lambda question, history, kept: [SearchForm(questions_query(question, history)),
                                                        SearchForm(answer_query(question, history, whole=True))],
                       None)
WAYS["fused"] = (lambda question, history, kept: fused_forms(question, history), None)  # the default
GRID = [((1.0, a), (c, 1.0)) for a in (0.0, 0.25, 0.5) for c in (0.1, 0.25, 0.5)]


def cheap_queries(question: str, history: list[Turn]) -> dict[str, str | list[str]]:
    """Every cheap way's query for `question` after `history` (turns with answers)."""
    return {name: form(question, history, kept) for name, (form, kept) in WAYS.items()}


def generated_answers(turns: list[dict], assistant, path: str) -> dict[str, str]:
    """The assistant's closed-book answer to every question that has a later turn, by turn id;
    answered in conversation order after the earlier turns (as the chat app does), cached in `path`."""
    done: dict[str, str] = {}
    if os.path.exists(path):
        with open(path) as f:
            done = {r["id"]: r["answer"] for r in map(json.loads, f)}
    by_conv: dict[str, list[dict]] = {}
    for t in turns:
        by_conv.setdefault(t["conversation"], []).append(t)
    todo = sum(1 for rows in by_conv.values() for t in rows[:-1] if t["id"] not in done)
    t0, n = time.perf_counter(), 0
    with open(path, "a") as f:
        for rows in by_conv.values():
            history: list[Turn] = []
            for t in rows[:-1]:  # the last question of a conversation has no follow-up
                if t["id"] not in done:
                    done[t["id"]] = assistant.answer(t["question"], history=history).answer
                    f.write(json.dumps({"id": t["id"], "question": t["question"], "answer": done[t["id"]]}) + "\n")
                    f.flush()
                    n += 1
                    if n % 50 == 0:
                        print(f"answered {n}/{todo} ({time.perf_counter() - t0:.0f} s)", flush=True)
                history.append(Turn(t["question"], done[t["id"]]))
    return done


def example(assistant, retriever, first: str, follow: str) -> dict:
    """`first` answered with retrieval, then each way's query for `follow` and its top-5 titles."""
    a1 = assistant.answer(first, gate="always")
    history = [Turn(a1.question, a1.answer)]
    a2 = assistant.answer(follow, history=history, gate="always")
    ways = {name: {"query": q, "top5": [p.title for p in search(retriever, [q], 5)[0]]}
            for name, q in cheap_queries(follow, history).items()}
    return {"first": first, "answer": a1.answer, "first_top5": [p.title for p in a1.passages],
            "follow": follow, "assistant_query": a2.search_query, "assistant_top5": [p.title for p in a2.passages],
            "assistant_answer": a2.answer, "ways": ways}


def overlap(found: list, reference: list, k: int) -> float:
    ref = {p.key for p in reference[:5]}
    return len(ref & {p.key for p in found[:k]}) / max(1, len(ref))


def search(retriever, qs: list, top: int) -> list[list]:
    """Top `top` per entry: a query string searched as it is, or a list of queries fused as
    `retrieval.search_fused` fuses them, with every query of every entry encoded in one batch
    (searched one entry at a time, the run did not finish in 5 min beside a test run)."""
    if all(isinstance(q, str) for q in qs):
        return retriever.search_batch(qs, top)
    groups = [[f if isinstance(f, SearchForm) else SearchForm(f) for f in group] for group in qs]
    found = iter(retriever.search_batch([f.query for group in groups for f in group], max(top, FUSE_DEPTH)))
    return [fuse([next(found) for _ in group], top, weights=[f.weight for f in group]) for group in groups]


def score(turns: list[dict], queries: dict[str, list], retriever, top: int = 20) -> dict[str, dict]:
    """overlap@5 and recall@20 of every way's queries against the manual rewrite's top 5."""
    ref = retriever.search_batch([t["rewrite"] for t in turns], 5)
    out = {}
    for name, qs in queries.items():
        found = search(retriever, qs, top)
        pairs = list(zip(found, ref))
        out[name] = {"overlap@5": statistics.mean(overlap(f, r, 5) for f, r in pairs),
                     "recall@20": statistics.mean(overlap(f, r, top) for f, r in pairs), "n": len(pairs)}
    return out


def switches(turns: list[dict], rows: list[dict]) -> list[tuple[dict, str]]:
    """(turn, new question) pairs: every turn with earlier turns, its question replaced by the first
    question of the next conversation (a new topic)."""
    firsts = [r["question"] for r in rows if not r["history"]]
    convs = list(dict.fromkeys(r["conversation"] for r in rows))
    first_of = dict(zip(convs, firsts))
    nxt = {c: first_of[convs[(i + 1) % len(convs)]] for i, c in enumerate(convs)}
    return [(t, nxt[t["conversation"]]) for t in turns]


def switch_scores(pairs: list[tuple[dict, str]], queries: dict[str, list], retriever) -> dict[str, dict]:
    """switch@5 (the standalone top 5 kept in a way's top 5) and switch 2/3 (2 of the standalone top 3
    in its top 3) of every way's queries for the switched questions."""
    alone = retriever.search_batch([q for _, q in pairs], 5)
    out = {}
    for name, qs in queries.items():
        found = search(retriever, qs, 5)
        out[name] = {"switch@5": statistics.mean(overlap(f, a, 5) for f, a in zip(found, alone)),
                     "switch 2/3": statistics.mean(len({p.key for p in f[:3]} & {p.key for p in a[:3]}) >= 2
                                                   for f, a in zip(found, alone)), "n": len(pairs)}
    return out


def tune(turns, pairs, history, retriever) -> dict:
    """`fused`'s weights chosen on the even-numbered conversations, judged on the odd ones."""
    convs = list(dict.fromkeys(t["conversation"] for t in turns))
    even = {c for i, c in enumerate(convs) if i % 2 == 0}
    rows = []
    for asked, context in GRID:
        def form(t, q):
            return fused_forms(q, history(t), asked, context)
        result = {"asked": asked, "context": context}
        for half, keep in (("dev", lambda c: c in even), ("test", lambda c: c not in even)):
            ts = [t for t in turns if keep(t["conversation"])]
            ps = [(t, q) for t, q in pairs if keep(t["conversation"])]
            cast = score(ts, {"w": [form(t, t["question"]) for t in ts]}, retriever)["w"]
            sw = switch_scores(ps, {"w": [form(t, q) for t, q in ps]}, retriever)["w"]
            result[half] = {"recall@20": cast["recall@20"], "overlap@5": cast["overlap@5"], **sw,
                            "objective": (cast["recall@20"] + sw["switch@5"]) / 2}
        rows.append(result)
    best = max(rows, key=lambda r: r["dev"]["objective"])
    return {"grid": rows, "best": best, "shipped": {"asked": ASKED_WEIGHT, "context": CONTEXT_WEIGHT}}


def cpu_flags() -> str:
    out = subprocess.run("grep -o 'avx512[a-z_]*\\|avx2' /proc/cpuinfo | sort -u", shell=True,
                         capture_output=True, text=True).stdout.split()
    return " ".join(out) or "-"


def table(title: str, scores: dict[str, dict], latency: dict[str, float]) -> str:
    lines = [f"{title}", "", "| query | overlap@5 | recall@20 | added latency (mean / p95) |", "|---|---|---|---|"]
    for name, s in scores.items():
        lat = latency.get(name)
        lat_s = "-" if lat is None else f"{lat['mean'] * 1000:.1f} / {lat['p95'] * 1000:.1f} ms"
        lines.append(f"| {name} | {s['overlap@5']:.3f} | {s['recall@20']:.3f} | {lat_s} |")
    return "\n".join(lines)


def timed(fn, items) -> tuple[list[str], dict]:
    out, secs = [], []
    for item in items:
        t0 = time.perf_counter()
        out.append(fn(item))
        secs.append(time.perf_counter() - t0)
    secs_sorted = sorted(secs)
    return out, {"mean": statistics.mean(secs), "p95": secs_sorted[int(0.95 * (len(secs) - 1))]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-file", default=DATA)
    ap.add_argument("--index", required=True, help="index folder searched by every way and by the manual rewrite")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--model-limit", type=int, default=150,
                    help="turns the model rewrites (seeded sample; 0 = none, -1 = all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", default="runs/bench_rewrite")
    ap.add_argument("--answers", help="cache of the generated answers (default: OUTPUT_DIR/answers.jsonl)")
    ap.add_argument("--example", nargs=2, metavar=("Q1", "Q2"), help="also print each way's top 5 for Q2 after Q1")
    ap.add_argument("--tune", action="store_true", help="choose fused's weights on even conversations (see above)")
    args = ap.parse_args(argv)
    from targ_mlx.assistant import Assistant, Settings
    from targ_mlx.runtime.backbone import load_backbone
    from targ_mlx.index import open_retriever

    os.makedirs(args.output_dir, exist_ok=True)
    with open(args.data_file) as f:
        rows = list(map(json.loads, f))
    retriever = open_retriever(args.index)
    bb = load_backbone(args.model)
    closed_book = Assistant(bb, None, Settings(gate="never"))
    t0 = time.perf_counter()
    answers = generated_answers(rows, closed_book, args.answers or os.path.join(args.output_dir, "answers.jsonl"))
    answer_s = time.perf_counter() - t0
    previous = {(r["conversation"], len(r["history"])): r["id"] for r in rows}  # the turn before each one
    turns = [t for t in rows if t["history"]]

    def history(t: dict) -> list[Turn]:
        return [Turn(q, answers[previous[t["conversation"], i]]) for i, q in enumerate(t["history"])]

    queries, latency = {}, {}
    for name, (form, kept) in WAYS.items():
        queries[name], latency[name] = timed(lambda t: form(t["question"], history(t), kept), turns)
    everything = score(turns, queries, retriever)
    pairs = switches(turns, rows)
    switched = switch_scores(pairs, {name: [form(q, history(t), kept) for t, q in pairs]
                                     for name, (form, kept) in WAYS.items()}, retriever)
    tuned = tune(turns, pairs, history, retriever) if args.tune else None
    differ = [i for i, t in enumerate(turns) if t["question"] != t["rewrite"]]
    changed = score([turns[i] for i in differ], {n: [q[i] for i in differ] for n, q in queries.items()}, retriever)

    n = len(turns) if args.model_limit < 0 else min(args.model_limit, len(turns))
    sample = sorted(random.Random(args.seed).sample(range(len(turns)), n))
    rewrites, on_sample = [], {}
    if n:
        model_rewrite(bb, turns[0]["question"], history(turns[0]))  # warm-up
        rewrites, latency["model"] = timed(lambda i: model_rewrite(bb, turns[i]["question"], history(turns[i])),
                                           sample)
        sub_queries = {name: [q[i] for i in sample] for name, q in queries.items()} | {"model": rewrites}
        on_sample = score([turns[i] for i in sample], sub_queries, retriever)
    checked = None
    if args.example:
        checked = example(Assistant(bb, retriever, Settings()), retriever, *args.example)

    meta = {"date": str(date.today()), "machine": platform.machine(), "cpu_flags": cpu_flags(),
            "cpus": os.cpu_count(), "load": os.getloadavg()[0], "index": args.index, "index_size": len(retriever),
            "model": bb.model_id, "turns_with_history": len(turns), "differing": len(differ), "model_sample": n,
            "answers": len(answers), "answer_seconds": round(answer_s, 1)}
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "all": everything, "differing": changed, "sample": on_sample, "latency": latency,
                   "example": checked, "switches": switched, "tune": tuned,
                   "queries": [{"id": t["id"], "question": t["question"], "manual": t["rewrite"]}
                               | {name: q[i] for name, q in queries.items()} for i, t in enumerate(turns)],
                   "rewrites": [{"id": turns[i]["id"], "question": turns[i]["question"], "manual": turns[i]["rewrite"],
                                 "model": r} for i, r in zip(sample, rewrites)]}, f, indent=1)
    print(json.dumps(meta))
    print(table(f"All {len(turns)} turns with earlier turns:", everything, latency))
    print()
    print(table(f"The {len(differ)} turns whose manual rewrite differs from the question:", changed, latency))
    print()
    print(f"Topic switches ({len(pairs)}): | way | switch@5 | switch 2/3 |")
    for name, sc in switched.items():
        print(f"| {name} | {sc['switch@5']:.3f} | {sc['switch 2/3']:.3f} |")
    if tuned:
        print()
        print("| asked (0, 1) | context (0, 1) | dev recall@20 | dev switch@5 | dev objective | test recall@20 | "
              "test switch@5 | test switch 2/3 |")
        for r in tuned["grid"]:
            d, t = r["dev"], r["test"]
            print(f"| {r['asked']} | {r['context']} | {d['recall@20']:.3f} | {d['switch@5']:.3f} | {d['objective']:.3f} "
                  f"| {t['recall@20']:.3f} | {t['switch@5']:.3f} | {t['switch 2/3']:.3f} |")
        print(f"picked on dev: asked {tuned['best']['asked']}, context {tuned['best']['context']}")
    if n:
        print()
        print(table(f"Seeded sample of {n} turns, with the model's rewrite:", on_sample, latency))
    if checked:
        print()
        print(f"{checked['first']!r} -> {checked['answer']!r} (top 5: {', '.join(checked['first_top5'])})")
        for name, w in checked["ways"].items():
            print(f"  {name}: {w['query']!r}\n    {', '.join(w['top5'])}")
        print(f"  the assistant (default way) searched {checked['assistant_query']!r}: "
              f"{', '.join(checked['assistant_top5'])} -> {checked['assistant_answer']!r}")


if __name__ == "__main__":
    main()
