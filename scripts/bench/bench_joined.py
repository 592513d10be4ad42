"""What is read when several chunks of one article are found (issue 55, deliver 2): the top 5 as
found, against one passage per topic (`--read distinct`: the best chunk of each, refilled from
ranks 6-20), against each article's found chunks joined into one passage in article order
(neighbouring chunks merged where they overlap), each packed into the same context tokens.

read-hit = an accepted answer string occurs in the context as packed (the eval's `contains` over
`prompts.pack_context`'s text at --budget tokens of the model's tokenizer), on the eval's own
seeded samples (as `python -m targ_mlx.eval` draws them); BM25's ranking of a BM25-only index
(no cosine needed). "joined" keeps the articles in the order their best chunk was found and
joins the chunks of each found among the top --join-from.

    python scripts/bench/bench_joined.py --index index/large-bm25 --model qwen2.5-coder-1.5b --limit 500
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
from dataclasses import replace
from datetime import date
from pathlib import Path

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

from targ_mlx import reader  # noqa: E402
from targ_mlx.eval.datasets import read_jsonl, sample  # noqa: E402
from targ_mlx.eval.metrics import contains  # noqa: E402
from targ_mlx.prompts import pack_context  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bm25_only import BM25Only  # noqa: E402
from bench_selection import DATASETS, cpu_flags  # noqa: E402


def joined(found, where: dict, k: int, join_from: int) -> list:
    """The first k articles of `found` (by their best chunk's rank), each one passage: its chunks
    among the top `join_from`, in article order, overlaps merged."""
    head = found[:join_from]
    order, chunks = [], {}
    for p in head:
        art = where[p.key][0]
        if art not in chunks:
            order.append(art)
            chunks[art] = []
        chunks[art].append(p)
    out = []
    for art in order[:k]:
        ps = sorted(chunks[art], key=lambda p: where[p.key][1])
        text, end = ps[0].text, where[ps[0].key][2]
        for p in ps[1:]:
            start, stop = where[p.key][1], where[p.key][2]
            if start <= end:  # neighbours: the part after the overlap
                text += p.text[max(0, end - start):] if stop > end else ""
            else:
                text += " … " + p.text
            end = max(end, stop)
        out.append(replace(ps[0], key=chunks[art][0].key, text=text))  # keyed as its best chunk
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="whose tokenizer counts the tokens")
    ap.add_argument("--join-from", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from targ_mlx.runtime.backbone import load_backbone

    tok = load_backbone(args.model).tokenizer
    r = BM25Only(args.index)
    db = sqlite3.connect(f"file:{Path(args.index) / 'passages.db'}?mode=ro", uri=True)
    out = {"meta": {"date": str(date.today()), "cpu_flags": cpu_flags(), "budget": args.budget, "model": args.model,
                    "limit": args.limit, "join_from": args.join_from, "index": args.index}, "results": {}}
    for ds in args.datasets.split(","):
        items = sample(read_jsonl(DATASETS[ds]), args.limit, args.seed)
        found = r.search_batch([it.question for it in items], 20)
        keys = list({p.key for ps in found for p in ps})
        where = {}
        for i in range(0, len(keys), 900):
            part = keys[i: i + 900]
            q = f"SELECT key, article, start, end FROM passages WHERE key IN ({','.join('?' * len(part))})"
            where.update({k: (a, s, e) for k, a, s, e in db.execute(q, part)})
        ways = {"top5": lambda ps: ps[:5], "distinct": lambda ps: reader.distinct(ps, 5),
                "joined": lambda ps: joined(ps, where, 5, args.join_from),
                "joined_top5": lambda ps: joined(ps[:5], where, 5, 5)}
        res = {}
        for name, way in ways.items():
            hits, toks, arts = [], [], []
            for it, ps in zip(items, found):
                packed = pack_context(way(ps), args.budget, tok.encode, tok.decode)
                hits.append(contains(packed.text, it.answers))
                toks.append(packed.tokens)
                arts.append(len(packed.passages))
            res[name] = {"read_hit": statistics.mean(hits), "tokens": statistics.mean(toks),
                         "passages_packed": statistics.mean(arts)}
        res["hit@5"] = statistics.mean(contains(" ".join(p.text for p in ps[:5]), it.answers) for it, ps in zip(items, found))
        res["n"] = len(items)
        out["results"][ds] = res
        print(ds, json.dumps(res), file=sys.stderr)
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
