"""Encoder backends: the int8 ONNX export agrees with float32 torch, gives each text the same
vector whatever else is encoded with it, and an index is always queried with the backend that
built it (old manifests without one: torch)."""

import json
import shutil

import numpy as np
import pytest

from targ_mlx.index import IndexMismatchError, load_encoder, open_retriever
from targ_mlx.index.build import existing_backend
from targ_mlx.index.store import MANIFEST, partial_dir


@pytest.fixture(scope="module")
def passages(small_index_questions):
    return [(q["gold_title"], q["gold_text"]) for q in small_index_questions[:12]]


def test_onnx_int8_agrees_with_float32_torch(passages, small_index_questions):
    fast, ref = load_encoder(backend="onnx-int8"), load_encoder(backend="torch")
    assert (fast.backend, ref.backend, fast.dims) == ("onnx-int8", "torch", ref.dims)
    titles, texts = zip(*passages)
    a, b = fast.encode_passages(titles, texts), ref.encode_passages(titles, texts)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    # per-channel, reduced-range weights: 0.991-0.994 on 40 real NQ passages on AVX2 (full-range
    # weights saturated vpmaddubsw there and gave 0.935)
    assert float(np.min(np.sum(a * b, axis=1))) > 0.985
    qs = [q["question"] for q in small_index_questions[:12]]
    # the questions rank these passages first the same way with either backend (int8 may swap one
    # near-tie of twelve: 39/40 agreed on 40 questions)
    same = np.argmax(fast.encode_queries(qs) @ a.T, axis=1) == np.argmax(ref.encode_queries(qs) @ b.T, axis=1)
    assert same.sum() >= 11
    info = fast.describe()
    assert info["backend"] == "onnx-int8" and len(info["onnx_sha256"]) == 64 and "onnxruntime" in info["runtime"]


def test_a_text_gets_the_same_vector_alone_or_in_a_batch(passages):
    fast = load_encoder(backend="onnx-int8")
    titles, texts = zip(*passages)
    together = fast.encode_passages(titles, texts, batch_size=32)
    alone = np.stack([fast.encode_passages([t], [x])[0] for t, x in zip(titles, texts)])
    np.testing.assert_array_equal(together, alone)


def test_old_manifest_without_backend_is_queried_with_torch(tmp_path, small_index_dir):
    old = shutil.copytree(small_index_dir, tmp_path / "old")
    manifest = json.loads((old / MANIFEST).read_text())
    for section in ("encoder", "build"):
        manifest[section].pop("backend", None)
    manifest["encoder"].pop("onnx_sha256", None)
    (old / MANIFEST).write_text(json.dumps(manifest))
    r = open_retriever(old)
    assert r.encoder.backend == "torch"
    assert existing_backend(old) == "torch"  # a rebuild/resume there keeps torch
    assert r.search("who wrote hamlet", 3)


def test_query_encoder_of_another_backend_is_refused(small_index_dir):
    r = open_retriever(small_index_dir)
    other = "torch" if r.manifest["encoder"]["backend"] != "torch" else "onnx-int8"
    with pytest.raises(IndexMismatchError, match=f"--backend {r.manifest['encoder']['backend']}"):
        open_retriever(small_index_dir, encoder=load_encoder(backend=other))


def test_unfinished_build_keeps_its_backend(tmp_path):
    out = tmp_path / "idx"
    partial_dir(out).mkdir(parents=True)
    (partial_dir(out) / "build.json").write_text(json.dumps({"encoder": "all-MiniLM-L6-v2"}))
    assert existing_backend(out) == "torch"  # begun before backends existed
    assert existing_backend(tmp_path / "none") is None


def test_torch_encoder_leaves_threading_to_the_openblas_bound_for_mlx():
    # conftest binds OpenBLAS as the entry points do; torch's sgemm then runs on OpenBLAS's threads,
    # and torch's own threads on top made encoding 4.5x slower on 2 cores (BENCHMARKS.md, "Encoder")
    import torch

    from targ_mlx import _blas

    if _blas.BLAS_PATH is None:
        pytest.skip(f"no OpenBLAS bound here: {_blas.BLAS_STATUS}")
    load_encoder(backend="torch", device="cpu")
    assert torch.get_num_threads() == 1
