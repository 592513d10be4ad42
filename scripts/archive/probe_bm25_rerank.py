"""Probe: BM25's top 20 over a BM25-only index re-ordered by the encoder's cosine (alone, or fused by
reciprocal rank with BM25's order, which is what `--retriever hybrid` does there): hit@5 on N
held-out questions of a QA set (seed 1, none of the eval's seed-0 sample).
docs/archive/benchmarks-journal.md, "Answer coverage".

    python scripts/archive/probe_bm25_rerank.py nq_open ../shared/data/qa/nq_open_dev.jsonl 100 [index/large-bm25]
"""
import sys, time, statistics
import numpy as np
from targ_mlx.eval.datasets import read_jsonl, sample
from targ_mlx.eval.metrics import contains
from targ_mlx.index.lexical import open_lexical
from targ_mlx.index.retriever import open_retriever
from targ_mlx.retrieval import Passage, fuse
name, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
folder = sys.argv[4] if len(sys.argv) > 4 else "index/large-bm25"
r = open_retriever(folder); lex = open_lexical(folder)
eval_ids = {it.question for it in sample(read_jsonl(path), 500, 0)}
items = [it for it in sample(read_jsonl(path), 2000 if name != "popqa" else 1000, 1) if it.question not in eval_ids][:n]
res = {"bm25": [], "cos": [], "rrf": []}; t0 = time.time()
for it in items:
    keys = [k for k, _ in lex.search([it.question], 20)[0]]
    texts = r.passages(keys); keys = [k for k in keys if k in texts]
    v = r.vectors(keys); q = np.atleast_2d(r.encoder.encode_queries([it.question]))[0]
    cos = v @ q
    bm = [Passage(k, *texts[k], 0.0) for k in keys]
    byc = [bm[i] for i in np.argsort(-cos, kind="stable")]
    for m, ranking in (("bm25", bm), ("cos", byc), ("rrf", fuse([byc, bm], 20))):
        res[m].append(contains(" ".join(p.text for p in ranking[:5]), it.answers))
print(name, len(items), {m: round(100 * statistics.mean(x), 1) for m, x in res.items()}, f"{time.time() - t0:.0f} s")
