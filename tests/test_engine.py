"""The engine seam: plain mlx-lm and the CPU kernels behind one interface, same greedy tokens."""

import sys

import mlx.core as mx
import pytest

from targ_mlx import prompts
from targ_mlx.runtime import batch
from targ_mlx.runtime.backbone import load_backbone
from targ_mlx.runtime.draft import continue_greedy, draft
from targ_mlx.runtime.engine import MlxLMEngine

QUESTIONS = ["who wrote the origin of species", "what is the capital of canada", "who painted the mona lisa"]


@pytest.fixture(scope="module")
def mlx_backbone():
    """The same GGUF on mlx-lm's own layers: the default engine (Metal, CUDA). Float32 here: on a
    CPU MLX's quantized matmul took 2.5 minutes for these drafts, and the engine's code is the same
    whatever its layers hold (their quantized form: the last test)."""
    return load_backbone("smollm2-135m", dtype="float32", kernels=False)


def _agree_until_a_near_tie(a: list[int], b: list[int], gaps: list[float]) -> bool:
    """Equal tokens, or equal up to a step whose top-2 gap is under 0.5 logits, where float
    rounding (or the kernels' int8 activations on AVX512-VNNI and AVX2 CPUs) may flip a near-tie."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i < len(gaps) and gaps[i] < 0.5
    return len(a) == len(b)


def test_the_default_engine_is_mlx_lm(mlx_backbone):
    assert isinstance(mlx_backbone.engine, MlxLMEngine) and mlx_backbone.info["kernels"] == "mlx"


@pytest.mark.skipif(sys.platform == "darwin", reason="the CPU kernels are for CPU-only MLX (Linux)")
def test_both_engines_give_the_same_greedy_tokens(backbone, mlx_backbone):
    assert backbone.engine.name == "targ_mlx.runtime.native"
    same = 0
    for q in QUESTIONS:
        ids = backbone.tokenizer.chat_ids(prompts.messages(q, None, "short"))
        # plain draft + continuation, and the variance draft (rows shared by the engine)
        runs = {}
        for bb in (backbone, mlx_backbone):
            d, v = draft(bb, ids, 8), draft(bb, ids, 8, n_samples=3, seed=1)
            assert v.tokens == d.tokens  # within one engine the shared rows change nothing
            runs[bb.engine.name] = (d.tokens + continue_greedy(bb, d, 8)[0], d.gaps)
        (a, _), (b, gaps) = runs["targ_mlx.runtime.native"], runs["mlx"]
        assert _agree_until_a_near_tie(a, b, gaps), (q, a, b)
        same += a == b
        # the batched path (left-padded prefill, shared rows) gives the batch-1 greedy tokens
        for bb in (backbone, mlx_backbone):
            g, _ = batch.draft_batch(bb, [ids], k=8, n_samples=2, max_greedy=8, seed=3)
            assert g.tokens[0][: len(runs[bb.engine.name][0][:8])] == runs[bb.engine.name][0][:8]
    # With int8 activations two of these three drafts meet a near-tie (gaps 0.01 and 0.08 logits
    # on AVX2) and flip there, as llama.cpp's would; at least one agrees token for token.
    assert same >= 1


def test_engines_agree_on_the_next_token_distribution(backbone, mlx_backbone):
    """The kernels' prefill against mlx-lm's layers, the prompt's attention in float32 on both (on
    AMX the kernels run a prompt's attention in bfloat16: test_attn_tiles.py bounds that apart)."""
    ids = backbone.tokenizer.chat_ids(prompts.messages(QUESTIONS[0], None, "short"))
    lm = backbone.engine.lm
    a = lm.head(lm.hidden(mx.array([ids], dtype=mx.int32), backbone.make_cache(), last=True))[:, -1, :].astype(mx.float32)
    b = mlx_backbone.prefill(ids, mlx_backbone.make_cache())
    assert a.shape == b.shape and a.dtype == b.dtype == mx.float32
    assert mx.abs(mx.softmax(a, -1) - mx.softmax(b, -1)).max().item() < 1e-2


def test_the_quantized_layers_hold_the_files_bits_and_its_weights(mlx_backbone):
    """dtype="quantized" (what a GPU runs): each tensor keeps its own block size (SmolLM2's Q4_1
    file keeps its embedding in Q8_0), and the layers compute what the exact float32 weights do
    (to 1e-2 of logits near 10: the 4-bit layers' scales are rounded, 0.0098 measured)."""
    q = load_backbone("smollm2-135m", dtype="quantized", kernels=False)
    inner = q.model.model
    assert (inner.embed_tokens.bits, inner.layers[0].mlp.down_proj.bits) == (8, 4)
    assert q.dtype == "q4+q8"  # what the status line says, not the first tensor's bits
    ids = q.tokenizer.encode("Paris is")  # short: MLX's CPU quantized matmul is slow
    a, b = q.prefill(ids, q.make_cache()), mlx_backbone.prefill(ids, mlx_backbone.make_cache())
    assert mx.abs(a - b).max().item() < 0.05 and a.argmax().item() == b.argmax().item()
