"""K-quant blocks as the GGUF file stores them (csrc/kquant.h, pack.KBlocks).

Blocks here are random bytes laid out as Q4_K and Q6_K super-blocks (any bytes are valid blocks
once the float16 scales are finite), so every bit pattern of the scales, mins and values is
exercised; gguf-py's `gguf.quants.dequantize` is the reference.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from mlx_lm.models import qwen2
from mlx_lm.models.cache import make_prompt_cache

from targ_mlx.runtime import gguf_blocks, native
from targ_mlx.runtime.native import pack
from targ_mlx.runtime.native.model import NativeLM
from targ_mlx.runtime.native.pack import KBlocks

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="the CPU kernels are for CPU-only MLX (Linux)")

TYPES = {pack.Q4_K: GGMLQuantizationType.Q4_K, pack.Q6_K: GGMLQuantizationType.Q6_K}


def random_blocks(rng, qtype: int, n: int, k: int, scale: float = 1e-4) -> np.ndarray:
    """(n, k/256 * block bytes) random blocks whose float16 scales are in [scale/2, 3*scale/2)."""
    nb = k // 256
    b = rng.integers(0, 256, (n, nb, pack.K_BLOCK_BYTES[qtype]), dtype=np.uint8)
    f16 = lambda: rng.uniform(scale / 2, 1.5 * scale, (n, nb, 1)).astype(np.float16).view(np.uint8)
    if qtype == pack.Q4_K:
        d = rng.uniform(scale / 2, 1.5 * scale, (n, nb, 1))
        # dmin = 7.5 d centres the values (q - 7.5 on average) as a real file's are
        b[:, :, 0:2], b[:, :, 2:4] = (d.astype(np.float16).view(np.uint8), (7.5 * d).astype(np.float16).view(np.uint8))
    else:
        b[:, :, 208:210] = f16() if scale else 0  # d
    return b.reshape(n, -1)


def deq(blocks: np.ndarray, qtype: int) -> np.ndarray:
    return dequantize(blocks, TYPES[qtype]).astype(np.float32).reshape(blocks.shape[0], -1)


def rel_err(a, b):
    return float(np.abs(np.asarray(a) - b).max() / (np.abs(b).max() + 1e-12))


@pytest.mark.parametrize("qtype", [pack.Q4_K, pack.Q6_K])
def test_rows_dequantize_bit_exactly_as_gguf_py_does(N, qtype):
    rng = np.random.default_rng(qtype)
    blocks = random_blocks(rng, qtype, 40, 512, scale=0.05)
    ref = deq(blocks, qtype)
    got = np.array(N.kembed(mx.array([3, 0, 39, 3]), mx.array(blocks), qtype))
    assert np.array_equal(got.view(np.uint32), ref[[3, 0, 39, 3]].view(np.uint32))


@pytest.mark.parametrize("qtype", [pack.Q4_K, pack.Q6_K])
@pytest.mark.parametrize("K", [256, 1536])
def test_kqlinear_matches_the_dequantized_matmul(N, qtype, K):
    rng = np.random.default_rng(K + qtype)
    blocks = random_blocks(rng, qtype, 48, K)
    W = deq(blocks, qtype)
    bias, res = rng.standard_normal(48).astype(np.float32), rng.standard_normal((9, 48)).astype(np.float32)
    for M in (1, 2, 3, 4, 5, 9):  # every number of rows the kernel takes together, and a remainder
        x = rng.standard_normal((M, K)).astype(np.float32)
        # int8 activations per 256 (as llama.cpp's Q8_K): ~1% of the output's range on random data
        assert rel_err(N.kqlinear(mx.array(x), mx.array(blocks), qtype), x @ W.T) < 0.03
    y = N.kqlinear(mx.array(x), mx.array(blocks), qtype, bias=mx.array(bias), residual=mx.array(res))
    assert rel_err(y, x @ W.T + bias + res) < 0.03


@pytest.mark.parametrize("qtype", [pack.Q4_K, pack.Q6_K])
def test_kqlinear_rows_do_not_depend_on_the_batch(N, qtype):
    rng = np.random.default_rng(7)
    blocks = mx.array(random_blocks(rng, qtype, 300, 768))
    x = mx.array(rng.standard_normal((11, 768)).astype(np.float32))
    full = N.kqlinear(x, blocks, qtype)
    for i in range(11):
        assert mx.array_equal(N.kqlinear(x[i : i + 1], blocks, qtype)[0], full[i])


def test_q4k_tiles_keep_the_blocks_values_and_multiply_like_them(N):
    rng = np.random.default_rng(3)
    blocks = random_blocks(rng, pack.Q4_K, 64, 768, scale=0.01)
    W = deq(blocks, pack.Q4_K)
    P = gguf_blocks.q4k_tiles(blocks)
    assert P.kscale and P.nbytes == 64 * 768 * 4.625 / 8  # the file: 4.5 bits a weight
    assert np.array_equal(np.array(pack.dequantize(P)).view(np.uint32), W.view(np.uint32))  # as gguf-py
    x = rng.standard_normal((9, 768)).astype(np.float32)
    full = P.linear(N, mx.array(x))
    assert rel_err(full, x @ W.T) < 0.03  # int8 activations per 256 on the k4 layout (per 32 on VNNI's)
    # each way the kernels take rows (1 and 2: both halves of a tile streamed; 3-8 streamed a
    # half at a time; more: blocked) gives every row the bits it gets alone
    for size in (1, 2, 3, 6):
        for i in range(0, 9 - size + 1, size):
            assert mx.array_equal(P.linear(N, mx.array(x[i : i + size])), full[i : i + size])
    emb = np.array(P.embed(N, mx.array([5, 63])))
    assert rel_err(emb, W[[5, 63]]) < 1e-6  # fma(q, d*sc, -dmin*m): within an ulp of gguf-py's two steps
    flag = os.environ.get("TARG_MLX_Q4K_LAYOUT")
    assert flag is None or N.q4k_layout() == flag  # the layout the test below asked for is the one tested


def test_q4k_tiles_in_the_other_layout_keep_their_values_and_multiply_like_them():
    """Both Q4_K layouts are in every build, but a process runs one (read once): the test above
    runs again in a process that asks for the other (on AVX512-VNNI: k4's own vpdpbusd kernel)."""
    other = "tiles" if native.q4k_layout() == "k4" else "k4"
    test = f"{__file__}::test_q4k_tiles_keep_the_blocks_values_and_multiply_like_them"
    # the kernels from where this process loaded them (this test's TARG_MLX_CACHE is a fresh folder)
    cache = Path(native.module().__file__).parents[2]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                       env={**os.environ, "TARG_MLX_Q4K_LAYOUT": other, "TARG_MLX_CACHE": str(cache)},
                       capture_output=True, text=True)
    assert r.returncode == 0 and "1 passed" in r.stdout, f"layout {other}:\n{r.stdout[-3000:]}{r.stderr[-2000:]}"


