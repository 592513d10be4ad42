"""What is read, at equal context tokens: the search's top 5 passages against the selected sentences
of its top 20 (`targ_mlx.selection`), side by side on the same searches.

read-hit = an accepted answer string occurs in the context as packed for the prompt (the eval's
`contains` over `prompts.pack_context`'s text at --budget tokens of the model's tokenizer: what the
records' `always.hit` means), on the eval's own seeded samples (500 questions, seed 0, as
`python -m targ_mlx.eval` draws them). Each index is searched as the apps search it
(`open_indexes`: its default mode). Also: hit@5 and hit@20 of the whole passages (the ranking's
ceiling), the mean context tokens each way fills, and the milliseconds the selection adds.

--rerank SPEC re-orders each search's top 20 first (`targ_mlx.rerank`: llm, or a CrossEncoder) and
reports the same figures over the re-ordered lists beside the search's own order, with the seconds
the reranker takes per question.

--select-from N lets the selection read from each search's top N instead of the shipped 20.

--tune chooses the selection's window size and rank weight on 300 other questions per dataset (seed 1,
none of the reported ones) by the mean read-hit over the datasets, and reports them on the sample.

    python scripts/bench/bench_selection.py --index vital=index/vital-articles-minilm --output runs/selection.json
    python scripts/bench/bench_selection.py --index vital=index/vital-articles-minilm --tune --limit 300
    python scripts/bench/bench_selection.py --index clean=index/clean-minilm --rerank llm --model qwen2.5-coder-1.5b --limit 100
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

from targ_mlx import reader, rerank, selection  # noqa: E402
from targ_mlx.eval.datasets import read_jsonl, sample  # noqa: E402
from targ_mlx.eval.metrics import contains  # noqa: E402
from targ_mlx.index.merged import open_indexes  # noqa: E402
from targ_mlx.prompts import pack_context  # noqa: E402

QA = Path(__file__).resolve().parents[3] / "shared" / "data" / "qa"
DATASETS = {"nq_open": QA / "nq_open_dev.jsonl", "triviaqa": QA / "triviaqa_dev.jsonl", "popqa": QA / "popqa_1k.jsonl"}
GRID = [dict(size=s, rank_weight=w) for s in (1, 2, 3) for w in (0.0, 1.0, 2.0, 4.0)]
RATIOS = (0.0, 0.3, 0.5, 0.7)  # reading depth: windows below this share of the best score are left


def held_out(items, limit: int, seed: int, exclude: set[str]):
    return sample([it for it in items if it.id not in exclude], limit, seed)


def measure(items, found, tok, budget: int, select_from: int = selection.SELECT_FROM, **params) -> dict:
    """read-hit and tokens of the top 5 and of the selection (from each search's top `select_from`)
    over the same searches."""
    encode, decode = tok.encode, tok.decode
    count = lambda s: len(encode(s))  # noqa: E731
    top5, sel, t5_tok, sel_tok, secs, dist, dups, slots = [], [], [], [], [], [], 0, 0
    for it, ps in zip(items, found):
        a = pack_context(ps[:5], budget, encode, decode)
        # the top 5 distinct topics in the same budget (`--read distinct`), and how many of the top
        # 5's packed slots repeat a topic packed before them
        dist.append(contains(pack_context(reader.distinct(ps, 5), budget, encode, decode).text, it.answers))
        slots += len(a.passages)
        dups += len(a.passages) - len(reader.distinct(a.passages, len(a.passages)))
        t0 = time.perf_counter()
        chosen = selection.select(it.question, ps[:select_from], budget, count, **params)
        b = pack_context(chosen, budget, encode, decode)
        secs.append(time.perf_counter() - t0)
        top5.append(contains(a.text, it.answers))
        sel.append(contains(b.text, it.answers))
        t5_tok.append(a.tokens)
        sel_tok.append(b.tokens)
    return {"top5": statistics.mean(top5), "selection": statistics.mean(sel), "distinct": statistics.mean(dist),
            "top5_duplicate_share": dups / max(1, slots), "top5_tokens": statistics.mean(t5_tok),
            "selection_tokens": statistics.mean(sel_tok), "selection_ms": 1000 * statistics.mean(secs),
            **{f"hit@{n}": hit_at(items, found, n) for n in (5, 20, select_from)}, "n": len(items),
            "paired": {"both": sum(a and b for a, b in zip(top5, sel)), "top5_only": sum(a and not b for a, b in zip(top5, sel)),
                       "selection_only": sum(b and not a for a, b in zip(top5, sel))}}


def hit_at(items, found, n: int) -> float:
    """The share of questions with an answer string in the whole text of their top `n` passages."""
    return statistics.mean(contains(" ".join(p.text for p in ps[:n]), it.answers) for it, ps in zip(items, found))


def search_all(retriever, items, depth: int = 20) -> tuple[list, float]:
    t0 = time.perf_counter()
    found = []
    qs = [it.question for it in items]
    for i in range(0, len(qs), 50):
        found += retriever.search_batch(qs[i: i + 50], depth)
    return found, 1000 * (time.perf_counter() - t0) / max(1, len(qs))


def rerank_all(judge, items, found) -> tuple[list, float]:
    """Each question's top RERANK_FROM re-ordered by `judge`; seconds per question."""
    t0 = time.perf_counter()
    out = [rerank.rerank(judge, it.question, ps) for it, ps in zip(items, found)]
    return out, (time.perf_counter() - t0) / max(1, len(items))


def cpu_flags() -> str:
    out = subprocess.run("grep -o 'avx512[a-z_]*\\|avx2\\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u", shell=True,
                         capture_output=True, text=True).stdout.split()
    return " ".join(out) or "-"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--index", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--limit", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=512, help="context tokens (the eval's L_ctx)")
    p.add_argument("--model", default="smollm2-135m", help="whose tokenizer counts the tokens")
    p.add_argument("--rerank", default="", help="also re-order the top 20 with this reranker: llm or a CrossEncoder")
    p.add_argument("--tune", action="store_true", help="choose size and rank weight on held-out questions first")
    p.add_argument("--select-from", type=int, default=selection.SELECT_FROM,
                   help=f"passages the selection reads from, each search's top N (default {selection.SELECT_FROM}: what ships)")
    p.add_argument("--output", default="runs/selection.json")
    args = p.parse_args(argv)
    depth = max(20, args.select_from)  # hit@20 is reported whatever the selection reads from
    from targ_mlx.runtime.backbone import load_backbone

    bb = load_backbone(args.model)
    tok = bb.tokenizer
    judge = rerank.load_reranker(args.rerank, bb)
    names = args.datasets.split(",")
    out = {"meta": {"date": str(date.today()), "machine": platform.machine(), "cpu_flags": cpu_flags(),
                    "budget": args.budget, "model": args.model, "limit": args.limit, "seed": args.seed,
                    "rerank": args.rerank, "select_from": args.select_from}, "results": {}}
    for spec in args.index:
        name, folder = spec.split("=", 1)
        retriever = open_indexes([Path(folder)])
        if not (Path(folder) / "vectors.usearch").is_file():  # BM25-only: its order, no cosine encoded
            sys.path.insert(0, str(Path(__file__).parent))
            from bm25_only import BM25Only

            retriever = BM25Only(folder)
        params = dict(size=selection.WINDOW, rank_weight=selection.RANK_WEIGHT)
        if args.tune:
            dev = {}
            for ds in names:
                items = read_jsonl(DATASETS[ds])
                reported = {it.id for it in sample(items, args.limit, args.seed)}
                dev_items = held_out(items, 300, 1, reported)
                dev[ds] = (dev_items, search_all(retriever, dev_items, depth)[0])
            grid = []
            for g in GRID:
                score = statistics.mean(measure(its, fs, tok, args.budget, args.select_from, **g)["selection"] for its, fs in dev.values())
                grid.append((score, g))
                print(f"tune {name}: {g} dev read-hit {100 * score:.1f}", flush=True)
            params = max(grid, key=lambda x: x[0])[1]
            out["results"].setdefault(name, {})["tuned"] = {"grid": [{"score": s, **g} for s, g in grid], "picked": params}
        for ds in names:
            items = sample(read_jsonl(DATASETS[ds]), args.limit, args.seed)
            found, search_ms = search_all(retriever, items, depth)
            r = measure(items, found, tok, args.budget, args.select_from, **params) | {"search_ms": search_ms, "params": params}
            r["depth"] = {str(m): {k: v for k, v in measure(items, found, tok, args.budget, args.select_from, min_ratio=m,
                                                            **params).items()
                                   if k in ("selection", "selection_tokens")} for m in RATIOS[1:]}
            out["results"].setdefault(name, {})[ds] = r
            print(f"{name:8} {ds:9} read-hit top5 {100 * r['top5']:5.1f} ({r['top5_tokens']:.0f} tok)  selection "
                  f"{100 * r['selection']:5.1f} ({r['selection_tokens']:.0f} tok, +{r['selection_ms']:.1f} ms)  "
                  f"hit@5 {100 * r['hit@5']:5.1f} hit@20 {100 * r['hit@20']:5.1f} hit@{args.select_from} "
                  f"{100 * r[f'hit@{args.select_from}']:5.1f}  {r['paired']}", flush=True)
            for m, d in r["depth"].items():
                print(f"{'':18} min_ratio {m}: selection {100 * d['selection']:5.1f} ({d['selection_tokens']:.0f} tok)")
            if judge is not None:
                judged, secs = rerank_all(judge, items, found)
                j = measure(items, judged, tok, args.budget, args.select_from, **params) | {"rerank_s": secs}
                r["reranked"] = j
                print(f"{'':18} rerank {args.rerank}: read-hit top5 {100 * j['top5']:5.1f}  selection "
                      f"{100 * j['selection']:5.1f}  hit@5 {100 * j['hit@5']:5.1f}  {secs:.2f} s/question  {j['paired']}",
                      flush=True)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
