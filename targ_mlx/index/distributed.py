"""Build an index on Ray: read -> chunk -> encode -> per-shard HNSW, as one Ray Data pipeline.

    DIR/manifest.json           the union: encoder, dtype, counts, corpora, the shard list, and the
                                files of every shard (so `info` and the checksum checks cover them)
    DIR/shards/UUU-BBBBBB/      a complete single-process-format index (vectors.usearch,
                                passages.db, manifest.json): block BBBBBB of `shard_size`
                                consecutive chunks of input unit UUU

An input unit is one corpus, so several dump or parquet files are read and chunked in parallel
(with `limit` all corpora form one unit, because the limit counts articles across them). Encoding
runs in a pool of actors, one per GPU or per `cpus_per_worker` CPUs, each holding the encoder.
The driver streams the encoded rows in order into each shard's store and hands a finished shard
to a Ray task, pinned to the driver's node, that builds its graph. So DIR must be on the driver's
filesystem, and every node needs targ-mlx (and the encoder) installed.

Resumable per shard: finished shards are skipped at read time, so their chunks are never encoded
again; a shard whose rows were all stored but whose graph was not built is only finalized; a shard
cut off mid-stream is redone. DIR appears only when every shard is finished, as in `build.py`.
"""

from __future__ import annotations

import functools
import logging
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from targ_mlx.index.spec import build_spec, countable, iter_chunks, same_build
from targ_mlx.index.stages import (
    DEFAULT_COMMIT_EVERY,
    Progress,
    build_hnsw,
    finish,
    manifest_for,
    open_db,
    open_partial,
    publish,
)
from targ_mlx.index.lexical import build_lexical_from, lexical_dir
from targ_mlx.index.chunking import ChunkParams
from targ_mlx.index.corpus import read_corpus
from targ_mlx.index.encoder import DEFAULT_BATCH_SIZE, DEFAULT_ENCODER, TORCH, canonical_name, load_encoder
from targ_mlx.index.lock import writes_index
from targ_mlx.index.errors import IndexError_, IndexMismatchError
from targ_mlx.index.store import (
    DTYPES,
    MANIFEST,
    PASSAGES,
    HnswParams,
    read_manifest,
    rebuild_command,
)

logger = logging.getLogger(__name__)

SHARDS = "shards"
# 30M chunks of full English Wikipedia make ~60 shards: each one's graph builds in minutes, a
# resumed build loses at most one shard's encoding, and a query searches few enough graphs
DEFAULT_SHARD_SIZE = 500_000
_READ_BLOCK = 256  # chunks per Ray Data block leaving a read task: several blocks keep every actor busy
# reading and chunking is light beside encoding; any CPU reserved for it is taken from the actors,
# and with every CPU held by an actor a read task that asks for some never starts (a hang)
_READ_CPUS = 0


class RayMissingError(IndexError_):
    pass


def shard_name(unit: int, block: int) -> str:
    return f"{unit:03d}-{block:06d}"


def input_units(corpora: Sequence[str], limit: int | None) -> list[list[str]]:
    return [list(corpora)] if limit else [[c] for c in corpora]


def _import_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise RayMissingError(
            "Ray is not installed; fix: pip install 'targ-mlx[distributed]' (or pip install 'ray[data]')"
        ) from None
    return ray


# -- pipeline stages (run in Ray workers) -----------------------------------------------------


