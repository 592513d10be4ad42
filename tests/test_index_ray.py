"""The Ray build (`python -m targ_mlx.index build --ray`) on a local Ray: the same index as the
single-process build, served sharded, and resumed per shard. Real Ray, real encoder, real corpus."""

import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the [distributed] extra (Ray) is not installed")

from targ_mlx.index import open_retriever  # noqa: E402
from targ_mlx.index.__main__ import setup_arg_parser  # noqa: E402
from targ_mlx.index.distributed import build_index_ray  # noqa: E402
from targ_mlx.index.sharded import ShardedRetriever  # noqa: E402
from targ_mlx.index.store import BUILD_STATE, MANIFEST, PASSAGES, partial_dir  # noqa: E402

SHARD = 50  # 152 chunks -> 4 shards


def _keys(index_dir: Path) -> set[int]:
    with closing(sqlite3.connect(index_dir / PASSAGES)) as db:
        return {k for (k,) in db.execute("SELECT key FROM passages")}


def _all_keys(sharded: Path) -> set[int]:
    return set().union(*(_keys(sharded / s) for s in json.loads((sharded / MANIFEST).read_text())["shards"]))


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_index(local_ray, small_index_corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ray") / "sharded"
    return build_index_ray([str(small_index_corpus)], out, shard_size=SHARD, workers=2)


def test_ray_build_equals_single_process_build(ray_index, small_index_dir):
    single = open_retriever(small_index_dir)
    r = open_retriever(ray_index)
    assert isinstance(r, ShardedRetriever)
    assert r.manifest["shards"] == [f"shards/000-{i:06d}" for i in range(4)]
    assert _all_keys(ray_index) == _keys(small_index_dir)  # the same chunk set, each once
    assert len(r) == len(single) == 152
    assert r.manifest["counts"]["passages"] == single.manifest["counts"]["passages"]
    assert r.manifest["counts"]["articles"] == single.manifest["counts"]["articles"]
    assert r.manifest["corpora"] == single.manifest["corpora"]
    # every chunk is stored with the same text as in the single-process build
    some = sorted(_keys(small_index_dir))[::10]
    assert r.passages(some) == single.passages(some)


def test_sharded_search_recall_vs_exact(ray_index, small_index_dir, small_index_questions):
    # the Ray build encodes with torch and the single default build with int8 ONNX, so the exact
    # reference is brute force over the sharded index's own vectors, queried by its own encoder
    sharded = open_retriever(ray_index)
    q = sharded.encoder.encode_queries([x["question"] for x in small_index_questions])
    exact = sharded.search_vectors(q, k=5, exact=True)  # brute force over all vectors
    approx = sharded.search_vectors(q, k=5)
    recall = np.mean([len({p.key for p in a} & {p.key for p in e}) / 5 for a, e in zip(approx, exact)])
    assert recall >= 0.99, recall
    assert all(len(a) == 5 for a in approx)
    assert all([p.score for p in a] == sorted((p.score for p in a), reverse=True) for a in approx)
    one = sharded.search(small_index_questions[0]["question"], k=5)
    # the same passages; a query encoded alone and in a batch of 50 differ in the last float bits
    assert [p.key for p in one] == [p.key for p in approx[0]]
    assert [p.score for p in one] == pytest.approx([p.score for p in approx[0]], abs=1e-5)


def test_info_reports_the_union(ray_index, capsys):
    from targ_mlx.index.__main__ import main

    main(["info", str(ray_index), "--verify"])
    out = capsys.readouterr().out
    assert "shards       4" in out and "passages     152" in out


def test_resume_rebuilds_only_the_missing_shards(local_ray, ray_index, small_index_corpus, tmp_path):
    # an interrupted build: shard 1 never finished, shard 3 was cut off mid-stream
    part = partial_dir(tmp_path / "resumed")
    shutil.copytree(ray_index, part)
    manifest = json.loads((part / MANIFEST).read_text())
    (part / BUILD_STATE).write_text(json.dumps(manifest["build"]))
    (part / MANIFEST).unlink()
    shutil.rmtree(part / "shards/000-000001")
    shutil.rmtree(part / "shards/000-000003")
    (part / "shards/000-000003.partial").mkdir()
    kept = (part / "shards/000-000000/vectors.usearch").stat().st_mtime_ns

    out = build_index_ray([str(small_index_corpus)], tmp_path / "resumed", shard_size=SHARD, workers=2)
    assert not part.exists()
    assert (out / "shards/000-000000/vectors.usearch").stat().st_mtime_ns == kept  # not rebuilt
    assert sorted(p.name for p in (out / "shards").iterdir()) == [f"000-{i:06d}" for i in range(4)]
    assert _all_keys(out) == _all_keys(ray_index)
    assert open_retriever(out).manifest["counts"]["chunks_read"] == 152


def test_cli_flags():
    args = setup_arg_parser().parse_args(["build", "--corpus", "x.jsonl", "--out", "o", "--ray"])
    assert args.ray == "local" and args.shard_size == 500_000
    args = setup_arg_parser().parse_args(["build", "--corpus", "x.jsonl", "--out", "o", "--ray", "auto",
                                          "--gpus-per-worker", "1"])
    assert args.ray == "auto" and args.gpus_per_worker == 1


def test_single_process_build_reuses_a_sharded_index(ray_index, small_index_corpus, tmp_path):
    from targ_mlx.index import build_index

    # vectors are reused only between builds of one encoder backend; Ray's actors run torch
    out = build_index([str(small_index_corpus)], tmp_path / "reused", limit=20, reuse=[ray_index], backend="torch")
    r, sharded = open_retriever(out), open_retriever(ray_index)
    keys = sorted(_keys(out))
    assert keys and _keys(out) <= _all_keys(ray_index)
    assert r.passages(keys) == sharded.passages(keys)
    q = sharded.encoder.encode_queries(["who won the first Nobel Prize in Physics"])
    assert r.search_vectors(q, k=3)[0][0].key in {p.key for p in sharded.search_vectors(q, k=5)[0]}