def test_q6k_rows_on_the_other_kernel_multiply_like_the_dequantized_matrix():
    """AVX512-VNNI builds hold two Q6_K kernels (the 512-bit one by default, the AVX2 one on
    TARG_MLX_Q6K_KERNEL=avx2), a process runs one: the matmul and batch tests run again in a
    process that asks for the other. Elsewhere there is one kernel and nothing to compare."""
    if native.module().simd() != "avx512-vnni":
        pytest.skip(f"one Q6_K kernel in this build ({native.q6k_kernel()})")
    other = "avx2" if native.q6k_kernel() == "avx512-vnni" else "vnni"
    tests = [f"{__file__}::test_kqlinear_matches_the_dequantized_matmul",
             f"{__file__}::test_kqlinear_rows_do_not_depend_on_the_batch",
             f"{__file__}::test_the_q6k_kernel_asked_for_is_the_one_running"]
    cache = Path(native.module().__file__).parents[2]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                       env={**os.environ, "TARG_MLX_Q6K_KERNEL": other, "TARG_MLX_CACHE": str(cache)},
                       capture_output=True, text=True)
    assert r.returncode == 0 and " passed" in r.stdout and "skipped" not in r.stdout, \
        f"kernel {other}:\n{r.stdout[-3000:]}{r.stderr[-2000:]}"


