"""Probe: does naming an article help BM25? hit@5 over a BM25 index when passages of articles
whose title is a phrase of the question are moved up, on held-out questions (seed 1, none of the
eval's seed-0 sample): a "the question names the article" signal, tried and not shipped;
docs/archive/benchmarks-journal.md, "Answer coverage".

    python scripts/archive/probe_title_match.py popqa ../shared/data/qa/popqa_1k.jsonl 500 [index/large-bm25]

Variants: BM25 alone; BM25 + lam x (words in the longest title the question names) for that
title's passages, + lam again for its lead passage; the lead passage of the longest named title
put first. Titles are matched lower-cased, punctuation and a trailing "(disambiguation)" dropped,
never on stop words alone.
"""
import collections
import re
import sqlite3
import statistics
import sys

from targ_mlx.eval.datasets import read_jsonl, sample
from targ_mlx.eval.metrics import contains
from targ_mlx.index.lexical import open_lexical

STOP = set("a an the of in on at to for by with and or is was are were be who what when where which whom whose "
           "how why did do does from as that this it its his her their".split())


def norm(title: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", re.sub(r"\s*\([^)]*\)\s*$", "", title).lower()))


def named(question: str, titles: dict) -> tuple[int, list[str]]:
    """The longest n-gram length (words) of the question that is a title, and those titles."""
    w = re.findall(r"[a-z0-9]+", question.lower())
    for n in range(min(8, len(w)), 0, -1):
        hits = [" ".join(w[i:i + n]) for i in range(len(w) - n + 1)]
        hits = [h for h in hits if h in titles and not all(x in STOP for x in h.split())]
        if hits:
            return n, hits
    return 0, []


def main(argv):
    name, path, n = argv[0], argv[1], int(argv[2])
    folder = argv[3] if len(argv) > 3 else "index/large-bm25"
    lex = open_lexical(folder)
    db = sqlite3.connect(f"{folder}/passages.db")
    titles = collections.defaultdict(list)
    for key, title in db.execute("SELECT key, title FROM passages ORDER BY key"):
        if t := norm(title or ""):
            titles[t].append(key)
    eval_qs = {it.question for it in sample(read_jsonl(path), 500, 0)}
    items = [it for it in sample(read_jsonl(path), 2000 if name != "popqa" else 1000, 1) if it.question not in eval_qs][:n]
    res = collections.defaultdict(list)
    for it in items:
        bm = [int(k) for k, _ in lex.search([it.question], 20)[0]]
        ln, hits = named(it.question, titles)
        cand = list(dict.fromkeys(k for h in hits for k in titles[h][:300]))
        keys = list(dict.fromkeys(bm + cand))
        rows = {}
        for i in range(0, len(keys), 900):
            part = keys[i:i + 900]
            for k, text, start in db.execute(f"SELECT key, text, start FROM passages WHERE key IN ({','.join('?' * len(part))})", part):
                rows[k] = (text, start)
        bms = dict(zip(keys, lex.score_keys(it.question, keys)))
        inside = set(cand)
        lead = {k for k in inside if rows[k][1] == 0}
        hit = lambda order: contains(" ".join(rows[k][0] for k in order[:5]), it.answers)  # noqa: E731
        res["BM25"].append(hit(bm))
        for lam in (1.0, 2.0):
            order = sorted(keys, key=lambda k: -(bms[k] + lam * ln * (k in inside) + lam * (k in lead)))
            res[f"+{lam:g} x title words"].append(hit(order))
        first = sorted(lead, key=lambda k: -bms[k])[:1]
        res["lead of the named article first"].append(hit(list(dict.fromkeys(first + bm))))
        res["BM25 hit@20"].append(contains(" ".join(rows[k][0] for k in bm[:20]), it.answers))
    print(name, len(items), "questions:", {m: round(100 * statistics.mean(x), 1) for m, x in res.items()})


if __name__ == "__main__":
    main(sys.argv[1:])
