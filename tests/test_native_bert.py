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
