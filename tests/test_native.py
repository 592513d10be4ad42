"""The CPU kernels (targ_mlx.runtime.native) against MLX's own ops and the mlx-lm model.

Each kernel is compared with the MLX computation it replaces; the whole decoder is compared
with the mlx-lm forward on the same (Q4_1) weights, whose only difference is that the kernels
quantize activations to int8 per group of 32 (as llama.cpp does). Rows must not depend on the
batch they are in: that is checked bit for bit.
"""

import math
import sys

import mlx.core as mx
import numpy as np
import pytest

from targ_mlx import prompts
from targ_mlx.runtime import batch
from targ_mlx.runtime.backbone import load_backbone
from targ_mlx.runtime.draft import continue_greedy, draft
from targ_mlx.runtime.sampling import step_entropy, step_gap
from targ_mlx.runtime.native import pack

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="the CPU kernels are for CPU-only MLX (Linux)")


def rel_err(a, b):
    return (mx.abs(a - b).max() / (mx.abs(b).max() + 1e-9)).item()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("K", [576, 608, 1536])  # 608: an odd number of 32-groups
def test_qlinear_matches_dequantized_matmul(N, bits, K):
    mx.random.seed(K + bits)
    W = mx.random.normal((80, K))
    wq, s, b = mx.quantize(W, group_size=64 if K % 64 == 0 else 32, bits=bits)
    gs = 64 if K % 64 == 0 else 32
    P = pack.from_quantized(wq, s, b, bits, gs)
    Wd = mx.dequantize(wq, s, b, group_size=gs, bits=bits)
    assert mx.array_equal(pack.dequantize(P), Wd)  # repacking is exact
    bias, res = mx.random.normal((80,)), mx.random.normal((7, 80))
    for M in (1, 4, 7, 13, 40):  # 13, 40: the VNNI build's 16-row blocks, whole and with a rest
        x = mx.random.normal((M, K))
        # int8 activations per group of 32: ~0.5% of the output's range on random data
        assert rel_err(N.qlinear(x, *P.args()), x @ Wd.T) < 0.02
    x = mx.random.normal((7, K))
    y = N.qlinear(x, *P.args(), bias=bias, residual=res)
    assert rel_err(y, x @ Wd.T + bias + res) < 0.02


def test_qlinear_row_results_do_not_depend_on_the_batch(N):
    W = mx.random.normal((304, 576))
    P = pack.from_quantized(*mx.quantize(W, group_size=32, bits=4), 4, 32)
    x = mx.random.normal((37, 576))  # 2 blocks of 16 rows and a rest of 5 on VNNI; 9 blocks of 4 and 1 on AVX2
    full = N.qlinear(x, *P.args())
    for i in range(37):
        assert mx.array_equal(N.qlinear(x[i : i + 1], *P.args())[0], full[i])


def test_float_weights_pack_to_8_bits(N):
    W = mx.random.normal((64, 96))
    P = pack.from_float(W)
    assert P.bits == 8 and rel_err(pack.dequantize(P), W) < 0.005