def test_the_q6k_kernel_asked_for_is_the_one_running(N):
    simd = N.simd()  # unset: the build's own (512-bit on AVX512-VNNI); a flag picks on VNNI builds only
    default = {"avx512-vnni": "avx512-vnni", "avx512": "avx2", "avx2": "avx2"}.get(simd, "portable")
    flag = os.environ.get("TARG_MLX_Q6K_KERNEL")
    want = {"avx2": "avx2", "vnni": "avx512-vnni"}.get(flag, default) if simd == "avx512-vnni" else default
    assert native.q6k_kernel() == want


def test_a_q6k_kernel_flag_that_is_neither_kernel_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("TARG_MLX_Q6K_KERNEL", "avx512")
    with pytest.raises(ValueError, match="TARG_MLX_Q6K_KERNEL='avx512': use avx2 or vnni"):
        native.q6k_kernel()


needs_q6k_tiles = pytest.mark.skipif(native.module() is None or native.module().simd() != "avx512-vnni",
                                     reason="Q6_K tiles have a kernel on AVX512-VNNI builds only")


@needs_q6k_tiles
@pytest.mark.parametrize("K", [256, 1536])
def test_q6k_tiles_keep_the_blocks_values_and_multiply_like_them(N, K):
    """Q6_K tiles (csrc/k6tiles.h) hold the file's values, scales and d in the file's bytes, and
    multiply like the blocks they came from, rows independent of the batch."""
    rng = np.random.default_rng(K)
    blocks = random_blocks(rng, pack.Q6_K, 48, K)
    W = deq(blocks, pack.Q6_K)
    t = gguf_blocks.q6k_tiles(blocks)
    assert t.kind == ("tiles", 6, False) and t.nbytes == blocks.nbytes
    assert np.array_equal(np.array(pack.dequantize(t)), W)  # bit for bit gguf-py's (d * sc) * (q - 32)
    x = rng.standard_normal((17, K)).astype(np.float32)
    for M in (1, 2, 7, 8, 9, 17):  # fewer rows than a block, a block, and a remainder
        assert rel_err(t.linear(N, mx.array(x[:M])), x[:M] @ W.T) < 0.03
    bias, res = rng.standard_normal(48).astype(np.float32), rng.standard_normal((17, 48)).astype(np.float32)
    full = np.array(t.linear(N, mx.array(x), bias=mx.array(bias), residual=mx.array(res)))
    assert rel_err(full, x @ W.T + bias + res) < 0.03
    for i in (0, 8, 16):  # each row alone gives its bits in the batch
        alone = np.array(t.linear(N, mx.array(x[i : i + 1]), bias=mx.array(bias), residual=mx.array(res[i : i + 1])))
        np.testing.assert_array_equal(alone[0], full[i])


@needs_q6k_tiles
def test_q6k_matrices_become_tiles_or_stay_rows_as_the_process_asks():
    blocks = random_blocks(np.random.default_rng(3), pack.Q6_K, 32, 256)
    w = gguf_blocks.kernel_weights(pack.Q6_K, blocks)
    assert w.kind == (("tiles", 6, False) if native.q6k_layout() == "tiles" else ("kquant", pack.Q6_K))
    assert gguf_blocks.kernel_weights(pack.Q6_K, blocks, embedding=True).kind == ("kquant", pack.Q6_K)  # looked up
    flag = os.environ.get("TARG_MLX_Q6K_LAYOUT")
    assert flag is None or native.q6k_layout() == flag


