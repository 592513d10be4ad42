"""The sentence encoder's CPU kernels (csrc/bert.h) against plain numpy: exact-erf GELU,
LayerNorm with its residual, and bidirectional attention that stops at each row's length."""

import math
import sys

import mlx.core as mx
import numpy as np
import pytest


pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="the CPU kernels are for CPU-only MLX (Linux)")


def test_gelu_is_the_exact_erf_form_not_the_tanh_one(N):
    x = np.linspace(-9, 9, 4099, dtype=np.float32)  # odd length: the scalar tail runs too
    want = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    got = np.asarray(N.gelu(mx.array(x)))
    assert np.max(np.abs(got - want)) < 2e-6
    tanh_form = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    assert np.max(np.abs(tanh_form - want)) > 1e-4  # the two forms are told apart at this tolerance


def test_layer_norm_adds_the_residual_first(N):
    rng = np.random.default_rng(0)
    x, r = rng.normal(3, 2, (37, 384)).astype(np.float32), rng.normal(0, 1, (37, 384)).astype(np.float32)
    w, b = rng.normal(1, 0.1, 384).astype(np.float32), rng.normal(0, 0.1, 384).astype(np.float32)
    h = (x + r).astype(np.float64)
    want = (h - h.mean(1, keepdims=True)) / np.sqrt(h.var(1, keepdims=True) + 1e-12) * w + b
    got = np.asarray(N.layer_norm(mx.array(x), mx.array(w), mx.array(b), 1e-12, residual=mx.array(r)))
    assert np.max(np.abs(got - want)) < 1e-4
    plain = np.asarray(N.layer_norm(mx.array(x + r), mx.array(w), mx.array(b), 1e-12))
    np.testing.assert_allclose(plain, got, atol=1e-5)


def test_layer_norm_gives_a_row_the_same_bits_whatever_rows_share_its_pass(N):
    """Rows are normalised 8 at a time (their sums' chains side by side); each row's sums still run
    in its own order, so a row alone and among 36 others (37: a last pass of 5) are the same bits."""
    rng = np.random.default_rng(2)
    x, r = rng.normal(3, 2, (37, 384)).astype(np.float32), rng.normal(0, 1, (37, 384)).astype(np.float32)
    w, b = rng.normal(1, 0.1, 384).astype(np.float32), rng.normal(0, 0.1, 384).astype(np.float32)
    args = (mx.array(w), mx.array(b), 1e-12)
    together = np.asarray(N.layer_norm(mx.array(x), *args, residual=mx.array(r)))
    for i in (0, 7, 8, 31, 36):
        alone = np.asarray(N.layer_norm(mx.array(x[i:i + 1]), *args, residual=mx.array(r[i:i + 1])))
        np.testing.assert_array_equal(alone[0], together[i])