def _read_unit(unit: int, corpora: list[str], limit: int | None, params: ChunkParams, shard_size: int,
               skip: frozenset[str]) -> Iterator:
    """Yield pyarrow blocks of the chunks of one input unit, tagged with their shard."""
    import pyarrow as pa

    cols: dict[str, list] = {k: [] for k in ("key", "title", "text", "article", "source", "start", "end", "shard")}

    def block():
        table = pa.table({k: cols[k] for k in cols})
        for v in cols.values():
            v.clear()
        return table

    for i, c in enumerate(iter_chunks(corpora, params, limit)):
        shard = shard_name(unit, i // shard_size)
        if shard in skip:
            continue  # finished in an earlier run: chunked again (cheap), never encoded again
        for k, v in zip(cols, (c.key, c.title, c.text, c.article, c.source, c.start, c.end, shard)):
            cols[k].append(v)
        if len(cols["key"]) == _READ_BLOCK:
            yield block()
    if cols["key"]:
        yield block()


def _chunk_source(units, limit, params, shard_size, skip):
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class ChunkSource(Datasource):
        """One read task per input unit; each streams its chunks in blocks (bounded memory)."""

        def estimate_inmemory_data_size(self):
            return None

        def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
            meta = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None, input_files=None)
            return [
                ReadTask(functools.partial(_read_unit, u, corpora, limit, params, shard_size, skip), meta)
                for u, corpora in enumerate(units)
            ]

    return ChunkSource()


class _EncodeActor:
    """Holds one encoder for the life of the actor; adds a `vector` column to each batch."""

    def __init__(self, encoder: str, batch_size: int, threads: int):
        import torch

        torch.set_num_threads(threads)  # Ray gives the actor `threads` CPUs; torch would take them all
        self.encoder = load_encoder(encoder, backend=TORCH)  # GPUs or torch threads per actor
        self.encoder.batch_size = batch_size

    def __call__(self, batch: dict) -> dict:
        t0 = time.perf_counter()
        vecs = self.encoder.encode_passages(batch["title"].tolist(), batch["text"].tolist())
        batch["vector"] = vecs
        batch["encode_s"] = np.full(len(vecs), (time.perf_counter() - t0) / max(1, len(vecs)))
        return batch


def _finalize_shard(part: str, out: str, spec: dict, encoder_info: dict, started: float) -> str:
    """Build one shard's HNSW graph from its stored vectors and publish the shard folder."""
    part_dir, out_dir = Path(part), Path(out)
    db = open_db(part_dir)
    hnsw = HnswParams(**spec["hnsw"])
    index_s = build_hnsw(db, part_dir, encoder_info["dims"], spec["dtype"], hnsw)
    # BM25's document frequencies are corpus-wide: one BM25 part over all shards, not one per shard
    finish(db, part_dir, out_dir, spec, encoder_info, started, index_s, bm25=False)
    return out_dir.name


# -- the driver ------------------------------------------------------------------------------


class _ShardWriter:
    """Appends one shard's encoded rows to its SQLite store (the single-process build's format)."""

    def __init__(self, shards: Path, name: str):
        self.name = name
        self.part = shards / (name + ".partial")
        if self.part.exists():
            shutil.rmtree(self.part)  # cut off mid-stream in an earlier run: redo it whole
        self.part.mkdir(parents=True)
        self.db = open_db(self.part)
        self.rows = 0
        self.encode_s = 0.0

    def write(self, batch: dict, rows: slice) -> None:
        cols = [batch[k][rows].tolist() for k in ("key", "title", "text", "article", "source", "start", "end")]
        vecs = np.ascontiguousarray(batch["vector"][rows], dtype=np.float32)
        self.rows += len(vecs)
        self.encode_s += float(batch["encode_s"][rows].sum())
        with self.db.conn:
            self.db.conn.executemany(
                "INSERT OR IGNORE INTO passages (key, title, text, article, source, start, end) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)", list(zip(*cols)),
            )
            self.db.conn.executemany(
                "INSERT OR IGNORE INTO pending (key, vector) VALUES (?, ?)",
                [(k, v.tobytes()) for k, v in zip(cols[0], vecs)],
            )
            self.db.conn.execute("UPDATE state SET consumed = ?, encode_s = ? WHERE id = 1",
                                 (self.rows, self.encode_s))

    def complete(self) -> None:
        # total == consumed marks "every row stored": a resumed build only finalizes this shard
        with self.db.conn:
            self.db.conn.execute("UPDATE state SET total = consumed WHERE id = 1")
        self.db.close()


