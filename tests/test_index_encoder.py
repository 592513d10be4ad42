"""Encoder backends: the MLX encoder computes torch's float32 vectors (so either searches an index
the other built), torch's bfloat16 products stay in float32's family, the int8 ONNX export agrees
with float32 torch, each text gets the same vector
whatever else is encoded with it, and an index is queried with a backend of its own family (old
manifests without one: torch's, float32)."""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from targ_mlx.index import IndexMismatchError, load_encoder, open_retriever
from targ_mlx.index.build import existing_backend
from targ_mlx.index.encoder import DEFAULT_ENCODER, FLOAT32, family, resolve_model
from targ_mlx.index.store import MANIFEST, partial_dir


@pytest.fixture(scope="module")
def passages(small_index_questions):
    return [(q["gold_title"], q["gold_text"]) for q in small_index_questions[:12]]


def test_mlx_encoder_computes_the_torch_vectors(passages, small_index_questions):
    mine, ref = load_encoder(backend="mlx"), load_encoder(backend="torch")
    assert (mine.backend, mine.dims) == ("mlx", ref.dims)
    titles, texts = zip(*passages)
    # 1.3e-7 at most on 256 real chunks here: float32 rounding, the same function
    np.testing.assert_allclose(mine.encode_passages(titles, texts), ref.encode_passages(titles, texts), atol=2e-6)
    qs = [q["question"] for q in small_index_questions[:12]]
    np.testing.assert_allclose(mine.encode_queries(qs), ref.encode_queries(qs), atol=2e-6)
    assert "onnx_sha256" not in mine.describe()


def test_mlx_vector_of_a_text_does_not_depend_on_its_batch(passages):
    mine = load_encoder(backend="mlx")
    titles, texts = zip(*passages)
    together = mine.encode_passages(titles, texts, batch_size=32)  # padded to the longest
    alone = np.stack([mine.encode_passages([t], [x])[0] for t, x in zip(titles, texts)])
    np.testing.assert_allclose(together, alone, atol=1e-6)


def test_mlx_encoder_computes_no_padding(passages):
    """A batch's layers run on its real tokens only, packed one text after another: every product
    gets sum(lengths) rows, not texts x the longest (a search's 20 results were a fifth padding)."""
    from targ_mlx.index.encoder import resolve_model
    from targ_mlx.index.mlx_encoder import MlxBert

    model = MlxBert(resolve_model("all-MiniLM-L6-v2"))
    texts = ["short", " ".join(x for _, x in passages[:3])]
    lengths = [len(model.tokenizer.encode(t).ids) for t in texts]
    rows = []
    linear = model.ops.linear
    model.ops.linear = lambda x, *a, **k: rows.append(x.shape[0]) or linear(x, *a, **k)
    together = model.encode(texts, batch_size=2)
    assert set(rows) == {sum(lengths)}, (rows, lengths)
    model.ops.linear = linear
    np.testing.assert_array_equal(together[0], model.encode(texts[:1])[0])


def test_mlx_encoder_frees_each_layers_intermediates(passages):
    """A batch is evaluated a layer at a time, so its peak memory is about one layer's buffers, not
    six layers' (as one graph they all stayed alive: 560 MB instead of 206 MB at 32 x 131 tokens)."""
    import mlx.core as mx

    from targ_mlx.index.encoder import resolve_model
    from targ_mlx.index.mlx_encoder import MlxBert

    model = MlxBert(resolve_model("all-MiniLM-L6-v2"))
    text = " ".join(x for _, x in passages)  # truncated to the model's 256 tokens
    batch, tokens = 32, len(model.tokenizer.encode(text).ids)
    model.encode([text] * 2)  # warm-up
    mx.clear_cache()
    mx.reset_peak_memory()
    before = mx.get_active_memory()  # what other tests left loaded in this process (a model, caches)
    model.encode([text] * batch, batch_size=batch)
    one_layer = batch * tokens * (3 * 384 + 2 * 1536 + 4 * 384) * 4  # qkv, FFN up + GELU, the rest
    assert mx.get_peak_memory() - before < 2.5 * one_layer, (mx.get_peak_memory(), before, one_layer)