def _attention(qkv, n, heads):
    L, W = qkv.shape
    D = W // 3 // heads
    out = np.zeros((L, W // 3))
    for h in range(heads):
        q, k, v = (qkv[:n, (i * heads + h) * D:(i * heads + h + 1) * D].astype(np.float64) for i in range(3))
        s = q @ k.T / math.sqrt(D)
        p = np.exp(s - s.max(1, keepdims=True))
        out[:n, h * D:(h + 1) * D] = (p / p.sum(1, keepdims=True)) @ v
    return out


@pytest.mark.parametrize("L", [5, 37, 70])  # below, between and above the 8- and 32-key blocks
def test_bidir_attention_stops_at_each_rows_length(N, L):
    rng = np.random.default_rng(L)
    heads, D = 12, 32
    qkv = rng.normal(0, 1, (3, L, 3 * heads * D)).astype(np.float32)
    lengths = np.array([L, max(1, L - 4), 1], dtype=np.int32)
    got = np.asarray(N.bidir_attention(mx.array(qkv), mx.array(lengths), heads, 1 / math.sqrt(D)))
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(got[b], _attention(qkv[b], n, heads), atol=2e-5)
        assert not got[b, n:].any()  # padding rows are zero
    # what sits in the padding does not reach the real rows
    noisy = qkv.copy()
    noisy[1, lengths[1]:] = 1e3
    again = np.asarray(N.bidir_attention(mx.array(noisy), mx.array(lengths), heads, 1 / math.sqrt(D)))
    np.testing.assert_array_equal(again, got)


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to even), as float64."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("M,K,cols", [(13, 66, 64), (200, 384, 1152), (3, 1536, 16), (53, 384, 48)])
def test_bf16_linear_is_the_product_of_the_bfloat16_roundings(N, M, K, cols):
    """Every row and column is x's and W's values rounded to bfloat16 and summed in float32: rows
    not a multiple of the 8-row tile, columns not of the 48-column one (13 rows, 64 = 48 + 16); on
    AMX-BF16 tiles rows not of 32 or 16 (53 = 32 + 16 + 5 zero-padded), columns not of 32."""
    if not N.bf16_products():
        pytest.skip(f"this build multiplies no bfloat16 ({N.simd()})")
    rng = np.random.default_rng(M)
    x = rng.normal(0, 1, (M, K)).astype(np.float32)
    w = rng.normal(0, 0.05, (K, cols)).astype(np.float32)
    b = rng.normal(0, 1, cols).astype(np.float32)
    got = np.asarray(N.bf16_linear(mx.array(x), N.bf16_pack(mx.array(w)), mx.array(b)))
    want = _bf16(x) @ _bf16(w) + b
    np.testing.assert_allclose(got, want, atol=2e-5 * math.sqrt(K))
    # and not the float32 product: the rounding shows at this tolerance
    assert np.max(np.abs(x.astype(np.float64) @ w + b - want)) > 2e-5 * math.sqrt(K)
    # a row's result does not depend on the rows beside it
    for i in sorted({0, min(17, M - 1), min(33, M - 1), M - 1}):
        one = np.asarray(N.bf16_linear(mx.array(x[i:i + 1]), N.bf16_pack(mx.array(w)), mx.array(b)))
        np.testing.assert_array_equal(one[0], got[i])


def test_bf16_linear_on_amx_tiles_gives_the_vdpbf16ps_products(N):
    """Where AMX-BF16 tiles are granted bf16_linear multiplies on them (set_amx("vnni") keeps
    vdpbf16ps): the same products of bfloat16 values, summed in another order."""
    if not N.bf16_products() or not N.amx_status().startswith("on"):
        pytest.skip(f"no AMX tiles here: {N.amx_status()}")
    rng = np.random.default_rng(5)
    x = mx.array(rng.normal(0, 1, (53, 1536)).astype(np.float32))
    w = N.bf16_pack(mx.array(rng.normal(0, 0.05, (1536, 400)).astype(np.float32)))
    b = mx.array(rng.normal(0, 1, 400).astype(np.float32))
    try:
        N.set_amx("vnni")
        want = np.asarray(N.bf16_linear(x, w, b, gelu=True))
    finally:
        N.set_amx("amx")
    got = np.asarray(N.bf16_linear(x, w, b, gelu=True))
    np.testing.assert_allclose(got, want, atol=1e-5 * math.sqrt(1536))
    assert not np.array_equal(got, want)  # the tiles ran, not the vdpbf16ps path


def test_bf16_pack_refuses_a_shape_it_cannot_pair_in_one_line(N):
    with pytest.raises(ValueError) as e:
        N.bf16_pack(mx.zeros((5, 32)))
    assert "K even" in str(e.value)


def test_bf16_linear_with_gelu_is_gelu_of_the_product(N):
    """The up projection's GELU applied tile by tile gives what GELU of the whole product gives."""
    if not N.bf16_products():
        pytest.skip(f"this build multiplies no bfloat16 ({N.simd()})")
    rng = np.random.default_rng(1)
    x, w = mx.array(rng.normal(0, 1, (21, 384)).astype(np.float32)), N.bf16_pack(mx.array(rng.normal(0, 0.05, (384, 1552)).astype(np.float32)))
    b = mx.array(rng.normal(0, 1, 1552).astype(np.float32))
    plain = N.bf16_linear(x, w, b)
    np.testing.assert_array_equal(np.asarray(N.bf16_linear(x, w, b, gelu=True)), np.asarray(N.gelu(plain)))


def _attention_bf16(qkv, n, heads):
    """What bidir_attention(bf16=True) computes: q, k, v and the probabilities rounded to bfloat16,
    products summed and the softmax taken in float32 (here float64)."""
    L, W = qkv.shape
    D = W // 3 // heads
    out = np.zeros((L, W // 3))
    for h in range(heads):
        q, k, v = (_bf16(qkv[:n, (i * heads + h) * D:(i * heads + h + 1) * D]) for i in range(3))
        s = q @ k.T / math.sqrt(D)
        p = np.exp(s - s.max(1, keepdims=True))
        out[:n, h * D:(h + 1) * D] = (_bf16(p.astype(np.float32)) @ v) / p.sum(1, keepdims=True)
    return out


@pytest.mark.parametrize("L", [5, 37, 70])  # below and above the 32-key block, odd key counts
def test_bf16_attention_rounds_its_operands_and_still_stops_at_each_rows_length(N, L):
    if not N.bf16_products():
        pytest.skip(f"this build multiplies no bfloat16 ({N.simd()})")
    rng = np.random.default_rng(L)
    heads, D = 12, 32
    qkv = rng.normal(0, 1, (3, L, 3 * heads * D)).astype(np.float32)
    lengths = np.array([L, max(1, L - 4), 1], dtype=np.int32)
    got = np.asarray(N.bidir_attention(mx.array(qkv), mx.array(lengths), heads, 1 / math.sqrt(D), bf16=True))
    for b, n in enumerate(lengths):
        # a probability whose float32 value sits on a bfloat16 rounding edge may round the other way
        np.testing.assert_allclose(got[b], _attention_bf16(qkv[b], n, heads), atol=1e-3)
        assert not got[b, n:].any()
    assert np.abs(got[0] - _attention(qkv[0], L, heads)).max() > 3e-3  # bfloat16 ran, not float32
    noisy = qkv.copy()
    noisy[1, lengths[1]:] = 1e3
    again = np.asarray(N.bidir_attention(mx.array(noisy), mx.array(lengths), heads, 1 / math.sqrt(D), bf16=True))
    np.testing.assert_array_equal(again, got)


@pytest.mark.parametrize("bf16", [False, True])
def test_packed_attention_is_the_padded_one_without_the_padding(N, bf16):
    """qkv (T, 3H) with the sequences' rows one after another (no padding computed) gives each
    sequence's rows exactly the padded batch's."""
    if bf16 and not N.bf16_products():
        pytest.skip(f"this build multiplies no bfloat16 ({N.simd()})")
    rng = np.random.default_rng(9)
    heads, D, L = 12, 32, 70
    lengths = np.array([70, 3, 41, 1, 66], dtype=np.int32)
    padded = rng.normal(0, 1, (len(lengths), L, 3 * heads * D)).astype(np.float32)
    packed = np.concatenate([padded[b, :n] for b, n in enumerate(lengths)])
    want = np.asarray(N.bidir_attention(mx.array(padded), mx.array(lengths), heads, 1 / math.sqrt(D), bf16=bf16))
    got = np.asarray(N.bidir_attention(mx.array(packed), mx.array(lengths), heads, 1 / math.sqrt(D), bf16=bf16))
    assert got.shape == (lengths.sum(), heads * D)
    np.testing.assert_array_equal(got, np.concatenate([want[b, :n] for b, n in enumerate(lengths)]))


def test_packed_attention_refuses_lengths_that_do_not_cover_its_rows(N):
    with pytest.raises(ValueError) as e:
        N.bidir_attention(mx.zeros((10, 3 * 12 * 32)), mx.array(np.array([4, 5], dtype=np.int32)), 12, 0.17)
    assert "sum to 9, not qkv's 10 rows" in str(e.value)


def test_bf16_attention_on_amx_tiles_gives_the_vdpbf16ps_products(N):
    """Where AMX-BF16 tiles are granted the bfloat16 attention multiplies on them (set_amx("vnni")
    keeps vdpbf16ps): the same bfloat16 operands and probabilities, summed in another order;
    sequences of 1, 17 and 70 keys (a part block of queries and of keys)."""
    if not N.bf16_products() or not N.amx_status().startswith("on"):
        pytest.skip(f"no AMX tiles here: {N.amx_status()}")
    rng = np.random.default_rng(11)
    lengths = np.array([70, 1, 17], dtype=np.int32)
    for heads, D in ((12, 32), (4, 64)):
        qkv = mx.array(rng.normal(0, 1, (int(lengths.sum()), 3 * heads * D)).astype(np.float32))
        try:
            N.set_amx("vnni")
            want = np.asarray(N.bidir_attention(qkv, mx.array(lengths), heads, 1 / math.sqrt(D), bf16=True))
        finally:
            N.set_amx("amx")
        got = np.asarray(N.bidir_attention(qkv, mx.array(lengths), heads, 1 / math.sqrt(D), bf16=True))
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert not np.array_equal(got, want)  # the tiles ran, not the vdpbf16ps path
