"""GGUF loading beyond the default file: block types MLX cannot read, K-quants repacked for
the kernels (each block type against `gguf.quants.dequantize`), the repack cache, and the qwen2
mapping.

The files are tiny random-weight models written here with the `gguf` package, with the real
SmolLM2 vocabulary and chat template copied from the shipped GGUF. gguf-py cannot quantize
K-quants, so those blocks are real rows of Qwen2.5-Coder-1.5B-Instruct Q4_K_M
(tests/data/qwen15b_kquant_rows.npz: 8 rows each of blk.0.attn_q, Q4_K, and blk.0.attn_v, Q6_K)
or random bytes with sane fp16 super-block scales (a valid block of any type).
"""

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from targ_mlx.runtime import gguf_blocks
from targ_mlx.runtime.backbone import alias_path, load_backbone

HIDDEN, FFN, LAYERS, HEADS, KV = 64, 128, 2, 4, 2


@pytest.fixture(scope="module")
def vocab_meta():
    _, meta = mx.load(alias_path("smollm2-135m"), return_metadata=True)
    return meta


def _k_blocks(rng, qtype, rows, cols):
    """Random (rows, cols) blocks of a K-quant type; only the fp16 super-block scales are set
    (to sizes that keep the weights near 0.05, like the float tensors here)."""
    size, nbytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows * cols // size, nbytes), dtype=np.uint8)
    at, scale = {GGMLQuantizationType.Q6_K: ((208,), 2e-5)}.get(qtype, ((0, 2), 2e-4))
    for off in at:
        d = (rng.uniform(0.5, 1.5, (raw.shape[0], 1)) * scale).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8)
    return raw.reshape(rows, -1)


