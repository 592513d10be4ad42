"""AMX int8 tiles at prefill (csrc/amx.h, amx_tiles.h) against the VNNI kernels.

The tile layout is checked on every machine through the plain C++ tile engine (what TDPBSUD and
the tile loads do, in loops): the B tiles unpacked from each stored layout must give each group's
integer dot products as numpy does. Where the build has the VNNI kernels the tile kernels (with
the K-quants' scales inside their B tiles) run on that engine too, and where the CPU grants AMX
on the hardware: either way every output, a model's logits and its KV cache must be the VNNI
kernels' bit for bit (the integer sums are exact and the float operations are the same, in the
same order).
"""

import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from targ_mlx.runtime import gguf_blocks
from targ_mlx.runtime.native import pack
from targ_mlx.runtime.native.model import NativeLM

from test_kquant import random_blocks, tiny_qwen

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="the CPU kernels are for CPU-only MLX (Linux)")


def vnni_build(N) -> bool:
    return N.simd() == "avx512-vnni"


def amx_granted(N) -> bool:
    return N.amx_status().startswith("on")


def tile_engine(N) -> str:
    """The tile engine to compare with the VNNI kernels here: the hardware where granted."""
    if not vnni_build(N):
        pytest.skip(f"the tile kernels are built on AVX512-VNNI builds only; this one is {N.simd()}")
    return "amx" if amx_granted(N) else "ref"


def matrices(with_q6k: bool) -> dict:
    rng = np.random.default_rng(7)
    out = {"Q4_K": gguf_blocks.q4k_tiles(random_blocks(rng, pack.Q4_K, 48, 512, 0.01))}
    if with_q6k:
        out["Q6_K"] = gguf_blocks.q6k_tiles(random_blocks(rng, pack.Q6_K, 48, 512, 0.01))
    for bits in (4, 8):  # K = 608: 19 groups, not a whole number of the kernel's 8-group chunks
        vals = rng.integers(0, 2**bits, (32, 608))
        s, b = rng.uniform(0.01, 0.02, (32, 19)).astype(np.float32), rng.uniform(-0.1, 0, (32, 19)).astype(np.float32)
        out[f"affine {bits}-bit"] = pack.from_values(vals, s, b, bits)
    return out


