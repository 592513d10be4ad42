"""A prompt's attention on AMX-BF16 tiles (`attention(..., tiles=True)`, csrc/attn_tiles.h): close
to float32, and each query's bits its own, whatever its batch, padding, chunk or shared prompt.
Runs where the tiles are granted (Intel AMX); elsewhere `tiles=True` is the float32 path."""

from __future__ import annotations

import sys

import mlx.core as mx
import pytest

from targ_mlx import prompts
from targ_mlx.runtime import batch
from targ_mlx.runtime.sampling import step_gap

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="the CPU kernels are for CPU-only MLX (Linux)")


@pytest.fixture(scope="module")
def T(N):
    if not N.prompt_attention_tiles(64):
        pytest.skip("no AMX-BF16 tiles here (or TARG_MLX_ATTN_BF16=0 / TARG_MLX_AMX=0)")
    return N


def reference(q, k, v, scale, lp):
    """MLX's float32 attention of the L queries at the last L of S positions over left-padded keys;
    padding positions attend to nothing (zero)."""
    (B, Hq, L, D), (Hkv, S) = q.shape, k.shape[1:3]
    kk, vv = mx.repeat(k, Hq // Hkv, axis=1), mx.repeat(v, Hq // Hkv, axis=1)
    scores = (q @ kk.transpose(0, 1, 3, 2)) * scale
    j, i = mx.arange(S)[None, None, None, :], mx.arange(L)[None, None, :, None]
    out = (mx.softmax(mx.where((j >= lp[:, None, None, None]) & (j <= S - L + i), scores, -1e30), axis=-1) @ vv)
    real = (mx.arange(S - L, S)[None, :] >= lp[:, None])[..., None]
    return mx.where(real, out.transpose(0, 2, 1, 3).reshape(B, L, Hq * D), 0.0)


@pytest.mark.parametrize("Hq,Hkv,D", [(9, 3, 64), (4, 2, 128)])
def test_prompt_attention_on_tiles_is_close_to_float32_and_not_it(T, Hq, Hkv, D):
    B, S = 2, 77  # keys across 32-key blocks, queries across 16-query blocks, a padded row
    q = mx.random.normal((B, Hq, S, D), key=mx.random.key(1))
    k = mx.random.normal((B, Hkv, S, D), key=mx.random.key(2))
    v = mx.random.normal((B, Hkv, S, D), key=mx.random.key(3))
    lp = mx.array([0, 19], dtype=mx.int32)
    tiles = T.attention(q, k, v, D**-0.5, lp, tiles=True)
    floats = T.attention(q, k, v, D**-0.5, lp)
    ref = reference(q, k, v, D**-0.5, lp)
    assert mx.abs(floats - ref).max().item() < 1e-5
    err = mx.abs(tiles - ref)
    # bfloat16 operands (8 significant bits) on outputs of size ~1: well inside 0.05, ~1e-3 typical
    assert err.max().item() < 0.05 and err.mean().item() < 2e-3
    assert not mx.array_equal(tiles, floats)  # the tiles ran: their sums are not float32's
    assert mx.array_equal(tiles[1, :19], mx.zeros((19, Hq * D)))  # padding positions: zero


@pytest.mark.parametrize("D", [64, 128])
def test_a_prompt_query_on_tiles_does_not_depend_on_batch_padding_or_chunk(T, D):
    Hq, Hkv, S = 6, 2, 70
    q = mx.random.normal((1, Hq, S, D), key=mx.random.key(4))
    k = mx.random.normal((1, Hkv, S, D), key=mx.random.key(5))
    v = mx.random.normal((1, Hkv, S, D), key=mx.random.key(6))
    alone = T.attention(q, k, v, 0.1, tiles=True)
    # the same row left-padded by 13 beside another row: its queries' bits unchanged
    pad = 13
    other = [mx.random.normal(x.shape[:2] + (S + pad,) + x.shape[3:], key=mx.random.key(7)) for x in (q, k, v)]
    padded = [mx.concatenate([mx.concatenate([mx.zeros(x.shape[:2] + (pad,) + x.shape[3:]), x], axis=2), o], axis=0)
              for x, o in zip((q, k, v), other)]
    in_batch = T.attention(*padded, 0.1, mx.array([pad, 0], dtype=mx.int32), tiles=True)
    assert mx.array_equal(in_batch[0, pad:], alone[0])
    # the prompt run in two chunks: the second chunk's queries over all the keys so far
    for first in (16, 33):
        chunk = T.attention(q[:, :, first:], k, v, 0.1, tiles=True)
        assert mx.array_equal(chunk[0], alone[0, first:]), first
    # one query alone (the last layer's `last` position) gets its bits from the whole prompt
    assert mx.array_equal(T.attention(q[:, :, -1:], k, v, 0.1, tiles=True)[0, 0], alone[0, -1])


def test_prompt_queries_over_shared_keys_on_tiles_are_the_copied_cache(T):
    R, B, Hq, Hkv, D, P, L = 2, 3, 9, 3, 64, 40, 20
    pk = mx.random.normal((R, Hkv, P, D), key=mx.random.key(8))
    pv = mx.random.normal((R, Hkv, P, D), key=mx.random.key(9))
    own_k = mx.random.normal((B, Hkv, L, D), key=mx.random.key(10))
    own_v = mx.random.normal((B, Hkv, L, D), key=mx.random.key(11))
    q = mx.random.normal((B, Hq, L, D), key=mx.random.key(12))
    rows, ppad = mx.array([0, 1, 1], dtype=mx.int32), mx.array([5, 0], dtype=mx.int32)
    shared = T.attention(q, own_k, own_v, 0.125, shared_keys=pk, shared_values=pv, shared_rows=rows, shared_pad=ppad,
                         shared_hole=2, tiles=True)
    copied = T.attention(q, mx.concatenate([pk[rows], own_k], axis=2), mx.concatenate([pv[rows], own_v], axis=2), 0.125,
                         ppad[rows], 2, tiles=True)
    assert mx.array_equal(shared, copied)


def test_prefills_on_tiles_keep_batch_and_chunk_bits_and_the_answer(backbone, T):
    """The model's prompts go through the tiles (a prefill's logits are not the float32 path's),
    a left-padded batch's rows are still bit for bit the batch-1 prefills, a prompt fed in chunks
    still gives the whole prompt's logits, and greedy answers are those of float32 attention."""
    lm = backbone.engine.lm
    qs = ["who wrote the origin of species", "what is the capital of australia",
          "when did the berlin wall fall and who was the leader of east germany then"]
    ids = [backbone.tokenizer.chat_ids(prompts.messages(q, None, "short")) for q in qs]
    logits, _ = batch.prefill_batch(backbone, ids)
    for i, p in enumerate(ids):
        one = backbone.prefill(p, backbone.make_cache())
        assert mx.array_equal(logits[i], one[0])
        floats = lm.head(lm.hidden(mx.array([p], dtype=mx.int32), backbone.make_cache(), last=True))[:, -1, :]
        assert not mx.array_equal(one, floats.astype(mx.float32))
        assert one.argmax().item() == floats.argmax().item()
        cache = backbone.make_cache()
        backbone.engine.advance(mx.array([p[:20]], dtype=mx.int32), cache)
        assert mx.array_equal(backbone.engine.last_logits(mx.array([p[20:]], dtype=mx.int32), cache), one)


def test_prompt_attention_on_tiles_moves_the_next_token_distribution_little(backbone, T):
    """SmolLM2's next token after 5 prompts, prompt attention on tiles against float32 (the same
    kernels otherwise): measured KL 0.002-0.006 nats (0.025 on a sixth prompt; the kernels' int8
    activations move it 0.002-0.008 from MLX's float32), the same top token where it leads by 0.5."""
    lm = backbone.engine.lm
    for q in ["who wrote the origin of species", "what is the tallest mountain in africa", "who painted the mona lisa",
              "what is the capital of canada", "who was the first person to reach the south pole"]:
        ids = mx.array([backbone.tokenizer.chat_ids(prompts.messages(q, None, "short"))], dtype=mx.int32)
        f, t = (lm.head(lm.hidden(ids, backbone.make_cache(), last=True, prompt=p))[:, -1, :].astype(mx.float32)
                for p in (False, True))
        pf, pt = mx.softmax(f, -1), mx.softmax(t, -1)
        assert (pf * (mx.log(pf + 1e-30) - mx.log(pt + 1e-30))).sum().item() < 0.02, q
        if step_gap(f).item() > 0.5:
            assert f.argmax().item() == t.argmax().item(), q
