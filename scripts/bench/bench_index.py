"""Benchmarks of the on-disk index (figures: BENCHMARKS.md, rows "HNSW: ..."; history: the journal's
section "Index", docs/archive/benchmarks-journal.md).

  real   vital-articles + wiki_pool with the default encoder: build throughput (encode vs index),
         recall@5 of HNSW vs exact search over the same vectors (1,000 NQ-Open dev questions),
         search latency p50/p99 with and without query encoding, answer hit@5 and gold hit@5
         on the NQ-Open gold set.
  scale  1M synthetic 384-d vectors from a clustered distribution, f16 and i8: recall@5 vs exact,
         p50/p99 search, file size, open time view vs load, resident memory after open and after
         10k queries (each open measured in a fresh subprocess).

    python scripts/bench/bench_index.py real --index index/vital-pool-minilm
    python scripts/bench/bench_index.py scale --n 1000000 --work /tmp/bench-1m
    python scripts/bench/bench_index.py report [--benchmarks FILE]   # print the Index section from runs/
                                                  # (and replace FILE's section of that title)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
DEFAULT_REAL = REPO / "index" / "vital-pool-minilm"
K = 5


def _pct(ms: list[float]) -> dict:
    a = np.asarray(ms)
    return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p99_ms": round(float(np.percentile(a, 99)), 3)}


def _recall(approx_keys: np.ndarray, exact_keys: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(e)) / len(e) for a, e in zip(approx_keys, exact_keys)]))


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _jsonl(path: Path, n: int | None = None) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            rows.append(json.loads(line))
            if n and len(rows) == n:
                break
    return rows


# ----------------------------------------------------------------------------------------- real
def bench_real(index_dir: Path, n_recall: int, n_latency: int) -> dict:
    from targ_mlx.index import build_index, open_retriever

    if not (index_dir / "manifest.json").exists():
        build_index(["vital-articles", str(DATA / "corpus" / "wiki_pool.jsonl")], index_dir)
    opens = []
    for _ in range(5):  # manifest + sampled checksums + usearch view + SQLite, warm page cache
        t0 = time.perf_counter()
        r = open_retriever(index_dir)
        opens.append(1000 * (time.perf_counter() - t0))
    m = r.manifest
    n = m["counts"]["passages"]
    out: dict = {"index": str(index_dir), "manifest_id": r.manifest_id, "passages": n,
                 "corpora": m["corpora"], "hnsw": m["hnsw"], "dtype": m["dtype"],
                 "open_retriever_ms_median": round(statistics.median(opens), 2),
                 "files_mb": {k: round(v["bytes"] / 2**20, 1) for k, v in m["files"].items()}}
    t = m["timing"]
    out["build"] = {
        "encode_s": t["encode_s"], "index_s": t["index_s"],
        "encode_passages_per_s": round(n / t["encode_s"], 1),
        "index_passages_per_s": round(n / max(t["index_s"], 1e-9), 1),
        "total_passages_per_s": round(n / (t["encode_s"] + t["index_s"]), 1),
    }

    # recall@5 of HNSW vs exact search over the same stored vectors
    qs = [q["question"] for q in _jsonl(DATA / "qa" / "nq_open_dev.jsonl", n_recall)]
    t0 = time.perf_counter()
    qv = r.encoder.encode_queries(qs, batch_size=128)
    out["query_encode_batch_ms_per_query"] = round(1000 * (time.perf_counter() - t0) / len(qs), 3)
    approx = r.index.search(qv, K).keys
    exact = r.index.search(qv, K, exact=True).keys
    out["recall_at_5_vs_exact"] = round(_recall(approx, exact), 4)
    out["n_recall_queries"] = len(qs)

    # latency: one query at a time, as the assistant asks
    # one pass per kind, each over the same queries after a warm-up pass, so none rides on the
    # pages another kind just touched
    lat_index, lat_lookup, lat_full = [], [], []
    for v in qv[:n_latency]:
        r.search_vectors(v[None], K)
    for v in qv[:n_latency]:
        t0 = time.perf_counter()
        r.index.search(v, K)
        lat_index.append(1000 * (time.perf_counter() - t0))
    for v in qv[:n_latency]:
        t0 = time.perf_counter()
        r.search_vectors(v[None], K)
        lat_lookup.append(1000 * (time.perf_counter() - t0))
    for q in qs[:n_latency]:
        t0 = time.perf_counter()
        r.search(q, K)
        lat_full.append(1000 * (time.perf_counter() - t0))
    out["latency_hnsw_only"] = _pct(lat_index)
    out["latency_hnsw_plus_sqlite"] = _pct(lat_lookup)
    out["latency_with_query_encoding"] = _pct(lat_full)

    # answer hit@5 and gold-passage hit@5 on the aligned NQ-Open gold set
    gold = _jsonl(DATA / "aligned" / "nq_open_dev_gold.jsonl")
    results = r.search_vectors(r.encoder.encode_queries([g["question"] for g in gold], batch_size=128), K)
    ans = gold_hit = 0
    for g, ps in zip(gold, results):
        texts = [_norm(p.title + " " + p.text) for p in ps]
        ans += any(_norm(a) in t for a in g["answers"] for t in texts)
        gtext = _norm(g["passages"][0]["text"])
        gold_hit += any(_norm(p.text) in gtext or gtext in _norm(p.text) for p in ps)
    out["nq_gold_questions"] = len(gold)
    out["answer_hit_at_5"] = round(ans / len(gold), 4)
    out["gold_passage_hit_at_5"] = round(gold_hit / len(gold), 4)
    return out


# ---------------------------------------------------------------------------------------- scale
def clustered(n: int, dims: int, clusters: int, seed: int, latent: int = 64) -> np.ndarray:
    """Normalised points from a Gaussian mixture in a `latent`-d space mapped into `dims`, with a
    little isotropic noise: clustered, with cluster sizes Zipf-like, and of low intrinsic dimension
    like real sentence embeddings (uniform random vectors are a known pathological case for HNSW)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, latent), dtype=np.float32)
    lift = rng.standard_normal((latent, dims), dtype=np.float32) / np.sqrt(latent)
    weights = 1.0 / np.arange(1, clusters + 1) ** 0.7
    labels = rng.choice(clusters, size=n, p=weights / weights.sum())
    out = np.empty((n, dims), dtype=np.float32)
    for i in range(0, n, 100_000):
        z = centres[labels[i : i + 100_000]]
        z = z + 0.5 * rng.standard_normal(z.shape, dtype=np.float32)
        x = z @ lift + 0.05 * rng.standard_normal((len(z), dims), dtype=np.float32)
        out[i : i + 100_000] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def exact_top_k(base: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    keys = np.empty((len(queries), k), dtype=np.int64)
    for i in range(0, len(queries), 100):
        s = queries[i : i + 100] @ base.T
        top = np.argpartition(-s, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(s, top, axis=1), axis=1)
        keys[i : i + 100] = np.take_along_axis(top, order, axis=1)
    return keys


def _open_probe(path: str, view: bool, queries: str, n_queries: int) -> dict:
    """Run in a fresh process: open time, RSS after open and after n queries."""
    import psutil
    from usearch.index import Index

    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    t0 = time.perf_counter()
    index = Index.restore(path, view=view)
    open_ms = 1000 * (time.perf_counter() - t0)
    rss_open = proc.memory_info().rss
    q = np.load(queries)
    for i in range(n_queries):
        index.search(q[i % len(q)], K)
    rss_q = proc.memory_info().rss
    return {"open_ms": round(open_ms, 2), "rss_after_open_mb": round((rss_open - rss0) / 2**20, 1),
            "rss_after_queries_mb": round((rss_q - rss0) / 2**20, 1), "queries": n_queries}


def bench_scale(n: int, work: Path, dtypes: list[str], efs: list[int], n_queries: int,
                connectivity: int, expansion_add: int) -> dict:
    from usearch.index import Index

    work.mkdir(parents=True, exist_ok=True)
    dims = 384
    t0 = time.perf_counter()
    # one draw, split: queries share the base's centres but are points not in the index
    data = clustered(n + n_queries, dims, clusters=max(n // 1000, 10), seed=0)
    base, queries = data[:n], np.ascontiguousarray(data[n:])
    np.save(work / "queries.npy", queries)
    truth = exact_top_k(base, queries, K)
    out: dict = {"n": n, "dims": dims, "queries": n_queries, "data_s": round(time.perf_counter() - t0, 1),
                 "connectivity": connectivity, "expansion_add": expansion_add}
    for dtype in dtypes:
        path = work / f"{dtype}.usearch"
        res: dict = {}
        index = Index(ndim=dims, metric="ip", dtype=dtype, connectivity=connectivity,
                      expansion_add=expansion_add, expansion_search=64)
        t0 = time.perf_counter()
        for i in range(0, n, 100_000):  # in slices, to print progress on long builds
            index.add(np.arange(i, min(i + 100_000, n), dtype=np.uint64), base[i : i + 100_000])
            print(f"{dtype}: added {min(i + 100_000, n):,} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        res["add_s"] = round(time.perf_counter() - t0, 1)
        res["add_vectors_per_s"] = round(n / res["add_s"])
        index.save(str(path))
        del index
        res["file_mb"] = round(path.stat().st_size / 2**20, 1)
        view = Index.restore(str(path), view=True)
        for ef in efs:
            view.expansion_search = ef
            keys = view.search(queries, K).keys
            lat = []
            for q in queries:
                t1 = time.perf_counter()
                view.search(q, K)
                lat.append(1000 * (time.perf_counter() - t1))
            res[f"ef{ef}"] = {"recall_at_5": round(_recall(keys, truth), 4), **_pct(lat)}
        del view
        for mode in ("view", "load"):
            probe = subprocess.run(
                [sys.executable, __file__, "_probe", str(path), mode, str(work / "queries.npy"), "10000"],
                capture_output=True, text=True, check=True,
            )
            res[f"open_{mode}"] = json.loads(probe.stdout)
        out[dtype] = res
        print(json.dumps({dtype: res}), flush=True)
    return out



# --------------------------------------------------------------------------------------- report
SECTION = "## Index (scripts/bench/bench_index.py)"


def render(real: dict | None, scale: dict | None, real_cmd: str, scale_cmd: str) -> str:
    """The Index section (Markdown) from the JSON results."""
    lines = [SECTION, "", "Targets: recall@5 >= 0.99 (real) and >= 0.97 (1M); p50 search <= 0.5 ms at 1M (no "
             "encoding); open <= 50 ms with view at any size. The machine is shared (2 cores, other jobs beside "
             "most runs), so times are upper bounds; recall figures are not affected.", ""]
    if not real:
        lines += [f"**Real index**: not measured yet; run `{real_cmd}` once index/vital-pool-minilm is built.", ""]
    if real:
        b = real["build"]
        lines += [
            f"**Real index**: `{real_cmd}`, {real['machine']['date']}, {real['machine']['cpus']} shared CPU cores "
            f"({real['machine']['platform']}).",
            f"Corpus {' + '.join(c['source'] for c in real['corpora'])}: {real['passages']:,} chunks, all-MiniLM-L6-v2, "
            f"{real['dtype']}, HNSW {real['hnsw']}, manifest `{real['manifest_id']}`.",
            "",
            "| figure | value |",
            "|---|---|",
            f"| build: encode | {b['encode_s']:,.0f} s = {b['encode_passages_per_s']} passages/s |",
            f"| build: HNSW index | {b['index_s']:,.1f} s = {b['index_passages_per_s']:,.0f} passages/s |",
            f"| build: total | {b['total_passages_per_s']} passages/s |",
            f"| recall@5 HNSW vs exact, same vectors ({real['n_recall_queries']:,} NQ-Open dev questions) | "
            f"**{real['recall_at_5_vs_exact']:.4f}** (target >= 0.99) |",
            f"| search p50 / p99, HNSW only | {real['latency_hnsw_only']['p50_ms']} / {real['latency_hnsw_only']['p99_ms']} ms |",
            f"| search p50 / p99, HNSW + SQLite passages | {real['latency_hnsw_plus_sqlite']['p50_ms']} / "
            f"{real['latency_hnsw_plus_sqlite']['p99_ms']} ms |",
            f"| search p50 / p99, with query encoding | {real['latency_with_query_encoding']['p50_ms']} / "
            f"{real['latency_with_query_encoding']['p99_ms']} ms |",
            f"| answer hit@5 ({real['nq_gold_questions']:,} NQ-Open gold questions: an answer string in the top 5) | "
            f"{real['answer_hit_at_5']:.4f} |",
            f"| gold-passage hit@5 (the gold passage's text in the top 5) | {real['gold_passage_hit_at_5']:.4f} |",
            f"| `open_retriever` (manifest, sampled checksums, usearch view, SQLite), median of 5 | "
            f"{real['open_retriever_ms_median']} ms |",
            f"| files | {', '.join(f'{k} {v} MB' for k, v in real['files_mb'].items())} |",
            "",
        ]
    if scale:
        lines += [
            f"**Scale**: `{scale_cmd}`, {scale['machine']['date']}, {scale['machine']['cpus']} shared CPU cores. "
            f"{scale['n']:,} synthetic {scale['dims']}-d vectors, a Zipf-sized Gaussian mixture in a 64-d latent "
            f"space lifted to {scale['dims']}-d (clustered, not uniform); {scale['queries']:,} held-out queries "
            f"from the same mixture; recall@5 against exact float32 search; HNSW connectivity "
            f"{scale.get('connectivity', 16)}, expansion_add {scale.get('expansion_add', 128)}; latency is one query at a time, "
            "without encoding; open and memory each in a fresh process (RSS growth over the interpreter).",
            "",
            "| dtype | ef | recall@5 | p50 ms | p99 ms |",
            "|---|---|---|---|---|",
        ]
        for dtype in ("f16", "i8", "f32"):
            if dtype not in scale:
                continue
            for key, v in scale[dtype].items():
                if key.startswith("ef"):
                    lines.append(f"| {dtype} | {key[2:]} | {v['recall_at_5']:.4f} | {v['p50_ms']} | {v['p99_ms']} |")
        lines += ["", "| dtype | file | build | open view | open load | RSS after open (view / load) | "
                  "RSS after 10k queries (view / load) |", "|---|---|---|---|---|---|---|"]
        for dtype in ("f16", "i8", "f32"):
            if dtype not in scale:
                continue
            d = scale[dtype]
            v, ld = d["open_view"], d["open_load"]
            lines.append(
                f"| {dtype} | {d['file_mb']:,} MB | {d['add_s']:,} s ({d['add_vectors_per_s']:,}/s) | {v['open_ms']} ms | "
                f"{ld['open_ms']} ms | {v['rss_after_open_mb']} / {ld['rss_after_open_mb']} MB | "
                f"{v['rss_after_queries_mb']} / {ld['rss_after_queries_mb']} MB |"
            )
        lines.append("")
        for dtype in ("f16", "i8", "f32"):
            if dtype not in scale:
                continue
            efs = sorted((int(k[2:]), v) for k, v in scale[dtype].items() if k.startswith("ef"))
            ok = [ef for ef, v in efs if v["recall_at_5"] >= 0.97]
            best = max(v["recall_at_5"] for _, v in efs)
            lines.append(
                f"- {dtype}: recall@5 >= 0.97 from expansion_search {ok[0]}" if ok else
                f"- {dtype}: recall@5 stays below 0.97 (best {best:.4f}): the loss is quantisation, not the graph "
                "(the components of a 384-d unit vector are ~0.05, a few i8 steps; exact search over the same i8 "
                "vectors is no better, and scaling the inputs first changes nothing)"
            )
        lines += ["- `view=True` maps the file, but usearch visits every node header to build its offset "
                  "table, so open time grows linearly with the number of vectors; shards keep each open short.", ""]
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str) -> None:
    """Replace the Index section of a Markdown file (up to the next `## `), leaving the rest alone."""
    text = path.read_text(encoding="utf-8")
    start = text.index(SECTION)
    nxt = text.find("\n## ", start + len(SECTION))
    end = len(text) if nxt == -1 else nxt + 1
    path.write_text(text[:start] + section + ("\n" if nxt != -1 else "") + text[end:], encoding="utf-8")

# ----------------------------------------------------------------------------------------- main
def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="part", required=True)
    r = sub.add_parser("real")
    r.add_argument("--index", type=Path, default=DEFAULT_REAL, help=f"(default: {DEFAULT_REAL})")
    r.add_argument("--recall-queries", type=int, default=1000)
    r.add_argument("--latency-queries", type=int, default=300)
    s = sub.add_parser("scale")
    s.add_argument("--n", type=int, default=1_000_000)
    s.add_argument("--work", type=Path, default=Path("/tmp/bench-index-scale"))
    s.add_argument("--dtypes", nargs="+", default=["f16", "i8"])
    s.add_argument("--ef", type=int, nargs="+", default=[64, 128])
    s.add_argument("--queries", type=int, default=1000)
    s.add_argument("--connectivity", type=int, default=16)
    s.add_argument("--expansion-add", type=int, default=128)
    for q in (r, s):
        q.add_argument("--output-dir", type=Path, default=REPO / "runs" / "bench_index")
    rep = sub.add_parser("report", help="print the Index section from saved results (--benchmarks: also write it)")
    rep.add_argument("--real-json", type=Path, default=REPO / "runs" / "bench_index" / "real.json")
    rep.add_argument("--scale-json", type=Path, default=REPO / "runs" / "bench_index" / "scale.json")
    rep.add_argument("--real-cmd", default="python scripts/bench/bench_index.py real")
    rep.add_argument("--scale-cmd", default="python scripts/bench/bench_index.py scale --n 1000000")
    rep.add_argument("--benchmarks", type=Path, help="a Markdown file whose Index section to replace")
    rep.add_argument("--note", action="append", default=[], help="a paragraph to add at the end")
    probe = sub.add_parser("_probe")
    probe.add_argument("path")
    probe.add_argument("mode", choices=["view", "load"])
    probe.add_argument("queries")
    probe.add_argument("n", type=int)
    return p


def main(argv: list[str] | None = None) -> None:
    args = setup_arg_parser().parse_args(argv)
    if args.part == "_probe":
        print(json.dumps(_open_probe(args.path, args.mode == "view", args.queries, args.n)))
        return
    if args.part == "report":
        load = lambda p: json.loads(p.read_text()) if p.is_file() else None  # noqa: E731
        section = render(load(args.real_json), load(args.scale_json), args.real_cmd, args.scale_cmd)
        section += "".join(f"{note}\n\n" for note in args.note)
        if args.benchmarks:
            write_section(args.benchmarks, section)
        print(section)
        return
    if args.part == "real":
        res = bench_real(args.index, args.recall_queries, args.latency_queries)
    else:
        res = bench_scale(args.n, args.work, args.dtypes, args.ef, args.queries, args.connectivity,
                          args.expansion_add)
    res["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(),
                      "date": time.strftime("%Y-%m-%d %H:%M")}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    path = args.output_dir / f"{args.part}.json"
    path.write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
