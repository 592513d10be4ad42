"""GGUF loading beyond the default file: block types MLX cannot read, and the qwen2 mapping.

The files are tiny random-weight models written here with the `gguf` package, with the real
SmolLM2 vocabulary and chat template copied from the shipped GGUF.
"""

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from targ_mlx.backbone import alias_path, load_backbone

HIDDEN, FFN, LAYERS, HEADS, KV = 64, 128, 2, 4, 2


@pytest.fixture(scope="module")
def vocab_meta():
    _, meta = mx.load(alias_path("smollm2-135m"), return_metadata=True)
    return meta


def _write(path, arch, qtype, meta, seed=0):
    rng = np.random.default_rng(seed)
    vocab = len(meta["tokenizer.ggml.tokens"])
    w = GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.embedding_length", HIDDEN)
    w.add_uint32(f"{arch}.feed_forward_length", FFN)
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
    head = HIDDEN // HEADS

    def tensor(name, shape, quant=True):
        x = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if quant and qtype != GGMLQuantizationType.F32 and len(shape) == 2:
            w.add_tensor(name, quantize(x, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, x)

    tensor("token_embd.weight", (vocab, HIDDEN))
    tensor("output_norm.weight", (HIDDEN,), quant=False)
    for i in range(LAYERS):
        p = f"blk.{i}."
        tensor(p + "attn_norm.weight", (HIDDEN,), quant=False)
        tensor(p + "ffn_norm.weight", (HIDDEN,), quant=False)
        tensor(p + "attn_q.weight", (HEADS * head, HIDDEN))
        tensor(p + "attn_k.weight", (KV * head, HIDDEN))
        tensor(p + "attn_v.weight", (KV * head, HIDDEN))
        tensor(p + "attn_output.weight", (HIDDEN, HEADS * head))
        tensor(p + "ffn_gate.weight", (FFN, HIDDEN))
        tensor(p + "ffn_up.weight", (FFN, HIDDEN))
        tensor(p + "ffn_down.weight", (HIDDEN, FFN))
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


def test_block_type_mlx_cannot_read_is_dequantized(tmp_path, vocab_meta):
    q5 = _write(tmp_path / "tiny-q5_0.gguf", "llama", GGMLQuantizationType.Q5_0, vocab_meta)
    with pytest.raises(Exception):
        mx.load(str(q5), return_metadata=True)  # the reason for the gguf-package fallback
    bb = load_backbone(str(q5))
    assert bb.info["arch"] == "llama" and bb.dtype == "float32"
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