def test_the_tile_layout_gives_each_groups_integer_dot_products(N):
    """Portable: B tiles unpacked from each stored layout, multiplied by the plain C++ TDPBSUD
    against int8 rows, give per group (Q6_K: per sub-block of 16) numpy's sum of value x x."""
    rng = np.random.default_rng(3)
    for name, P in matrices(with_q6k=vnni_build(N)).items():
        vals = pack.to_values(P).astype(np.int64)  # (N, K), unsigned
        n, k = vals.shape
        xq = rng.integers(-127, 128, (32, k)).astype(np.int8)
        span = 16 if name == "Q6_K" else 32
        prod = xq.astype(np.int64)[:, None, :] * vals[None, :, :]  # (M, N, K)
        want = prod.reshape(32, n, k // span, span).sum(-1).transpose(0, 2, 1)
        for simd in (False, True):
            got = np.array(N.tile_dots(mx.array(xq), *P.args(), simd_unpack=simd))
            assert np.array_equal(got, want), (name, simd)


# the hardware takes 32 rows and more (48 for Q6_K); Q4_K goes 32 rows a block, 48 leaves a block
# of 16 (and 37 one of 32 and a rest of 5 for the VNNI kernel)
@pytest.mark.parametrize("M", [16, 37, 48, 64])
def test_the_tile_kernels_give_the_vnni_kernels_bits(N, M):
    engine = tile_engine(N)
    rng = np.random.default_rng(M)
    try:
        for name, P in matrices(with_q6k=True).items():
            n, k = P.shape
            x = mx.array(rng.standard_normal((M, k)).astype(np.float32))
            bias, res = mx.array(rng.standard_normal(n).astype(np.float32)), mx.array(rng.standard_normal((M, n)).astype(np.float32))
            N.set_amx("vnni")
            want = [N.qlinear(x, *P.args()), N.qlinear(x, *P.args(), bias=bias, residual=res)]
            mx.eval(want)
            N.set_amx(engine)
            got = [N.qlinear(x, *P.args()), N.qlinear(x, *P.args(), bias=bias, residual=res)]
            for a, b in zip(got, want):
                assert mx.array_equal(a, b), (name, engine)
    finally:
        N.set_amx("amx" if amx_granted(N) else "vnni")


@pytest.mark.parametrize("M", [16, 37, 48, 64])
def test_a_gate_up_product_finishes_as_swiglu_with_the_two_ops_bits(N, M):
    """qlinear(swiglu=True) on a gate|up matrix (its up half 3 tiles after its gate half): SwiGLU
    inside the tile products, rows past the last 16 on the VNNI kernel, as the product and then
    the SwiGLU op give it, in every stored form."""
    engine = tile_engine(N)
    rng = np.random.default_rng(100 + M)
    forms = {"Q4_K": gguf_blocks.q4k_tiles(random_blocks(rng, pack.Q4_K, 96, 512, 0.01)),
             "Q6_K": gguf_blocks.q6k_tiles(random_blocks(rng, pack.Q6_K, 96, 512, 0.01))}
    for bits in (4, 8):
        vals = rng.integers(0, 2**bits, (96, 608))
        s, b = rng.uniform(0.01, 0.02, (96, 19)).astype(np.float32), rng.uniform(-0.1, 0, (96, 19)).astype(np.float32)
        forms[f"affine {bits}-bit"] = pack.from_values(vals, s, b, bits)
    try:
        for name, P in forms.items():
            x = mx.array(rng.standard_normal((M, P.shape[1])).astype(np.float32))
            for eng in ("vnni", engine):
                N.set_amx(eng)
                want = N.swiglu(N.qlinear(x, *P.args()))
                got = N.qlinear(x, *P.args(), swiglu=True)
                assert got.shape == (M, 48) and mx.array_equal(got, want), (name, eng)
    finally:
        N.set_amx("amx" if amx_granted(N) else "vnni")


def _forward(N, engine, lm, model, tokens):
    N.set_amx(engine)
    cache = make_prompt_cache(model)
    out = lm(tokens, cache)
    mx.eval(out, [c.state for c in cache])
    return out, cache


def test_a_k_quant_model_gives_the_same_logits_and_cache_on_tiles(N):
    """Q4_K and Q6_K tiles as a Q4_K_M file lays them out, 3 rows x 50 tokens (blocks of 16 and
    a rest), and one row of 50."""
    engine = tile_engine(N)
    model, kernels, _ = tiny_qwen(np.random.default_rng(0))
    lm = NativeLM.build(model, N, kernels)
    tokens = mx.array(np.random.default_rng(1).integers(0, 320, (3, 50)), dtype=mx.int32)
    try:
        for rows in (tokens, tokens[:1]):
            (a, ca), (b, cb) = _forward(N, "vnni", lm, model, rows), _forward(N, engine, lm, model, rows)
            assert mx.array_equal(a, b)
            assert all(mx.array_equal(x.keys, y.keys) and mx.array_equal(x.values, y.values) for x, y in zip(ca, cb))
    finally:
        N.set_amx("amx" if amx_granted(N) else "vnni")


def test_smollm2_prefill_gives_the_same_logits_and_cache_on_amx(N, backbone):
    """The shipped model (Q4_1 in 4-bit affine tiles, Q8_0 in 8-bit) on the hardware's tiles."""
    if not vnni_build(N) or not amx_granted(N):
        pytest.skip(f"AMX tiles not in use here: {N.amx_status()}")
    ids = [(i * 7919) % 40000 + 100 for i in range(150)]
    out = {}
    try:
        for engine in ("vnni", "amx"):
            N.set_amx(engine)
            cache = backbone.make_cache()
            lg = backbone.prefill(ids, cache)
            out[engine] = (lg, cache)
    finally:
        N.set_amx("amx")
    (a, ca), (b, cb) = out["vnni"], out["amx"]
    assert mx.array_equal(a, b)
    assert all(mx.array_equal(x.keys, y.keys) and mx.array_equal(x.values, y.values) for x, y in zip(ca, cb))


def test_the_engine_switch_names_bad_modes_and_says_why_amx_is_off(N):
    with pytest.raises(ValueError, match="none of amx, vnni, ref"):
        N.set_amx("tiles")
    status = N.amx_status()
    assert status.startswith("on") or status.startswith("off")
    if not amx_granted(N):
        with pytest.raises(ValueError, match="AMX off"):
            N.set_amx("amx")
