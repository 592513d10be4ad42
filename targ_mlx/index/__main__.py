"""`python -m targ_mlx.index build|add|lexical|info|search`: build, update, inspect and query an on-disk index."""

from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path

from targ_mlx.errors import run_cli
from targ_mlx.index.build import DEFAULT_COMMIT_EVERY
from targ_mlx.index.distributed import DEFAULT_SHARD_SIZE
from targ_mlx.index.encoder import BACKENDS, DEFAULT_BATCH_SIZE, DEFAULT_ENCODER
from targ_mlx.index.progress import ProgressBar
from targ_mlx.index.lexical import fix_command, lexical_summary
from targ_mlx.index.store import DTYPES, HnswParams
from targ_mlx.retrieval import RETRIEVER_HELP, RETRIEVERS

DEFAULT_K = 5
_WRITE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EFBIG, errno.EDQUOT}  # the disk said no


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m targ_mlx.index", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="build (or resume) an index folder from corpora")
    b.add_argument("--corpus", nargs="+", required=True,
                   help="vital-articles | PATH.jsonl | PATH.xml.bz2 | PATH.parquet | hf:wikimedia/wikipedia:CONFIG")
    b.add_argument("--out", required=True, help="index folder (appears only when complete)")
    b.add_argument("--encoder", default=DEFAULT_ENCODER, help=f"sentence-transformers model (default: {DEFAULT_ENCODER})")
    b.add_argument("--backend", choices=BACKENDS,
                   help="encoder backend (default: the one an existing build in --out used, else torch-bf16 "
                        "where the CPU has AMX-BF16, else mlx-bf16 where it has AVX512-BF16 (1.85x float32 on "
                        "Zen 4, top-5 results 0.996 the same), else mlx where it runs, else torch: both "
                        "float32, the same vectors; onnx-int8 is faster on AVX2 with top-5 results 0.875 the same)")
    b.add_argument("--dtype", choices=DTYPES, default="f16", help="stored vector type (default: f16)")
    b.add_argument("--limit", type=int, help="read at most N articles")
    b.add_argument("--connectivity", type=int, default=HnswParams.connectivity,
                   help=f"HNSW graph degree (default: {HnswParams.connectivity})")
    b.add_argument("--expansion-add", type=int, default=HnswParams.expansion_add,
                   help=f"HNSW build beam (default: {HnswParams.expansion_add})")
    b.add_argument("--expansion-search", type=int, default=HnswParams.expansion_search,
                   help=f"HNSW search beam recorded as the index's serving default; rerun the build to change it (default: {HnswParams.expansion_search})")
    b.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                   help=f"encoder batch size (default: {DEFAULT_BATCH_SIZE})")
    b.add_argument("--commit-every", type=int, default=DEFAULT_COMMIT_EVERY,
                   help=f"chunks per encode call and per resumable commit (default: {DEFAULT_COMMIT_EVERY})")
    b.add_argument("--reuse", nargs="+", default=[], metavar="DIR",
                   help="finished indexes (same encoder) to take vectors from for identical chunks")
    b.add_argument("--bm25", action=argparse.BooleanOptionalAction, default=True,
                   help="also build the BM25 part for lexical and hybrid search (default: yes)")
    b.add_argument("--dense", action=argparse.BooleanOptionalAction, default=True,
                   help="encode and store every passage's vector (default: yes); --no-dense builds a "
                        "BM25-only index at reading speed (a million chunks in minutes, not hours) whose "
                        "searches encode only the passages they return")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    _writer_flags(b)
    r = b.add_argument_group("distributed build (pip install 'targ-mlx[distributed]')")
    r.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="build on Ray as a sharded index: alone, on a local Ray started for the build; "
                        "with an address ('auto', 'ray://HOST:10001'), on that cluster")
    r.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE,
                   help=f"chunks per shard of a --ray build (default: {DEFAULT_SHARD_SIZE:,})")
    r.add_argument("--workers", type=int,
                   help="encoder actors (default: one per GPU with --gpus-per-worker, else one per --cpus-per-worker CPUs)")
    r.add_argument("--cpus-per-worker", type=float, default=1, help="CPUs per encoder actor (default: 1)")
    r.add_argument("--gpus-per-worker", type=float, default=0, help="GPUs per encoder actor (default: 0)")

    a = sub.add_parser("add", help="add or update folders of documents in a built index (changed files only)")
    a.add_argument("dir", help="a built index folder")
    a.add_argument("--corpus", nargs="+", required=True, metavar="FOLDER",
                   help="folders of .md/.txt/.html/.pdf files: new and changed files are (re)indexed, "
                        "removed files' passages deleted")
    a.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                   help=f"encoder batch size (default: {DEFAULT_BATCH_SIZE})")
    a.add_argument("--commit-every", type=int, default=DEFAULT_COMMIT_EVERY,
                   help=f"chunks per encode call and per resumable commit (default: {DEFAULT_COMMIT_EVERY})")
    a.add_argument("--quiet", action="store_true", help="no progress bar")
    _writer_flags(a)

    x = sub.add_parser("lexical", help="(re)build the BM25 part of a built index from its passages")
    x.add_argument("dir", help="a built index folder")
    x.add_argument("--wait", action="store_true", help="wait for another writer of DIR instead of stopping")

    i = sub.add_parser("info", help="print an index's manifest summary")
    i.add_argument("dir")
    i.add_argument("--verify", action="store_true", help="check whole-file sha256 checksums")
    i.add_argument("--json", action="store_true", help="print the full manifest as JSON")

    s = sub.add_parser("search", help="top-k passages for a query")
    s.add_argument("dir")
    s.add_argument("query")
    s.add_argument("-k", type=int, default=DEFAULT_K, help=f"passages to return (default: {DEFAULT_K})")
    s.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    s.add_argument("--expansion-search", type=int, help="HNSW ef for this search (default: the index's)")
    s.add_argument("--retriever", choices=RETRIEVERS, help=RETRIEVER_HELP)
    return parser


