"""`python -m targ_mlx.eval`: records (batched), batch-1 timings on a sample, then every table
and plot of the paper's evaluation under --output-dir. Rerunning continues where it stopped."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

from targ_mlx import bind_openblas

bind_openblas()  # an entry point: bind before the imports below load mlx.core
from targ_mlx.eval.datasets import DATASETS, DEFAULT_LIMIT, dataset_name, load_hf, max_tokens_for, read_jsonl, sample
from targ_mlx.eval.record import EVAL_DEFAULTS, K_MAX, EvalSettings, eval_answer
from targ_mlx.eval.run import DEFAULT_BATCH, DEFAULT_LATENCY_SAMPLE
from targ_mlx.retrieval import RETRIEVER_HELP, RETRIEVERS
from targ_mlx.session import add_flags, flag_fields, given

logger = logging.getLogger(__name__)


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m targ_mlx.eval",
                                description="Evaluate TARG gates, Never/Always and the baselines from one pass per question.")
    p.add_argument("--dataset", nargs="+", default=[], choices=DATASETS, metavar="NAME",
                   help=f"Hugging Face dataset by name (needs a network): {', '.join(DATASETS)}")
    p.add_argument("--data-file", nargs="+", default=[], metavar="PATH.jsonl",
                   help='JSONL with {"question", "answers": [...]} lines (e.g. ../shared/data/qa/nq_open_dev.jsonl)')
    p.add_argument("--name", nargs="+", default=[], metavar="NAME",
                   help="output names per dataset, in order (default: the dataset name or the data file's stem)")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help=f"seeded sample size per dataset (default {DEFAULT_LIMIT}; 0 = all)")
    p.add_argument("--index", help="index folder (default: the offline default index)")
    p.add_argument("--retriever", choices=RETRIEVERS, help=RETRIEVER_HELP)
    p.add_argument("--model", default=None, help="alias (qwen2.5-coder-1.5b, smollm2-135m), .gguf path, MLX folder or mlx-lm "
                   "repo id (default: the model of the records already in --output-dir, else the 1.5B where installed)")
    p.add_argument("--output-dir", required=True, help="where records, tables and plots go (one subfolder per dataset when several)")
    p.add_argument("--k-max", type=int, default=K_MAX, help=f"longest draft recorded; k in {{5,10,20,30,40}} read its prefixes (default {K_MAX})")
    # the answer settings: the same flags as targ ask's, the eval's own defaults (record.EVAL_DEFAULTS)
    add_flags(p, "eval", {**EVAL_DEFAULTS, "max_tokens": "32; 50 for musique"}, from_config=False)
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH, help=f"questions decoded together (default {DEFAULT_BATCH})")
    p.add_argument("--latency-sample", type=int, default=DEFAULT_LATENCY_SAMPLE,
                   help=f"questions timed at batch 1 for the latency columns (default {DEFAULT_LATENCY_SAMPLE})")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for CIs (default 1000)")
    p.add_argument("--no-baselines", action="store_true", help="skip the reflective baselines' probes")
    p.add_argument("--no-plots", action="store_true", help="tables only")
    p.add_argument("--report-only", action="store_true", help="rebuild tables and plots from existing records; run no model")
    p.add_argument("--reuse-records", metavar="DIR",
                   help="the same run over another corpus (its --output-dir): reuse each question's draft, samples, "
                        "Never answer and corpus-free probes, and compute only retrieval, the Always answer and "
                        "CRAG-lite's grade for this --index")
    p.add_argument("--split-pool", type=int, metavar="N",
                   help="extend a cell first recorded at --limit N to a larger --limit: its N questions keep their "
                        "place, the dev/test split stays drawn over them, and every added question is test (held out "
                        "from the budgets and calibrations chosen on dev); default: the pool the folder was extended "
                        "under, else none")
    p.add_argument("--db", help="also write every per-question decision to this decision-log file")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _datasets(args) -> list[tuple[str, list]]:
    out = []
    for name in args.dataset:
        out.append((name, load_hf(name)))
    for path in args.data_file:
        out.append((dataset_name(path, None), read_jsonl(path)))
    if args.name:
        if len(args.name) != len(out):
            raise ValueError(f"--name needs one name per dataset ({len(out)}), got {len(args.name)}")
        out = [(n, items) for n, (_, items) in zip(args.name, out)]
    if not out:
        raise ValueError("give --dataset NAME or --data-file PATH.jsonl (for example ../shared/data/qa/nq_open_dev.jsonl)")
    return out


def _bar(desc: str, quiet: bool):
    if quiet:
        return None
    from tqdm import tqdm

    bar = {"t": None}

    def cb(done: int, total: int) -> None:
        if bar["t"] is None:
            bar["t"] = tqdm(total=total, desc=desc, unit="q", initial=done, dynamic_ncols=True)
        bar["t"].n = done
        bar["t"].refresh()
        if done >= total:
            bar["t"].close()

    return cb


def _versions() -> dict:
    import importlib.metadata as md
    import platform

    v = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("mlx", "mlx-lm", "numpy", "usearch", "sentence-transformers", "targ-mlx"):
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            v[pkg] = None
    return v


def evaluate_dataset(name, items, args, out: Path, bb, retriever, log, session, pool: int | None = None,
                     opened=None) -> dict:
    """`opened`: the session's `index` (what the log and config.json name), None for --report-only."""
    from targ_mlx.eval import report
    from targ_mlx.session import default_model
    from targ_mlx.eval.record import fill_scores
    from targ_mlx.eval.run import in_item_order, latency_items, read_jsonl, run_latency, run_records, write_jsonl

    out.mkdir(parents=True, exist_ok=True)
    answer = eval_answer(**{**given(args), "max_tokens": args.max_tokens or max_tokens_for(name)})
    s = EvalSettings(answer, k_max=args.k_max, baselines=not args.no_baselines)
    s = replace(s, ks=tuple(k for k in s.ks if k <= s.k_max) or (s.k_max,))
    run_info: dict = {}
    if not args.report_only:
        t0 = time.perf_counter()
        before = len(read_jsonl(out / "records.jsonl"))
        timed_before = len(read_jsonl(out / "latency.jsonl"))
        timed_ids = {it.id for it in latency_items(items, args.latency_sample, args.seed)}
        lat_s = [0.0]

        def time_some(rows):  # batch-1 timings interleaved, so a cut-short run still has some
            t1 = time.perf_counter()
            todo = [it for it in items if it.id in timed_ids and it.id in {r["id"] for r in rows}]
            run_latency(bb, retriever, todo, {r["id"]: r["never"]["answer"] for r in rows}, s, out)
            lat_s[0] += time.perf_counter() - t1

        reuse = _reusable(args.reuse_records, name, out, s, bb.model_id)
        records = run_records(bb, retriever, items, s, out, args.batch_size, _bar(f"{name} records", args.quiet),
                              log=log, log_k=args.k, session=session, index_id=opened.manifest_id if opened else None,
                              after_batch=time_some, reuse=reuse)
        _fill_hits(out, records, items, retriever, s.answer.top_k)
        rec_s = time.perf_counter() - t0 - lat_s[0]
        new = len(records) - before
        run_info = {"records_new": new, "records_seconds": rec_s,
                    "questions_per_hour": 3600.0 * new / rec_s if new and rec_s > 0 else None,
                    # what ran, so a throughput is read against its kernels and page size
                    "kernels": bb.info.get("kernels"), "huge_pages_bytes": bb.info.get("huge_pages")}
        never = {r["id"]: r["never"]["answer"] for r in records}
        timed = [it for it in items if it.id in timed_ids and it.id in never]
        t0 = time.perf_counter()
        run_latency(bb, retriever, timed, never, s, out)  # any left over from an earlier cut-short run
        run_info["latency_seconds"] = lat_s[0] + time.perf_counter() - t0
        run_info["latency_new"] = len(read_jsonl(out / "latency.jsonl")) - timed_before
    records = in_item_order(out / "records.jsonl", items)
    prev = out / "config.json"
    old = _config(out) or {}  # the config of the run that made the records
    model = bb.model_id if bb is not None else old.get("model") or args.model or default_model()
    if fill_scores(records, model, s.answer.beta):  # a gate registered after the records were made
        write_jsonl(out / "records.jsonl", records)
    latency = {r["id"]: r for r in read_jsonl(out / "latency.jsonl")}
    config = {"dataset": name, "n_items": len(items), "args": {**vars(args), "split_pool": pool},
              "settings": s.to_dict(), "versions": _versions(), "model": bb.model_id if bb is not None else (args.model or "smollm2-135m"),
              "index": str(args.index), "run": run_info,
              **(_corpus_info(opened) if retriever else _corpus_info_from({"index": args.index})),
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    nothing_new = not args.report_only and not run_info["records_new"] and not run_info["latency_new"]
    if prev.is_file() and (args.report_only or nothing_new):  # keep the settings the records were made with
        found = _corpus_info_from(old) or (_corpus_info(opened) if nothing_new else {})
        config = {**old, **found, "report_date": config["date"], "versions": config["versions"]}
    elif prev.is_file():  # a resumed run: keep every run's throughput (a first run's is only in "run")
        config["runs"] = (old.get("runs") or ([old["run"]] if old.get("run") else [])) + [run_info]
    prev.write_text(json.dumps(config, indent=2, default=str))
    return report.write_all(name, records, latency, out, k=args.k, seed=args.seed, n_boot=args.bootstrap,
                            plots=not args.no_plots, config=config, meta={it.id: it.meta for it in items})


def _reusable(folder: str | None, name: str, out: Path, s: EvalSettings, model: str) -> dict[str, dict]:
    """Records of the same run over another corpus, by question id (checked to be interchangeable)."""
    if not folder:
        return {}
    from targ_mlx.eval.run import corpus_free_source

    src, records, diff = corpus_free_source(Path(folder), name, {"model": model, "settings": s.to_dict()})
    if src.resolve() == out.resolve():
        return {}
    if diff:
        raise ValueError(f"--reuse-records {src}: made with other settings: {', '.join(diff)}; "
                         "fix: give the same settings, or drop --reuse-records")
    return records


def _fill_hits(out: Path, records: list[dict], items, retriever, top_k: int) -> None:
    """Records written before answer hit@K was recorded get it from a search of the same index (no model)."""
    from targ_mlx.eval.metrics import contains
    from targ_mlx.eval.run import RECORDS, read_jsonl, write_jsonl

    todo = [r for r in records if "hit" not in r["always"]]
    if not todo:
        return
    answers = {it.id: it.answers for it in items}
    found = retriever.search_batch([r["question"].strip() for r in todo], top_k)
    hit = {r["id"]: contains(" ".join(h.text for h in hits), answers.get(r["id"], r["answers"]))
           for r, hits in zip(todo, found)}
    rows = read_jsonl(out / RECORDS)  # every row, also those of questions outside this --limit
    for r in rows:
        if r["id"] in hit:
            r["always"]["hit"] = hit[r["id"]]
    write_jsonl(out / RECORDS, rows)


def _corpus_info(opened) -> dict:
    """From the session's `index` (what `targ_mlx.index.describe` says of it), or None."""
    from targ_mlx.eval.report import corpus_regime

    corpora = list(opened.corpora) if opened is not None else []
    mode = opened.mode if opened is not None else "dense"  # bm25 or hybrid where searched so
    return {"corpora": corpora, "corpus_regime": corpus_regime(corpora), "retriever": mode} if corpora else {}


def _corpus_info_from(cfg: dict) -> dict:
    """Older configs name only the index folder: read its manifest if it is still there."""
    if "corpus_regime" in cfg:
        return {}
    man = Path(str(cfg.get("index", "")), "manifest.json")
    if man.is_file():
        from targ_mlx.eval.report import corpus_regime

        corpora = json.loads(man.read_text()).get("build", {}).get("corpora", [])
        return {"corpora": corpora, "corpus_regime": corpus_regime(corpora)}
    return {}


def _config(folder: Path) -> dict | None:
    """The config.json an earlier run wrote into `folder`, None where there is none."""
    path = folder / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _resumed_retriever(root: Path, names: list[str]) -> str | None:
    """The search mode of the run whose records are already there (dense for runs made before
    BM25 existed), so that a resumed run adds records searched the same way; None for a new run."""
    for out in [root] + [root / n for n in names]:
        cfg = _config(out)
        if cfg is not None:
            return cfg.get("retriever", "dense")
    return None


def _resumed_model(args, outs: list[Path]) -> str | None:
    """The model to record with: --model, else the one whose records are already in the output folders.

    A resumed run that loaded the default model instead would append another model's records to
    the cell (its dev/test statistics would mix two models), so a --model other than the
    recorded one is refused with the fix.
    """
    from targ_mlx.session import model_key

    recorded = {}
    for out in outs:
        theirs = (out / "records.jsonl").is_file() and (_config(out) or {}).get("model")
        if theirs:
            recorded[out] = theirs
    models = set(recorded.values())
    if len(models) > 1:
        raise ValueError(f"--output-dir {args.output_dir}: its folders were recorded with {', '.join(sorted(models))}; "
                         "fix: extend each model's folders in their own run")
    if not models:
        return args.model
    (model,) = models
    if args.model is not None and model_key(args.model) != model:
        where = next(iter(recorded))
        raise ValueError(f"--model {args.model}: {where} holds records of {model}; fix: pass --model {model}, "
                         "or another --output-dir")
    return args.model or model


def _split_pool(args, out: Path) -> int | None:
    """The --split-pool for one dataset's folder: the flag, else the one its records were extended under."""
    from targ_mlx.eval.sweep import split_pool

    recorded = split_pool(_config(out))
    if args.split_pool is None:  # a rerun or --report-only of an extended cell keeps its questions' order
        return recorded if recorded is not None and (not args.limit or args.limit > recorded) else None
    if recorded is not None and recorded != args.split_pool:
        raise ValueError(f"--split-pool {args.split_pool}: {out} was extended with --split-pool {recorded}; "
                         f"fix: pass --split-pool {recorded} (its dev half is drawn over those questions)")
    return args.split_pool


def run(args) -> int:
    named = _datasets(args)
    root = Path(args.output_dir)
    outs = {name: root if len(named) == 1 else root / name for name, _ in named}
    pools = {name: _split_pool(args, out) for name, out in outs.items()}
    sets = [(name, sample(items, args.limit or None, args.seed, pools[name])) for name, items in named]
    bb = retriever = log = opened = None
    session = f"eval-{uuid.uuid4().hex[:8]}"
    if not args.report_only:
        from targ_mlx.session import default_model, load_config, open_session

        # an interrupted build of the index (default or --index) is resumed, not refused
        retriever_mode = args.retriever or _resumed_retriever(root, [n for n, _ in sets])
        args.model = _resumed_model(args, list(outs.values()))
        config = load_config().merged(model=args.model or default_model(), index=(args.index,) if args.index else (),
                                      retriever=retriever_mode, db=args.db)
        opened_session = open_session(config, log=bool(args.db), source="eval", long_running=True,
                                      index_when="eager", quiet=args.quiet)
        bb, retriever, log, opened = (opened_session.backbone, opened_session.retriever, opened_session.log,
                                      opened_session.index)
        args.index, args.retriever = str(opened.paths[0]), retriever_mode
    summaries = {}
    for name, items in sets:
        out = outs[name]
        summaries[name] = evaluate_dataset(name, items, args, out, bb, retriever, log, session, pools[name], opened)
        print((out / "summary.md").read_text(encoding="utf-8"))
    if len(sets) > 1:
        from targ_mlx.eval import report

        text = report.transfer_table(summaries, k=args.k)
        (root / "transfer.md").write_text(text, encoding="utf-8")
        overview = report.overview_table(summaries)
        (root / "overview.md").write_text(overview, encoding="utf-8")
        print(text + "\n" + overview)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = setup_arg_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from targ_mlx.errors import run_main

    return run_main(_resolved_then_run, args, interrupted="interrupted; rerun the same command to continue")


def _resolved_then_run(args) -> int:
    """Bad values are one line before anything loads; the run reads the eval's defaults from args
    as if given (max_tokens stays per dataset when not given: `max_tokens_for`)."""
    answer = eval_answer(**given(args))
    vars(args).update({name: getattr(answer, name) for name in flag_fields("eval") if name != "max_tokens"})
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