@needs_q6k_tiles
def test_a_model_with_q6k_in_rows_runs_as_with_tiles():
    """The model test again in a process that keeps Q6_K in rows (TARG_MLX_Q6K_LAYOUT=rows)."""
    other = "rows" if native.q6k_layout() == "tiles" else "tiles"
    tests = [f"{__file__}::test_a_model_on_stored_blocks_matches_mlx_lm_and_keeps_rows_independent",
             f"{__file__}::test_q6k_matrices_become_tiles_or_stay_rows_as_the_process_asks"]
    cache = Path(native.module().__file__).parents[2]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                       env={**os.environ, "TARG_MLX_Q6K_LAYOUT": other, "TARG_MLX_CACHE": str(cache)},
                       capture_output=True, text=True)
    assert r.returncode == 0 and "2 passed" in r.stdout, f"Q6_K {other}:\n{r.stdout[-3000:]}{r.stderr[-2000:]}"


def test_a_q6k_layout_flag_that_is_neither_form_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("TARG_MLX_Q6K_LAYOUT", "k6")
    with pytest.raises(ValueError, match="TARG_MLX_Q6K_LAYOUT='k6': use rows or tiles"):
        native.q6k_layout()


def test_bad_blocks_are_one_line_errors(N):
    with pytest.raises(ValueError, match="type must be 12"):
        N.kqlinear(mx.zeros((1, 256)), mx.zeros((4, 144), dtype=mx.uint8), 13)
    with pytest.raises(ValueError, match="whole super-blocks"):
        N.kqlinear(mx.zeros((1, 256)), mx.zeros((4, 100), dtype=mx.uint8), pack.Q4_K)
    with pytest.raises(ValueError, match="weights expect 256"):
        N.kqlinear(mx.zeros((1, 300)), mx.zeros((4, 144), dtype=mx.uint8), pack.Q4_K)


def tiny_qwen(rng):
    """A 2-layer qwen2 whose every matrix is random K-quant blocks, laid out as a Q4_K_M file
    lays them out (q, k, o, gate, up in Q4_K; v and down in Q6_K, as in alternate layers there;
    the embedding Q4_K and the output Q6_K), and the same model with the blocks dequantized."""
    args = qwen2.ModelArgs(model_type="qwen2", hidden_size=256, num_hidden_layers=2, intermediate_size=512,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=320,
                           tie_word_embeddings=False)
    model = qwen2.Model(args)
    stored, weights = {}, {}
    shapes = {"self_attn.q_proj": (256, pack.Q4_K), "self_attn.k_proj": (128, pack.Q4_K),
              "self_attn.v_proj": (128, pack.Q6_K), "self_attn.o_proj": (256, pack.Q4_K),
              "mlp.gate_proj": (512, pack.Q4_K), "mlp.up_proj": (512, pack.Q4_K), "mlp.down_proj": (256, pack.Q6_K)}
    for i in range(2):
        for name, (n, qtype) in shapes.items():
            k = 512 if name == "mlp.down_proj" else 256
            stored[f"model.layers.{i}.{name}"] = (qtype, random_blocks(rng, qtype, n, k, 2e-4 if qtype == pack.Q4_K else 2e-5))
    stored["model.embed_tokens"] = (pack.Q4_K, random_blocks(rng, pack.Q4_K, 320, 256, 1e-3))
    stored["lm_head"] = (pack.Q6_K, random_blocks(rng, pack.Q6_K, 320, 256, 1e-4))
    for path, (qtype, b) in stored.items():
        weights[f"{path}.weight"] = mx.array(deq(b, qtype))
    model.load_weights(list(weights.items()), strict=False)
    mx.eval(model.parameters())
    kernels = {p: gguf_blocks.kernel_weights(t, b, embedding=p == "model.embed_tokens") for p, (t, b) in stored.items()}
    return model, kernels, stored