def test_norm_rope_swiglu_embed(N):
    x, r, w = mx.random.normal((3, 576)), mx.random.normal((3, 576)), mx.random.normal((576,))
    assert rel_err(N.rms_norm(x, w, 1e-5), mx.fast.rms_norm(x, w, 1e-5)) < 1e-5
    h, y = N.add_rms_norm(x, r, w, 1e-5)
    assert mx.array_equal(h, x + r) and rel_err(y, mx.fast.rms_norm(x + r, w, 1e-5)) < 1e-5
    B, L, Hq, Hkv, D = 2, 5, 9, 3, 64
    qkv = mx.random.normal((B, L, (Hq + 2 * Hkv) * D))
    inv = mx.exp(mx.arange(0, -D // 2, -1, dtype=mx.float32) * (math.log(1e5) / (D // 2)))
    pos = mx.array([7, 3], dtype=mx.int32)
    cos, sin = N.rope_table(pos, inv, B, L, 1.0)
    for trad in (True, False):
        q, k, v = N.rope_split(qkv, cos, sin, Hq, Hkv, D, trad)
        qr = qkv[..., : Hq * D].reshape(B, L, Hq, D).transpose(0, 2, 1, 3)
        ref = mx.concatenate([mx.fast.rope(qr[i : i + 1], D, traditional=trad, base=1e5, scale=1.0,
                                           offset=int(pos[i].item())) for i in range(B)])
        assert mx.abs(q - ref).max().item() < 1e-4
        assert mx.array_equal(v, qkv[..., (Hq + Hkv) * D :].reshape(B, L, Hkv, D).transpose(0, 2, 1, 3))
    g, u = mx.random.normal((3, 40)), mx.random.normal((3, 40))
    assert rel_err(N.swiglu(mx.concatenate([g, u], -1)), g * mx.sigmoid(g) * u) < 1e-5
    E = mx.random.normal((112, 576))
    for bits, gs in ((8, 32), (4, 64)):
        wq, s, b = mx.quantize(E, group_size=gs, bits=bits)
        ids = mx.array([[3, 111, 0]])
        ref = mx.dequantize(wq, s, b, group_size=gs, bits=bits)[ids]
        assert mx.abs(N.embed(ids, *pack.from_quantized(wq, s, b, bits, gs).args()) - ref).max().item() < 1e-5


def attention_ref(q, k, v, scale, lp):
    """MLX's attention of the L queries at the last L of S positions over left-padded keys."""
    (B, Hq, L, D), (Hkv, S) = q.shape, k.shape[1:3]
    kk, vv = mx.repeat(k, Hq // Hkv, axis=1), mx.repeat(v, Hq // Hkv, axis=1)
    scores = (q @ kk.transpose(0, 1, 3, 2)) * scale
    j, i = mx.arange(S)[None, None, None, :], mx.arange(L)[None, None, :, None]
    visible = (j >= lp[:, None, None, None]) & (j <= S - L + i)
    return (mx.softmax(mx.where(visible, scores, -1e30), axis=-1) @ vv).transpose(0, 2, 1, 3).reshape(B, L, Hq * D)


@pytest.mark.parametrize("L", [1, 3, 20])
def test_attention_with_left_padding_and_a_cache_view(N, L):
    B, Hq, Hkv, D, S = 2, 9, 3, 64, 40
    q = mx.random.normal((B, Hq, L, D))
    k, v = mx.random.normal((B, Hkv, S, D)), mx.random.normal((B, Hkv, S, D))
    lp = mx.array([0, 6], dtype=mx.int32)
    ref = attention_ref(q, k, v, 0.125, lp)
    # keys and values as a cache hands them over: a slice of a longer buffer
    pad = mx.zeros((B, Hkv, 24, D))
    kbuf, vbuf = mx.concatenate([k, pad], axis=2), mx.concatenate([v, pad], axis=2)
    out = N.attention(q, kbuf[:, :, :S, :], vbuf[:, :, :S, :], 0.125, lp)
    assert mx.abs(out - ref).max().item() < 1e-5
    # each query alone (a decode step at its position: its kv head's 3 query heads as one block)
    # gets the bits it gets among the 20 of a prefill (4 queries' weighted sums side by side)
    for t in range(L):
        at = S - L + t
        one = N.attention(q[:, :, t : t + 1], k[:, :, : at + 1], v[:, :, : at + 1], 0.125, lp)
        assert mx.array_equal(one[:, 0], out[:, t]), t



def test_attention_prefill_with_padding_inside_a_query_block(N):
    """A left-padded prompt's first queries are padding (zero out) and sit in the same block of 16
    queries as real ones; keys cross the 32-key blocks the queries share (D = 128, as the 1.5B)."""
    B, Hq, Hkv, D, S = 2, 4, 2, 128, 45
    q = mx.random.normal((B, Hq, S, D))
    k, v = mx.random.normal((B, Hkv, S, D)), mx.random.normal((B, Hkv, S, D))
    lp = mx.array([0, 7], dtype=mx.int32)
    real = (mx.arange(S)[None, :] >= lp[:, None])[..., None]  # padding positions attend to nothing
    ref = mx.where(real, attention_ref(q, k, v, 0.09, lp), 0.0)
    out = N.attention(q, k, v, 0.09, lp)
    assert mx.abs(out - ref).max().item() < 1e-5
    assert mx.array_equal(out[1, :7], mx.zeros((7, Hq * D)))
    # each query alone (a decode step at its position) gets the same bits as in its block
    for t in (8, 20, 44):
        one = N.attention(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], 0.09, lp)
        assert mx.array_equal(one[:, 0], out[:, t])


@pytest.mark.parametrize("hole", [0, 5])
def test_attention_over_shared_prompt_keys_is_bitwise_the_copied_cache(N, hole):
    """Rows reading their prompt's keys in place (shared_keys + shared_rows) get exactly what
    rows holding a copy of those keys in their own cache get."""
    R, B, Hq, Hkv, D, P, T = 2, 5, 9, 3, 64, 30, 4
    pk, pv = mx.random.normal((R, Hkv, P, D)), mx.random.normal((R, Hkv, P, D))
    own_k, own_v = mx.random.normal((B, Hkv, T, D)), mx.random.normal((B, Hkv, T, D))
    q = mx.random.normal((B, Hq, 1, D))
    rows = mx.array([0, 0, 1, 1, 1], dtype=mx.int32)
    ppad = mx.array([3, 0], dtype=mx.int32)  # prompt 0 padded after its first `hole` positions
    shared = N.attention(q, own_k, own_v, 0.125, shared_keys=pk, shared_values=pv, shared_rows=rows,
                         shared_pad=ppad, shared_hole=hole)
    full_k = mx.concatenate([pk[rows], own_k], axis=2)
    full_v = mx.concatenate([pv[rows], own_v], axis=2)
    copied = N.attention(q, full_k, full_v, 0.125, ppad[rows], hole)
    assert mx.array_equal(shared, copied)

def test_select_greedy_statistics_and_sampling(N):
    lg = mx.random.normal((4, 49152)) * 3
    tok, ent, gap, lp = N.select(lg, mx.zeros((4,)), mx.zeros((4,)))
    assert mx.array_equal(tok, mx.argmax(lg, -1).astype(mx.int32))
    assert mx.abs(ent - step_entropy(lg)).max().item() < 1e-3
    assert mx.abs(gap - step_gap(lg)).max().item() < 1e-5
    assert mx.abs(lp - (lg.max(-1) - mx.logsumexp(lg, -1))).max().item() < 1e-4
    tie = mx.array([[1.0, 3.0, 3.0, 0.0]])
    t, _, g, _ = N.select(tie, mx.zeros((1,)), mx.zeros((1,)))
    assert t.item() == 1 and g.item() == 0.0  # first maximum, as mx.argmax; tied top-2 gap 0
    n = 20000
    us = mx.array(np.random.RandomState(0).rand(n).astype(np.float32))
    small = mx.repeat(mx.array([[0.0, 1.0, 2.0, 0.5]]), n, 0)
    freq = np.bincount(np.array(N.select(small, mx.full((n,), 1 / 0.7), us)[0]), minlength=4) / n
    p = np.exp(np.array([0, 1, 2, 0.5]) / 0.7)
    assert np.abs(freq - p / p.sum()).max() < 0.015


def test_select_matches_the_mlx_version(N, backbone):
    from targ_mlx.runtime import sampling

    lg = mx.random.normal((3, 1000)) * 2
    it, u = mx.array([0.0, 1 / 0.7, 1 / 0.7]), mx.array([0.3, 0.31, 0.9])
    a, b = N.select(lg, it, u), sampling.select(lg, it, u)
    assert mx.array_equal(a[0], b[0])
    for x, y in zip(a[1:], b[1:]):
        assert mx.abs(x - y).max().item() < 1e-3


def test_bad_inputs_are_one_line_errors(N):
    P = pack.from_float(mx.random.normal((16, 64)))
    with pytest.raises(ValueError, match="last dimension is 32, the weights expect 64"):
        N.qlinear(mx.zeros((1, 32)), *P.args())
    with pytest.raises(ValueError, match="bits must be 4, 6 or 8"):
        N.qlinear(mx.zeros((1, 64)), P.q, P.scales, P.biases, 3)
    with pytest.raises(ValueError, match="K divisible by 32 and N by 16"):
        pack.from_float(mx.zeros((16, 40)))


QUESTIONS = ["who wrote the origin of species", "what is the tallest mountain in africa",
             "when did the berlin wall fall", "who painted the mona lisa", "what is the capital of canada"]


@pytest.fixture(scope="module")
def mlx_backbone():
    """The same GGUF on mlx-lm's own (quantized) layers, without the kernels."""
    return load_backbone("smollm2-135m", dtype="quantized", kernels=False)


@pytest.fixture(scope="module")
def mlx_float():
    """The same weights, dequantized exactly, on mlx-lm's float32 layers: the reference the
    kernels are compared with (MLX's CPU quantized matmul computes the same numbers but took a
    minute for these five prefills; Q4_1 converts to MLX's 4-bit layers exactly, so both
    references hold the same weights)."""
    return load_backbone("smollm2-135m", dtype="float32", kernels=False)


def test_backbone_runs_on_the_kernels(backbone):
    assert backbone.engine.name == "targ_mlx.runtime.native", backbone.info
    assert backbone.info["kernels"].startswith("targ_mlx.runtime.native on")


def test_every_array_is_evaluated_on_the_loading_thread(N, mlx_backbone):
    """A lazy array first evaluated from another thread (the chat app's answer worker) raises
    MLX's 'There is no Stream(cpu, 0) in current thread'. The fused qkv/gate_up parts sit in
    lists (layers[i].qkv[j].scales): build must reach them too."""
    import threading

    from targ_mlx.runtime.native.model import NativeLM

    lm = NativeLM.build(mlx_backbone.model, N)
    errors = []

    def read_all():
        for name, a in lm.state().items():
            try:
                np.array(a)
            except RuntimeError as e:
                errors.append(f"{name}: {e}")

    t = threading.Thread(target=read_all)
    t.start()
    t.join()
    assert errors == []


def test_model_matches_mlx_lm_on_the_same_weights(backbone, mlx_float):
    """Same Q4_1 weights; on CPUs with AVX512-VNNI the kernels quantize activations to int8 per
    group of 32 (as llama.cpp does), which moves the next-token distribution by a KL of
    ~0.002-0.008 nats and its entropy by up to ~0.06 nats here (measured), and can flip near-ties
    later on. Elsewhere they run in float32 and the differences are ~100x smaller. The prompt's
    attention runs in float32 here as in the reference (on AMX tiles it is bfloat16's:
    test_attn_tiles.py bounds what that moves)."""
    lm = backbone.engine.lm
    for q in QUESTIONS:
        ids = backbone.tokenizer.chat_ids(prompts.messages(q, None, "short"))
        a = lm.head(lm.hidden(mx.array([ids], dtype=mx.int32), backbone.make_cache(), last=True))[:, -1, :]
        a, b = a.astype(mx.float32), mlx_float.prefill(ids, mlx_float.make_cache())
        pa, pb = mx.softmax(a, -1), mx.softmax(b, -1)
        assert (pb * (mx.log(pb + 1e-30) - mx.log(pa + 1e-30))).sum().item() < 0.02
        if step_gap(b).item() > 0.5:  # a near-tie may flip ("when did the berlin wall fall": 0.28)
            assert a.argmax().item() == b.argmax().item()
        assert abs(step_entropy(a).item() - step_entropy(b).item()) < 0.12
        assert abs(step_gap(a).item() - step_gap(b).item()) < 0.3


def test_batched_rows_are_bitwise_the_batch1_rows(backbone):
    """Left-padded batches (prefill and decode) give exactly the batch-1 logits and statistics."""
    ids = [backbone.tokenizer.chat_ids(prompts.messages(q, None, "short")) for q in QUESTIONS[:3]]
    logits, _ = batch.prefill_batch(backbone, ids)
    g, _ = batch.draft_batch(backbone, ids, k=8, n_samples=2, max_greedy=8, seed=3)
    for i, p in enumerate(ids):
        assert mx.array_equal(logits[i], backbone.prefill(p, backbone.make_cache())[0])
        d = draft(backbone, p, 8)
        assert g.tokens[i][: len(d.tokens)] == d.tokens
        assert g.entropies[i][: len(d.entropies)] == d.entropies and g.gaps[i][: len(d.gaps)] == d.gaps


def test_last_position_alone_is_bitwise_the_whole_forward(backbone):
    """`last_logits` runs the last layer's attention and MLP for the last position only; its
    logits and the keys it leaves in the cache are bit for bit those of the whole forward."""
    lm = backbone.engine.lm
    ids = [backbone.tokenizer.chat_ids(prompts.messages(q, None, "short")) for q in QUESTIONS[:3]]
    width = max(len(s) for s in ids)
    pads = [width - len(s) for s in ids]
    tokens = mx.array([[0] * p + s for p, s in zip(pads, ids)], dtype=mx.int32)
    for rows, cache_of in ((tokens[:1, pads[0]:], backbone.make_cache),
                           (tokens, lambda: batch.make_batch_cache(backbone, pads))):
        whole, alone = cache_of(), cache_of()
        want = lm.head(lm.hidden(rows, whole, prompt=True)[:, -1:, :])[:, -1, :].astype(mx.float32)
        got = backbone.engine.last_logits(rows, alone)
        assert got.shape == want.shape and mx.array_equal(got, want)
        assert all(mx.array_equal(a.keys, b.keys) and mx.array_equal(a.values, b.values) for a, b in zip(whole, alone))


def test_variance_draft_shares_the_prompt_and_keeps_the_greedy_row(backbone):
    """The variance draft's rows read the prompt's keys in place; its greedy row, and the answer
    continued from its cache, are bit for bit the plain draft's."""
    p = backbone.tokenizer.chat_ids(prompts.messages(QUESTIONS[1], None, "short"))
    plain, var = draft(backbone, p, 10), draft(backbone, p, 10, n_samples=5, seed=1)
    assert var.tokens == plain.tokens and var.entropies == plain.entropies and var.gaps == plain.gaps
    assert len(var.samples) == 5 and all(len(s) >= 1 for s in var.samples)
    assert [c.positions for c in var.cache] == [c.offset for c in plain.cache]
    assert continue_greedy(backbone, var, 8)[0] == continue_greedy(backbone, plain, 8)[0]


def test_the_split_into_tasks_changes_no_bit(tmp_path):
    """Kernels split their rows and columns into tasks the threads take from a shared counter;
    how many tasks (TARG_MLX_TASKS_PER_THREAD) must not change a result: a prefill's logits and
    four decode steps' are compared, bit for bit, across three splits in fresh processes."""
    import os
    import subprocess

    script = tmp_path / "split.py"
    script.write_text(
        "import hashlib, numpy as np, mlx.core as mx\n"
        "from targ_mlx.runtime.backbone import load_backbone\n"
        "bb = load_backbone('smollm2-135m')\n"
        "c = bb.make_cache()\n"
        "ids = [(i * 7919) % 40000 + 100 for i in range(300)]\n"
        "lg = bb.prefill(ids, c); out = [np.array(lg)]\n"
        "for _ in range(4):\n"
        "    lg = bb.step(mx.argmax(lg, axis=-1), c); out.append(np.array(lg))\n"
        "print(hashlib.sha256(b''.join(o.tobytes() for o in out)).hexdigest())\n")
    digests = set()
    for n in ("1", "3", "16"):
        env = {**os.environ, "TARG_MLX_TASKS_PER_THREAD": n, "TARG_MLX_THREADS": "2"}
        r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        digests.add(r.stdout.strip().splitlines()[-1])
    assert len(digests) == 1, digests