def _write(path, arch, qtype, meta, seed=0, hidden=HIDDEN, ffn=FFN, qtype_for=None):
    """A tiny model; qtype_for(name) -> block type per 2-D tensor overrides `qtype`."""
    rng = np.random.default_rng(seed)
    vocab = len(meta["tokenizer.ggml.tokens"])
    w = GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.embedding_length", hidden)
    w.add_uint32(f"{arch}.feed_forward_length", ffn)
    w.add_uint32(f"{arch}.block_count", LAYERS)
    w.add_uint32(f"{arch}.attention.head_count", HEADS)
    w.add_uint32(f"{arch}.attention.head_count_kv", KV)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32(f"{arch}.context_length", 512)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(list(meta["tokenizer.ggml.tokens"]))
    w.add_token_types(np.array(meta["tokenizer.ggml.token_type"]).tolist())
    w.add_token_merges(list(meta["tokenizer.ggml.merges"]))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(meta["tokenizer.chat_template"])
    head = hidden // HEADS

    def tensor(name, shape, quant=True):
        x = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        qt = qtype_for(name) if qtype_for else qtype
        if not quant or len(shape) != 2 or qt == GGMLQuantizationType.F32:
            w.add_tensor(name, x)
        elif qt in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K):
            w.add_tensor(name, _k_blocks(rng, qt, *shape), raw_dtype=qt)
        else:
            w.add_tensor(name, quantize(x, qt), raw_dtype=qt)

    tensor("token_embd.weight", (vocab, hidden))
    tensor("output_norm.weight", (hidden,), quant=False)
    for i in range(LAYERS):
        p = f"blk.{i}."
        tensor(p + "attn_norm.weight", (hidden,), quant=False)
        tensor(p + "ffn_norm.weight", (hidden,), quant=False)
        tensor(p + "attn_q.weight", (HEADS * head, hidden))
        tensor(p + "attn_k.weight", (KV * head, hidden))
        tensor(p + "attn_v.weight", (KV * head, hidden))
        tensor(p + "attn_output.weight", (hidden, HEADS * head))
        tensor(p + "ffn_gate.weight", (ffn, hidden))
        tensor(p + "ffn_up.weight", (ffn, hidden))
        tensor(p + "ffn_down.weight", (hidden, ffn))
        if arch == "qwen2":
            tensor(p + "attn_q.bias", (HEADS * head,), quant=False)
            tensor(p + "attn_k.bias", (KV * head,), quant=False)
            tensor(p + "attn_v.bias", (KV * head,), quant=False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _logits(bb, text="The capital of France is"):
    ids = bb.tokenizer.encode(text)
    return np.array(bb.prefill(ids, bb.make_cache()))


def test_block_type_mlx_cannot_read_loads(tmp_path, vocab_meta):
    q5 = _write(tmp_path / "tiny-q5_0.gguf", "llama", GGMLQuantizationType.Q5_0, vocab_meta)
    with pytest.raises(Exception):
        mx.load(str(q5), return_metadata=True)  # the reason for the gguf-package fallback
    bb = load_backbone(str(q5))
    # Q5_0 is repacked to 8-bit groups for the kernels (exactly), else dequantized to float32
    assert bb.info["arch"] == "llama" and bb.dtype == ("q8" if bb.engine.name == "targ_mlx.runtime.native" else "float32")
    ref = load_backbone(str(_write(tmp_path / "tiny-f32.gguf", "llama", GGMLQuantizationType.F32, vocab_meta)))
    a, b = _logits(bb), _logits(ref)
    assert np.isfinite(a).all()
    # same random weights, Q5_0 vs exact: logits agree up to quantization noise
    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.95
    assert bb.tokenizer.encode("Hello world") == ref.tokenizer.encode("Hello world")


def test_qwen2_gguf_maps_biases(tmp_path, vocab_meta):
    bb = load_backbone(str(_write(tmp_path / "tiny-qwen2.gguf", "qwen2", GGMLQuantizationType.Q8_0, vocab_meta)))
    assert bb.info["arch"] == "qwen2"
    attn = bb.model.model.layers[0].self_attn
    assert attn.q_proj.bias.shape == (HIDDEN,) and float(mx.abs(attn.q_proj.bias).sum()) > 0
    assert np.isfinite(_logits(bb)).all()


# --- K-quants and the other block types, repacked as affine groups of 32 (targ_mlx.runtime.gguf_blocks)

Q = GGMLQuantizationType
REAL_ROWS = np.load(Path(__file__).parent / "data" / "qwen15b_kquant_rows.npz")


@pytest.fixture(scope="module")
def real_matrix():
    """64 rows of SmolLM2's blk.0.attn_q, as floats."""
    w, _ = mx.load(alias_path("smollm2-135m"), return_metadata=True)
    p = "blk.0.attn_q."
    x = mx.dequantize(w[p + "weight"], w[p + "scales"], w[p + "biases"], group_size=32, bits=4)[:64]
    return np.array(x.astype(mx.float32))


@pytest.mark.parametrize("qtype,bits", [(Q.Q4_0, 4), (Q.Q4_1, 4), (Q.Q5_0, 8), (Q.Q5_1, 8), (Q.Q8_0, 8)])
def test_legacy_blocks_repack_exactly(real_matrix, qtype, bits):
    raw = quantize(real_matrix, qtype)
    a = gguf_blocks.affine(raw, qtype, real_matrix.shape)
    assert a.bits == bits and a.vals.max() < 2 ** {Q.Q5_0: 5, Q.Q5_1: 5}.get(qtype, bits)
    np.testing.assert_array_equal(gguf_blocks.dequantize(a), dequantize(raw, qtype))


def test_q4_k_real_rows_repack_exactly():
    raw = REAL_ROWS["Q4_K"]
    a = gguf_blocks.affine(raw, Q.Q4_K, (8, 1536))
    assert a.bits == 4
    np.testing.assert_array_equal(gguf_blocks.dequantize(a), dequantize(raw, Q.Q4_K).reshape(8, 1536))


def test_q5_k_blocks_repack_exactly():
    raw = _k_blocks(np.random.default_rng(5), Q.Q5_K, 16, 512)
    a = gguf_blocks.affine(raw, Q.Q5_K, (16, 512))
    assert a.bits == 8 and a.vals.max() == 31
    np.testing.assert_array_equal(gguf_blocks.dequantize(a), dequantize(raw, Q.Q5_K).reshape(16, 512))


@pytest.mark.parametrize("raw", [REAL_ROWS["Q6_K"], _k_blocks(np.random.default_rng(6), Q.Q6_K, 16, 512)],
                         ids=["real", "random"])
def test_q6_k_rounds_only_the_smaller_sub_block(raw):
    n = raw.shape[0]
    ref = dequantize(raw, Q.Q6_K).reshape(n, -1)
    a = gguf_blocks.affine(raw, Q.Q6_K, ref.shape)
    err = np.abs(gguf_blocks.dequantize(a) - ref).reshape(-1, 2, 16).max(-1)  # per group, per sub-block
    assert a.bits == 8
    assert (err.min(-1) <= 1e-7 * np.abs(ref).max()).all()  # the sub-block with the larger scale is exact
    step = np.abs(a.scales.reshape(-1))
    # the other: within half a step, but for a rare group spanning 257 steps, clipped by one
    assert (err.max(-1) <= step * 1.0001).all() and (err.max(-1) <= step * 0.5001).mean() > 0.99


def test_unrepackable_type_returns_none():
    assert gguf_blocks.affine(np.zeros((2, 84), np.uint8), Q.Q2_K, (2, 256)) is None


def _kquant_file(tmp_path, vocab_meta):
    """A tiny qwen2 model laid out like a Q4_K_M file: Q4_K, with v and down in Q6_K."""
    def qtype_for(name):
        return Q.Q6_K if name.endswith(("attn_v.weight", "ffn_down.weight")) else Q.Q4_K

    return _write(tmp_path / "tiny-q4_k_m.gguf", "qwen2", Q.Q4_K, vocab_meta, hidden=256, ffn=512,
                  qtype_for=qtype_for)


def test_k_quant_file_runs_on_the_kernels(tmp_path, vocab_meta):
    from targ_mlx.runtime import native

    if native.module() is None:
        pytest.skip(f"CPU kernels unavailable: {native.status()}")
    path = _kquant_file(tmp_path, vocab_meta)
    bb = load_backbone(str(path), kernels=True)
    # the label is the mlx-lm layers' bits per tensor (Q6_K rows: 8 there; the kernels keep their blocks)
    assert bb.engine.name == "targ_mlx.runtime.native" and bb.dtype == "q4+q8"
    ref = load_backbone(str(path), dtype="float32", kernels=False)  # gguf-py's dequantization
    assert ref.engine.name == "mlx" and ref.dtype == "float32"
    a, b = _logits(bb), _logits(ref)
    # int8 activations, float16 scales and Q6_K's rounding are the only differences
    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.99


def test_repack_cache_is_hit_then_rebuilt_when_corrupt(tmp_path, vocab_meta, monkeypatch):
    from targ_mlx.runtime import gguf, native
    from targ_mlx.runtime import repack as cache

    if native.module() is None:
        pytest.skip(f"CPU kernels unavailable: {native.status()}")
    path = str(_kquant_file(tmp_path, vocab_meta))
    conversions = []
    real = gguf.load_gguf
    monkeypatch.setattr(gguf, "load_gguf", lambda *a, **k: conversions.append(a) or real(*a, **k))
    first = _logits(load_backbone(path, kernels=True))
    entry = cache.entry_dir(path)
    assert len(conversions) == 1 and (entry / "manifest.json").is_file()
    second = load_backbone(path, kernels=True)
    assert len(conversions) == 1  # read from the cache, not converted again
    assert np.array_equal(_logits(second), first)
    blob = entry / "native.safetensors"
    data = bytearray(blob.read_bytes())
    data[-100:] = bytes(100)  # damage the last tensor's bytes: same size, wrong content
    blob.write_bytes(bytes(data))
    third = load_backbone(path, kernels=True)
    assert len(conversions) == 2  # the damaged entry was rebuilt, not trusted
    assert np.array_equal(_logits(third), first)
    assert load_backbone(path, kernels=True) and len(conversions) == 2


def test_repack_prune_keeps_the_newest_other_entry_of_the_same_file(tmp_path):
    import json
    import os

    from targ_mlx.runtime import repack

    def entry(name, source, when):
        e = tmp_path / name
        e.mkdir()
        m = {"format": repack.FORMAT, "files": {}}
        if source is not None:
            m["source"] = source
        (e / "manifest.json").write_text(json.dumps(m))
        os.utime(e / "manifest.json", (when, when))
        return e

    src = "/models/qwen-q4_k_m.gguf"
    oldest = entry("qwen-q4_k_m-aaaa", None, 1000)  # written before manifests named their source
    older = entry("qwen-q4_k_m-bbbb", src, 2000)
    newer = entry("qwen-q4_k_m-cccc", src, 3000)
    other_copy = entry("qwen-q4_k_m-dddd", "/elsewhere/qwen-q4_k_m.gguf", 500)
    other_model = entry("qwen-q4_k_m-big-eeee", src, 100)  # another stem that starts alike
    writing = tmp_path / "qwen-q4_k_m-ffff"
    writing.mkdir()  # no manifest yet: another process is writing it
    current = entry("qwen-q4_k_m-9999", src, 4000)
    removed = repack.prune(current, src)
    assert sorted(removed) == sorted([oldest, older])
    assert all(e.exists() for e in (current, newer, other_copy, other_model, writing))
    assert not oldest.exists() and not older.exists()