def test_a_model_on_stored_blocks_matches_mlx_lm_and_keeps_rows_independent(N):
    model, stored, raw = tiny_qwen(np.random.default_rng(0))
    lm = NativeLM.build(model, N, stored)
    v_kind = ("tiles", 6, False) if native.q6k_layout() == "tiles" else ("kquant", pack.Q6_K)
    assert [p.kind for p in lm.layers[0].qkv] == [("tiles", 4, True), v_kind]  # q|k fused, v apart
    assert [p.kind for p in lm.layers[0].gate_up] == [("tiles", 4, True)]
    assert isinstance(lm.embed, KBlocks)  # an embedding is looked up: it stays in rows
    assert {lm.head_w.kind, lm.layers[1].down.kind} == {v_kind}
    file_bytes = sum(b.nbytes for _, b in raw.values())
    assert file_bytes < lm.nbytes < 1.02 * file_bytes  # Q4_K tiles: 4.625 bits a weight, the file's 4.5
    tokens = mx.array(np.random.default_rng(1).integers(0, 320, (3, 12)), dtype=mx.int32)
    ref = model(tokens, make_prompt_cache(model))
    got = lm(tokens, make_prompt_cache(model))
    assert rel_err(got, np.array(ref)) < 0.05
    for i in range(3):  # the skip == Never identity rests on this
        assert mx.array_equal(lm(tokens[i : i + 1], make_prompt_cache(model))[0], got[i])
    # the repack cache's round trip
    again = NativeLM.from_state(model, N, lm.state())
    assert mx.array_equal(again(tokens, make_prompt_cache(model)), got)


def test_a_q4k_layout_flag_that_is_neither_kernel_is_a_one_line_error(monkeypatch):
    from targ_mlx.runtime import native

    monkeypatch.setenv("TARG_MLX_Q4K_LAYOUT", "vnni")
    with pytest.raises(ValueError, match="TARG_MLX_Q4K_LAYOUT='vnni': use k4 or tiles"):
        native.q4k_layout()


def test_q4k_tiles_take_zero_rows(N):
    blocks = random_blocks(np.random.default_rng(5), pack.Q4_K, 32, 256)
    y = gguf_blocks.q4k_tiles(blocks).linear(N, mx.zeros((0, 256)))
    assert y.shape == (0, 32)


def _separate_linear(N, x, parts, bias):
    """The q|k|v or gate|up product as the separate ops compute it: one part takes the bias in
    its product; several are concatenated and the bias added after."""
    if len(parts) == 1:
        return parts[0].linear(N, x, bias=bias)
    y = mx.concatenate([p.linear(N, x) for p in parts], axis=-1)
    return y if bias is None else y + bias



def _separate_layer(N, x, norm_in, qkv, qkv_bias, cos, sin, heads, cache, pad, o, o_bias, norm_post, gate_up, gu_bias,
                    down, down_bias):
    """A decoder layer as NativeLM runs a prefill: the separate ops and mlx-lm's cache update."""
    q, k, v = N.rope_split(_separate_linear(N, N.rms_norm(x, norm_in, 1e-6), qkv, qkv_bias), cos, sin, *heads)
    h = o.linear(N, N.attention(q, *cache.update_and_fetch(k, v), 0.125, pad), bias=o_bias, residual=x)
    gu = _separate_linear(N, N.rms_norm(h, norm_post, 1e-6), gate_up, gu_bias)
    return down.linear(N, N.swiglu(gu), bias=down_bias, residual=h), k