def test_mlx_encoder_on_mlxs_own_ops_as_on_a_mac_matches_the_cpu_kernels(passages):
    from targ_mlx.index.encoder import resolve_model
    from targ_mlx.index.mlx_encoder import MlxBert

    model = MlxBert(resolve_model("all-MiniLM-L6-v2"))
    texts = [f"{t}\n{x}" for t, x in passages[:6]]
    on_kernels = model.encode(texts)
    if model.ops.k is None:
        pytest.skip("no CPU kernels here: MLX's own ops ran already")
    model.ops.k = None  # the composite GELU, LayerNorm and masked attention a Mac or a GPU runs
    np.testing.assert_allclose(model.encode(texts), on_kernels, atol=2e-6)


def test_an_index_built_with_torch_is_searched_by_mlx_and_the_same_passages_come_back(tmp_path, small_index_dir,
                                                                                       small_index_questions):
    old = shutil.copytree(small_index_dir, tmp_path / "torch-built")
    manifest = json.loads((old / MANIFEST).read_text())
    manifest["encoder"]["backend"] = manifest["build"]["backend"] = "torch"
    (old / MANIFEST).write_text(json.dumps(manifest))
    by_mlx = open_retriever(old)
    by_torch = open_retriever(old, encoder=load_encoder(backend="torch"))
    assert (by_mlx.encoder.backend, by_torch.encoder.backend) == ("mlx", "torch")
    for q in small_index_questions[:8]:
        assert [p.text for p in by_mlx.search(q["question"], 5)] == [p.text for p in by_torch.search(q["question"], 5)]


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
    assert family(r.encoder.backend) == FLOAT32  # searched by mlx where it runs: the same vectors
    assert existing_backend(old) == "torch"  # a rebuild/resume there keeps torch
    assert r.search("who wrote hamlet", 3)


def test_query_encoder_of_another_backend_is_refused(small_index_dir):
    r = open_retriever(small_index_dir)
    other = "torch" if family(r.manifest["encoder"]["backend"]) != FLOAT32 else "onnx-int8"
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
    # and torch's own threads on top made encoding 4.5x slower on 2 cores (docs/archive/
    # benchmarks-journal.md, "The encoder beside MLX, and an MLX encoder")
    import torch

    from targ_mlx import _blas

    if _blas.BLAS_PATH is None:
        pytest.skip(f"no OpenBLAS bound here: {_blas.BLAS_STATUS}")
    load_encoder(backend="torch", device="cpu")
    assert torch.get_num_threads() == 1


def test_an_encoder_neither_here_nor_reachable_is_one_line_naming_the_fix(monkeypatch):
    """Seen on a fresh GPU machine without the offline extra: transformers' OSError came out as a
    40-line traceback from inside a search. Offline (as CI and that machine are), it is one line."""
    import huggingface_hub.constants

    from targ_mlx.errors import ModelLoadError

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError) as e:
        load_encoder("nobody/no-such-encoder", backend="torch", device="cpu")
    msg = str(e.value)
    assert "'nobody/no-such-encoder' is not on this machine" in msg and "fix: " in msg and "\n" not in msg


