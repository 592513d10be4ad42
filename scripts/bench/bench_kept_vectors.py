"""A chat over a BM25-only index, with and without the vectors it encoded kept between searches.

A BM25-only index encodes the passages a search returns for their cosine (hybrid: BM25's top 20),
and that encode is most of the search. Each turn of the first --conversations TREC CAsT
conversations is searched as the chat searches it (`conversation.search_forms` over the earlier
questions, no answers; the forms fused in the index, top 5), once keeping nothing
(`kept_vectors = 0`) and once with the vectors kept from the conversation's earlier turns (the
shipped `retriever.KEPT_VECTORS`; a new conversation starts with none kept, as a new chat in a
new process would), the two ways alternating which goes first. Prints milliseconds per turn
(median, p95) each way, the ratio, the first turns apart, and whether the two gave the same top 5
(keys, and cosines within 1e-6).

    python scripts/bench/bench_kept_vectors.py --index index/large-bm25 --retriever bm25 hybrid --conversations 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import date
from pathlib import Path

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

from targ_mlx.conversation import Turn, search_forms  # noqa: E402
from targ_mlx.eval.run import read_jsonl  # noqa: E402
from targ_mlx.index.merged import open_indexes  # noqa: E402
from targ_mlx.index.retriever import KEPT_VECTORS  # noqa: E402
from targ_mlx.retrieval import search_fused  # noqa: E402

CAST = Path(__file__).resolve().parents[3] / "shared" / "data" / "conv" / "trec_cast_2019_2020.jsonl"


def _keep(r, n: int, clear: bool = False) -> None:
    for part, _ in r.parts:
        part.kept_vectors = n
        if clear:
            part._kept.clear()


def _p(ts: list[float], q: float) -> float:
    return sorted(ts)[int(q * (len(ts) - 1))]


def run(index: str, mode: str, conversations: list[list[dict]], k: int) -> dict:
    r = open_indexes([Path(index)], retriever=mode)
    r.search("warm up", k)
    times = {"off": [], "on": []}
    first = {"off": [], "on": []}
    same = total = 0
    for c, turns in enumerate(conversations):
        _keep(r, KEPT_VECTORS, clear=True)  # a new chat
        history: list[Turn] = []
        for t, turn in enumerate(turns):
            forms = search_forms(turn["question"], history)
            got = {}
            for way in (("off", "on") if (c + t) % 2 else ("on", "off")):
                _keep(r, 0 if way == "off" else KEPT_VECTORS)
                t0 = time.perf_counter()
                got[way] = search_fused(r, [f.query for f in forms], k, [f.weight for f in forms])
                ms = 1000 * (time.perf_counter() - t0)
                (first if t == 0 else times)[way].append(ms)
            total += 1
            same += ([p.key for p in got["on"]] == [p.key for p in got["off"]]
                     and all(abs(a.score - b.score) <= 1e-6 for a, b in zip(got["on"], got["off"])))
            history.append(Turn(turn["question"], "", grounded=False))
    out = {"mode": mode, "turns": total, "same_top_k": same}
    for way in ("off", "on"):
        out[way] = {"follow_up_p50_ms": statistics.median(times[way]), "follow_up_p95_ms": _p(times[way], 0.95),
                    "first_turn_p50_ms": statistics.median(first[way])}
    out["follow_up_ratio"] = out["off"]["follow_up_p50_ms"] / out["on"]["follow_up_p50_ms"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--index", required=True, help="a BM25-only index")
    p.add_argument("--retriever", nargs="+", default=["bm25", "hybrid"])
    p.add_argument("--conversations", type=int, default=20)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--data-file", default=str(CAST))
    args = p.parse_args(argv)
    by_conv: dict[str, list[dict]] = {}
    for row in read_jsonl(Path(args.data_file)):
        by_conv.setdefault(row["conversation"], []).append(row)
    conversations = [sorted(rows, key=lambda r: r["turn"]) for rows in by_conv.values()][: args.conversations]
    result = {"date": str(date.today()), "index": args.index, "conversations": len(conversations),
              "runs": [run(args.index, m, conversations, args.k) for m in args.retriever]}
    print(json.dumps(result))
    for r in result["runs"]:
        print(f"{r['mode']:>7}: follow-ups p50 {r['off']['follow_up_p50_ms']:.0f} ms keeping nothing, "
              f"{r['on']['follow_up_p50_ms']:.0f} ms keeping ({r['follow_up_ratio']:.2f}x); p95 "
              f"{r['off']['follow_up_p95_ms']:.0f} / {r['on']['follow_up_p95_ms']:.0f}; first turns "
              f"{r['off']['first_turn_p50_ms']:.0f} / {r['on']['first_turn_p50_ms']:.0f} ms; "
              f"same top {args.k} in {r['same_top_k']} of {r['turns']} turns")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