@pytest.mark.parametrize("B,L", [(1, 1), (2, 1), (2, 4)])
def test_a_decoder_layer_node_gives_the_separate_ops_bits(N, B, L):
    """decoder_layer (one graph node) writes the step's keys and values into the cache's own
    buffers (its outputs share them) and gives the bits of the separate ops around mlx-lm's
    update_and_fetch, for a one-prompt cache and a left-padded batch cache, with matrices of mixed
    forms (Q4_K tiles, Q6_K blocks, 8-bit tiles) in parts, with and without biases."""
    from mlx_lm.models.cache import BatchKVCache, KVCache

    from targ_mlx.runtime.native.model import _parts

    rng = np.random.default_rng(B * 10 + L)
    H, Hq, Hkv, D, I = 512, 4, 2, 64, 768
    q4 = lambda n, k: gguf_blocks.q4k_tiles(random_blocks(rng, pack.Q4_K, n, k, scale=0.01))
    q6 = lambda n, k: KBlocks(mx.array(random_blocks(rng, pack.Q6_K, n, k, scale=0.01)), pack.Q6_K)
    t8 = lambda n, k: pack.from_float(mx.array(rng.standard_normal((n, k)).astype(np.float32) * 0.05))
    f = lambda *s: mx.array(rng.standard_normal(s).astype(np.float32))
    heads = (Hq, Hkv, D, False)
    x, norm_in, norm_post = f(B, L, H), f(H) * 0.1 + 1, f(H) * 0.1 + 1
    inv = mx.exp(mx.arange(0, -D // 2, -1, dtype=mx.float32) * (math.log(1e4) / (D // 2)))
    cos, sin = N.rope_table(mx.array([30] * B, dtype=mx.int32), inv, B, L, 1.0)
    k0, v0 = f(B, Hkv, 30, D), f(B, Hkv, 30, D)
    layers = (([q4((Hq + Hkv) * D, H), q6(Hkv * D, H)], f((Hq + 2 * Hkv) * D), q4(H, Hq * D), f(H),
               [q4(I, H), t8(I, H)], f(2 * I), q6(H, I), f(H)),
              ([q4((Hq + 2 * Hkv) * D, H)], None, q6(H, Hq * D), None, [q4(2 * I, H)], None, t8(H, I), None))
    for qkv, qkv_bias, o, o_bias, gate_up, gu_bias, down, down_bias in layers:
        for make, pad in ((lambda: KVCache(), None), (lambda: BatchKVCache([0, 5][:B]), mx.array([0, 5][:B], dtype=mx.int32))):
            old, new = make(), make()
            for c in (old, new):  # a prefilled prompt of 30 positions in a 256-position buffer
                c.update_and_fetch(k0, v0)
            want, k = _separate_layer(N, x, norm_in, qkv, qkv_bias, cos, sin, heads, old, pad, o, o_bias, norm_post,
                                      gate_up, gu_bias, down, down_bias)
            got, keys, values = N.decoder_layer(
                x, norm_in, 1e-6, *_parts(qkv), qkv_bias, cos, sin, *heads, new.keys, new.values, 30, 0.125, pad, 0,
                *o.spec(), o_bias, norm_post, 1e-6, *_parts(gate_up), gu_bias, *down.spec(), down_bias)
            mx.eval(got, keys, values)
            assert mx.array_equal(got, want)
            assert keys.shape == old.keys.shape and mx.array_equal(keys[:, :, : 30 + L], old.keys[:, :, : 30 + L])
            assert mx.array_equal(new.keys[:, :, 30 : 30 + L], k)  # written in place: the cache's own array holds them
    with pytest.raises(ValueError, match="decoder_layer: the new positions must fit in the cache's capacity"):
        N.decoder_layer(x, norm_in, 1e-6, *_parts(qkv), qkv_bias, cos, sin, *heads, new.keys, new.values, 257 - L, 0.125,
                        pad, 0, *o.spec(), o_bias, norm_post, 1e-6, *_parts(gate_up), gu_bias, *down.spec(), down_bias)

def test_a_decoder_layer_names_a_part_that_does_not_fit(N):
    rng = np.random.default_rng(0)
    w = gguf_blocks.q4k_tiles(random_blocks(rng, pack.Q4_K, 64, 512))
    x, cache = mx.zeros((1, 1, 256)), mx.zeros((1, 0, 256, 64))
    form, arrays = w.spec()
    with pytest.raises(ValueError, match="decoder_layer: a part expects 512 inputs, the layer has 256"):
        N.decoder_layer(x, mx.ones((256,)), 1e-6, [form], arrays, None, mx.zeros((1, 1, 8)), mx.zeros((1, 1, 8)), 1, 0, 64,
                        False, cache, cache, 0, 0.125, None, 0, form, arrays, None, mx.ones((256,)), 1e-6, [form], arrays,
                        None, form, arrays, None)
