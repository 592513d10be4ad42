"""Probe: does MiniLM's similarity of question and sentence improve the selection (`--read sentences`)?

On held-out questions (seed 1, none of the eval's seed-0 sample of 500), each question's top 20 from
the index are cut into sentences (`selection.sentences`); every sentence is encoded with its title
(the index's own encoder, as a passage) and scored

    score = BM25(question, title + sentence) + w_dense * cosine(question, sentence) + w_rank / (1 + rank / 5)

(`dense only` drops the BM25 term); `selection.pack` fills 512 tokens of SmolLM2's tokenizer with the
best, and read-hit is whether an accepted answer occurs in the packed context (the eval's `contains`),
beside the top 5 passages packed into the same budget. w_dense = 0 is the shipped selection's score.
The sentences' vectors are cached (--cache), so a second run only rescores.

    python scripts/archive/probe_dense_selection.py --index index/clean-minilm --limit 300
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from targ_mlx import bind_openblas  # noqa: E402

bind_openblas()  # before mlx.core loads

import numpy as np  # noqa: E402
import bench_selection as bench  # noqa: E402

from targ_mlx.eval.datasets import read_jsonl, sample  # noqa: E402
from targ_mlx.eval.metrics import contains  # noqa: E402
from targ_mlx.index.merged import open_indexes  # noqa: E402
from targ_mlx.prompts import pack_context  # noqa: E402
from targ_mlx.selection import Window, bm25_scores, pack, sentences, terms  # noqa: E402

BUDGET = 512
GRID = [(wd, wr, False) for wd in (0, 2, 5, 10, 20) for wr in (0, 1, 2)] + [(10, wr, True) for wr in (0, 1, 2)]


def encode(retriever, items) -> list:
    """(item, top 20, sentences per passage, {(rank, i): cosine}) per question."""
    enc, rows = retriever.encoder, []
    for it, ps in zip(items, bench.search_all(retriever, items)[0]):
        ps = ps[:20]
        split = [sentences(p.text) for p in ps]
        flat = [(r, i) for r, ss in enumerate(split) for i in range(len(ss))]
        q = np.asarray(enc.encode_queries([it.question]))[0]
        v = np.asarray(enc.encode_passages([ps[r].title for r, _ in flat], [split[r][i] for r, i in flat])) if flat else []
        rows.append((it, ps, split, {f: float(c) for f, c in zip(flat, v @ q if flat else [])}))
    return rows


def ranked(question, ps, split, cos, w_dense, w_rank, dense_only) -> list[Window]:
    spans = [(r, i) for r, ss in enumerate(split) for i in range(len(ss))]
    lexical = bm25_scores(terms(question), [terms(ps[r].title) + terms(split[r][i]) for r, i in spans])
    scored = [Window(r, i, i + 1, (0 if dense_only else lex) + w_dense * cos[r, i] + w_rank / (1 + r / 5))
              for (r, i), lex in zip(spans, lexical)]
    return sorted(scored, key=lambda w: -w.score)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--limit", type=int, default=300)
    ap.add_argument("--datasets", default="nq_open,triviaqa,popqa")
    ap.add_argument("--cache", type=Path, help="default runs/dense_selection_<index>_<limit>.pkl")
    args = ap.parse_args(argv)
    from targ_mlx.runtime.backbone import load_backbone

    tok = load_backbone("smollm2-135m").tokenizer
    count = lambda s: len(tok.encode(s))  # noqa: E731
    names = args.datasets.split(",")
    cache = args.cache or Path(f"runs/dense_selection_{Path(args.index).name}_{args.limit}.pkl")
    data = pickle.loads(cache.read_bytes()) if cache.exists() else {}
    retriever = None
    for ds in names:
        if ds in data:
            continue
        retriever = retriever or open_indexes([Path(args.index)])
        items = read_jsonl(bench.DATASETS[ds])
        items = bench.held_out(items, args.limit, 1, {it.id for it in sample(items, 500, 0)})
        t0 = time.perf_counter()
        data[ds] = encode(retriever, items)
        print(f"{ds}: {len(items)} questions' sentences encoded, {(time.perf_counter() - t0) / len(items):.2f} s a question",
              flush=True)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(pickle.dumps(data))
    print(f"read-hit at {BUDGET} tokens, {args.index}, {args.limit} held-out questions each: " + " / ".join(names))
    for wd, wr, dense_only in GRID:
        per = [statistics.mean(contains(pack_context(pack(ranked(it.question, ps, sp, cos, wd, wr, dense_only), ps, sp,
                                                          BUDGET, count), BUDGET, tok.encode, tok.decode).text, it.answers)
                               for it, ps, sp, cos in data[ds]) for ds in names]
        label = f"dense only, w_rank {wr}" if dense_only else f"w_dense {wd:2}, w_rank {wr}"
        print(f"{label:24} " + " ".join(f"{100 * x:5.1f}" for x in per) + f"   mean {100 * statistics.mean(per):5.1f}")
    top5 = [statistics.mean(contains(pack_context(ps[:5], BUDGET, tok.encode, tok.decode).text, it.answers)
                            for it, ps, _, _ in data[ds]) for ds in names]
    print(f"{'top 5 passages':24} " + " ".join(f"{100 * x:5.1f}" for x in top5) + f"   mean {100 * statistics.mean(top5):5.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