@pytest.mark.parametrize("backend", ["torch-bf16", "mlx-bf16"])
def test_bf16_vectors_stay_in_the_float32_family(passages, small_index_questions, backend):
    """bfloat16 products (torch's autocast, or the kernels' bf16_linear) move a passage's vector by
    a cosine of ~3e-5, so an index they build is searched with float32 queries: the questions rank
    these passages first as float32 does."""
    from targ_mlx.index.mlx_encoder import unusable

    if backend == "mlx-bf16" and (why := unusable(resolve_model(DEFAULT_ENCODER), bf16=True)):
        pytest.skip(why)
    fast, ref = load_encoder(backend=backend), load_encoder(backend="torch")
    assert (fast.backend, family(fast.backend), fast.describe()["backend"]) == (backend, FLOAT32, backend)
    titles, texts = zip(*passages)
    a, b = fast.encode_passages(titles, texts), ref.encode_passages(titles, texts)
    assert a.dtype == np.float32 and np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    cos = np.sum(a * b, axis=1)
    # >= 0.99997 on 2,000 real chunks on a Zen 4 (BENCHMARKS.md, row "encoder: bfloat16");
    # exactly 1 would mean float32 ran
    assert 0.9995 < float(cos.min()) and float(cos.max()) < 1 - 1e-9
    qs = ref.encode_queries([q["question"] for q in small_index_questions[:12]])
    assert (np.argmax(qs @ a.T, axis=1) == np.argmax(qs @ b.T, axis=1)).all()


def test_bf16_is_chosen_only_where_the_cpu_multiplies_it(monkeypatch):
    """Searches and builds encode with mlx-bf16 where the kernels multiply bfloat16 (AVX512-BF16),
    builds with torch-bf16 where the CPU has AMX-BF16 tiles; TARG_MLX_ENCODER_BF16=0: float32."""
    from targ_mlx.index.encoder import _has_sentence_transformers, build_backend, default_backend
    from targ_mlx.index.mlx_encoder import unusable
    from targ_mlx.runtime.native.build import cpu_flags

    flags = set(open("/proc/cpuinfo").read().split()) if sys.platform == "linux" else set()
    assert cpu_flags() <= flags and ("avx2" in flags) == ("avx2" in cpu_flags())
    folder = resolve_model(DEFAULT_ENCODER)
    monkeypatch.setenv("TARG_MLX_ENCODER_BF16", "1")  # the default outside the tests (conftest sets 0)
    kernels_bf16 = unusable(folder, bf16=True) is None
    native_march = os.environ.get("TARG_MLX_NATIVE_MARCH", "native") == "native"
    assert kernels_bf16 == (unusable(folder) is None and "avx512_bf16" in flags and native_march)
    assert default_backend(None) == ("mlx-bf16" if kernels_bf16 else "mlx" if unusable(folder) is None else "torch")
    amx = "amx_bf16" in flags and _has_sentence_transformers()
    assert build_backend(None) == ("torch-bf16" if amx else default_backend(None))
    monkeypatch.setenv("TARG_MLX_ENCODER_BF16", "0")
    assert default_backend(None) in ("mlx", "torch") and build_backend(None) == default_backend(None)


def test_an_index_built_in_bf16_is_searched_with_float32_queries(small_index_corpus, small_index_dir,
                                                                 small_index_questions, tmp_path):
    from targ_mlx.index import build_index

    idx = build_index([str(small_index_corpus)], tmp_path / "bf16", backend="torch-bf16")
    r, ref = open_retriever(idx), open_retriever(small_index_dir)
    assert existing_backend(idx) == "torch-bf16" and r.encoder.backend == ref.encoder.backend  # float32 queries
    same = [len({p.key for p in r.search(q["question"], 5)} & {p.key for p in ref.search(q["question"], 5)})
            for q in small_index_questions[:12]]
    assert sum(same) >= 0.95 * 5 * len(same), same  # 0.996 of float32's top 5 on 1,000 questions


def test_mlx_bf16_declines_a_bert_whose_widths_it_cannot_pair(tmp_path):
    """bfloat16 pairs fill 16 lanes: a BERT 390 wide is declined with a reason (default_backend then
    picks mlx) rather than failing when its weights are packed."""
    from targ_mlx.index.mlx_encoder import unusable

    src = Path(resolve_model(DEFAULT_ENCODER))
    if unusable(src, bf16=True):
        pytest.skip(unusable(src, bf16=True))
    odd = tmp_path / "odd-bert"
    shutil.copytree(src / "1_Pooling", odd / "1_Pooling")
    (odd / "model.safetensors").symlink_to(src / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**cfg, "hidden_size": 390}))
    assert "multiples of 16" in unusable(odd, bf16=True) and unusable(odd) is None