def _writer_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true",
                   help="a document that cannot be read (corrupt PDF, not UTF-8) is an error, not a skip")
    p.add_argument("--wait", action="store_true",
                   help="if another build or add is writing this index, wait for it instead of stopping")


def _build(args) -> None:
    from targ_mlx.index.build import build_index

    if args.ray is not None:
        _build_ray(args)
        return
    out = build_index(
        args.corpus, args.out, encoder=args.encoder, dtype=args.dtype, limit=args.limit,
        connectivity=args.connectivity, expansion_add=args.expansion_add,
        expansion_search=args.expansion_search, batch_size=args.batch_size, commit_every=args.commit_every,
        reuse=args.reuse, backend=args.backend, bm25=args.bm25, dense=args.dense, strict=args.strict, wait=args.wait,
        progress=None if args.quiet else ProgressBar(),
    )
    _info(out, verify=False, as_json=False)


def _build_ray(args) -> None:
    from targ_mlx.index.distributed import build_index_ray

    if args.reuse or args.strict:
        raise ValueError("--reuse and --strict are not supported with --ray; fix: drop them")
    if not args.dense:
        raise ValueError("--no-dense is not supported with --ray (it exists to encode in parallel); fix: drop --ray")
    if not args.bm25:
        raise ValueError("--no-bm25 is not supported with --ray (its BM25 part spans the shards); fix: drop one of them")
    if args.backend not in (None, "torch"):
        raise ValueError(f"--backend {args.backend} is not supported with --ray (its actors run torch); fix: drop one of them")
    out = build_index_ray(
        args.corpus, args.out, address=None if args.ray == "local" else args.ray, shard_size=args.shard_size,
        workers=args.workers, cpus_per_worker=args.cpus_per_worker, gpus_per_worker=args.gpus_per_worker,
        encoder=args.encoder, dtype=args.dtype, limit=args.limit, connectivity=args.connectivity,
        expansion_add=args.expansion_add, expansion_search=args.expansion_search, batch_size=args.batch_size,
        commit_every=args.commit_every, progress=None if args.quiet else ProgressBar(), wait=args.wait,
    )
    _info(out, verify=False, as_json=False)