def _is_complete(part: Path) -> bool:
    try:
        with sqlite3.connect(part / PASSAGES) as conn:
            consumed, total = conn.execute("SELECT consumed, total FROM state WHERE id = 1").fetchone()
    except (sqlite3.Error, TypeError):
        return False
    return consumed > 0 and total == consumed


def _runs(shards: np.ndarray) -> Iterator[tuple[str, slice]]:
    """(shard, slice) for each run of equal shard names in a batch (rows arrive in stream order)."""
    start = 0
    for i in range(1, len(shards) + 1):
        if i == len(shards) or shards[i] != shards[start]:
            yield str(shards[start]), slice(start, i)
            start = i


@writes_index
def build_index_ray(
    corpora: list[str],
    out: Path,
    address: str | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    workers: int | None = None,
    cpus_per_worker: float = 1,
    gpus_per_worker: float = 0,
    encoder: str | None = None,
    dtype: str = "f16",
    limit: int | None = None,
    connectivity: int = HnswParams.connectivity,
    expansion_add: int = HnswParams.expansion_add,
    expansion_search: int = HnswParams.expansion_search,
    batch_size: int = DEFAULT_BATCH_SIZE,
    commit_every: int = DEFAULT_COMMIT_EVERY,
    chunking: ChunkParams = ChunkParams(),
    progress: Progress | None = None,
) -> Path:
    """Build (or resume, or find already built) a sharded index of `corpora` in `out` on Ray.

    Args:
        address: a Ray cluster address ("auto", "ray://host:10001"); None starts a local Ray.
        shard_size: chunks per shard.
        workers: encoder actors; None: one per GPU when `gpus_per_worker`, else one per
            `cpus_per_worker` CPUs of the cluster.
        cpus_per_worker, gpus_per_worker: resources each encoder actor holds.
        The other arguments are those of `build.build_index`.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if shard_size <= 0:
        raise ValueError(f"shard_size must be a positive number of chunks, got {shard_size}")
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be a positive number of articles, got {limit}")
    out = Path(out)
    name = canonical_name(encoder or DEFAULT_ENCODER)
    hnsw = HnswParams(connectivity, expansion_add, expansion_search)
    spec = {**build_spec(corpora, name, dtype, limit, chunking, hnsw, TORCH), "shard_size": shard_size}
    if (out / MANIFEST).is_file():
        built = read_manifest(out)["build"]
        if same_build(built, spec):
            logger.info("%s is already built", out)
            return out
        raise IndexMismatchError(
            f"{out} already holds an index built as `{rebuild_command(built, out)}`; "
            "fix: choose another --out or delete that folder"
        )
    for c in corpora:  # fail on a bad spec before starting Ray
        read_corpus(c)
    ray = _import_ray()
    started = time.time()
    part = open_partial(out, spec)
    shards = part / SHARDS
    shards.mkdir(exist_ok=True)
    # the driver needs the encoder's description for the manifests, not a copy on its own device
    encoder_info = load_encoder(name, device="cpu", backend=TORCH).describe()
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING, configure_logging=False)
    node = ray.get_runtime_context().get_node_id()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    finalize = ray.remote(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))(
        _finalize_shard
    )
    shard_spec = lambda shard: {**spec, "shard": shard}  # noqa: E731

    def submit(shard: str):
        return finalize.remote(str(shards / (shard + ".partial")), str(shards / shard), shard_spec(shard),
                               encoder_info, started)

    pending = []
    for d in sorted(shards.glob("*.partial")):
        if _is_complete(d):
            pending.append(submit(d.name.removesuffix(".partial")))
    ray.get(pending)
    finished = frozenset(d.name for d in shards.iterdir() if (d / MANIFEST).is_file())

    units = input_units(spec["corpora"], limit)
    total = sum(1 for _ in iter_chunks(spec["corpora"], chunking, limit)) if all(
        countable(c) for c in spec["corpora"]) else 0
    done = sum(read_manifest(shards / s)["counts"]["chunks_read"] for s in finished)
    if progress:
        progress(done, total)
    if workers is None:
        res = ray.cluster_resources()
        workers = int(res.get("GPU", 0) // gpus_per_worker) if gpus_per_worker else int(res.get("CPU", 1) // cpus_per_worker)
        workers = max(1, workers)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # rows of a shard arrive together and in stream order
    ctx.enable_progress_bars = False
    ds = ray.data.read_datasource(
        _chunk_source(units, limit, chunking, shard_size, finished), num_cpus=_READ_CPUS,
        override_num_blocks=len(units),
    ).map_batches(
        _EncodeActor, fn_constructor_args=(name, batch_size, max(1, int(cpus_per_worker))),
        batch_size=commit_every, batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=cpus_per_worker, num_gpus=gpus_per_worker,
    )
    writer: _ShardWriter | None = None
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        for shard, rows in _runs(batch["shard"]):
            if writer is None or writer.name != shard:
                if writer is not None:
                    writer.complete()
                    pending.append(submit(writer.name))
                writer = _ShardWriter(shards, shard)
            writer.write(batch, rows)
        done += len(batch["key"])
        if progress:
            progress(done, max(total, done) if total else 0)
    if writer is not None:
        writer.complete()
        pending.append(submit(writer.name))
    ray.get(pending)
    _finish_sharded(part, out, spec, encoder_info, started)
    return out


def _union_counts(shards: Path, names: list[str]) -> tuple[list[dict], dict]:
    """Per-source and total counts over all shards; a chunk stored in two shards (the same
    article twice in the input) counts once, as in a single-process build."""
    keys, sources, articles = [], [], []
    codes: dict[str, int] = {}  # source label -> small int, so 30M rows stay a few arrays
    for name in names:
        with sqlite3.connect(shards / name / PASSAGES) as conn:
            rows = conn.execute("SELECT key, source, article FROM passages").fetchall()
        keys.append(np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)))
        sources.append(np.fromiter((codes.setdefault(r[1], len(codes)) for r in rows), dtype=np.int32,
                                   count=len(rows)))
        # hashed to int64 (one process, so Python's string hash is consistent)
        articles.append(np.fromiter((hash((r[1], r[2])) for r in rows), dtype=np.int64, count=len(rows)))
        del rows
    key, src, art = (np.concatenate(a) if a else np.zeros(0, np.int64) for a in (keys, sources, articles))
    _, first = np.unique(key, return_index=True)
    per_source = []
    for s, code in sorted(codes.items()):
        mask = src[first] == code
        per_source.append({"source": s, "passages": int(mask.sum()),
                           "articles": int(len(np.unique(art[first][mask])))})
    return per_source, {"passages": int(len(first)), "articles": int(len(np.unique(art)))}


def _finish_sharded(part: Path, out: Path, spec: dict, encoder_info: dict, started: float) -> None:
    shards = part / SHARDS
    names = sorted(d.name for d in shards.iterdir() if (d / MANIFEST).is_file())
    leftovers = [d.name for d in shards.iterdir() if d.name not in names]
    if leftovers:
        raise IndexError_(f"{shards} holds unfinished shards {leftovers[:3]}; fix: run the same build again")
    manifests = [read_manifest(shards / n) for n in names]
    per_source, counts = _union_counts(shards, names)
    manifest = manifest_for(
        spec, encoder_info, corpora=per_source,
        counts={**counts, "chunks_read": sum(m["counts"]["chunks_read"] for m in manifests), "shards": len(names)},
        # encode_s adds the workers' seconds: with W workers the wall time is about encode_s / W
        timing={"encode_s": round(sum(m["timing"]["encode_s"] for m in manifests), 2),
                "index_s": round(sum(m["timing"]["index_s"] for m in manifests), 2),
                "wall_s_last_run": round(time.time() - started, 2)},
        files={f"{SHARDS}/{n}/{f}": d for n, m in zip(names, manifests) for f, d in m["files"].items()},
        shards=[f"{SHARDS}/{n}" for n in names],
    )
    build_lexical_from([shards / n / PASSAGES for n in names], lexical_dir(part))
    publish(part, out, manifest)
    logger.info("built %s: %d passages in %d shards", out, counts["passages"], len(names))