def _add(args) -> None:
    from targ_mlx.index.update import add_documents

    plan = add_documents(args.dir, args.corpus, progress=None if args.quiet else ProgressBar(),
                         batch_size=args.batch_size, commit_every=args.commit_every, strict=args.strict,
                         wait=args.wait)
    print(f"{args.dir}: {plan.summary() if not plan.empty else 'up to date'}")
    _print_skipped({"build": {"skipped": plan.skipped}})


def _info(path, verify: bool, as_json: bool) -> None:
    from targ_mlx.index.retriever import open_retriever
    from targ_mlx.index.store import IndexInfo

    r = open_retriever(path, verify=verify)
    if as_json:
        print(json.dumps(r.manifest, indent=2, sort_keys=True))
        return
    info = IndexInfo.of(r.path, r.manifest)
    for key, value in info.to_dict().items():
        print(f"{key:12} {value}")
    print(f"{'timing':12} {r.manifest['timing']}")
    for c in r.manifest.get("corpora") or []:  # a dropped file shows as a source with fewer passages
        print(f"{'source':12} {c['source']}: {c['passages']:,} passages from {c['articles']:,} articles/documents")
    lex = lexical_summary(r.path)
    print(f"{'bm25':12} " + (f"{lex['passages']:,} passages, {lex.get('kind', 'bm25s')} ({lex['build_s']} s)"
                              if lex else f"none (hybrid search needs it: {fix_command(r.path)})"))
    _print_skipped(r.manifest)


def _print_skipped(manifest: dict) -> None:
    """One line per file of a documents folder left out as unreadable."""
    for folder, bad in (manifest.get("build", {}).get("skipped") or {}).items():
        for rel, why in bad.items():
            print(f"{'skipped':12} {folder}/{rel}: {why}")


def _search(args) -> None:
    from targ_mlx.index.merged import open_indexes

    r = open_indexes([args.dir], expansion_search=args.expansion_search, retriever=args.retriever)
    for p in r.search(args.query, args.k):
        bm25 = None if p.bm25 is None else round(p.bm25, 3)
        if args.json:
            print(json.dumps({"key": p.key, "score": round(p.score, 4), "bm25": bm25, "title": p.title, "text": p.text}))
        else:
            print(f"{p.score:.3f}" + ("" if bm25 is None else f" bm25 {bm25:6.2f}") + f"  {p.format()[:300]}")


def _lexical(args) -> None:
    from targ_mlx.index.lexical import add_lexical
    from targ_mlx.index.lock import index_lock
    from targ_mlx.index.store import read_manifest

    read_manifest(args.dir)  # a finished index, or one line saying what is wrong
    with index_lock(Path(args.dir), wait=args.wait):  # one writer: a build or add of DIR may be running
        meta = add_lexical(args.dir)
    print(f"{args.dir}: BM25 over {meta['passages']:,} passages ({meta['kind']}) in {meta['build_s']} s")


def _run(args: argparse.Namespace) -> int:
    import sqlite3

    try:
        return _dispatch(args)
    except (OSError, sqlite3.OperationalError) as e:  # a read-only folder, a full disk: one line
        from targ_mlx.index.errors import IndexWriteError

        if isinstance(e, OSError) and e.errno not in _WRITE_ERRNOS:
            raise
        where = getattr(e, "filename", None) or getattr(args, "out", None) or args.dir
        raise IndexWriteError(
            f"cannot write {where} ({getattr(e, 'strerror', None) or e}); fix: free disk space or make "
            "the folder writable, then rerun the same command to resume"
        ) from None


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "build":
        _build(args)
    elif args.command == "add":
        _add(args)
    elif args.command == "lexical":
        _lexical(args)
    elif args.command == "info":
        _info(args.dir, args.verify, args.json)
    else:
        _search(args)
    return 0


def main(argv: list[str] | None = None) -> int:
    from targ_mlx._blas import bind_openblas

    bind_openblas()  # before mlx.core loads: the mlx encoder's matrix products run on it
    return run_cli(setup_arg_parser(), _run, argv)


if __name__ == "__main__":
    sys.exit(main())
