"""Batched multi-question decoding against the batch-1 draft, with the real SmolLM2."""

import json

import mlx.core as mx
import pytest

from targ_mlx import prompts
from targ_mlx.runtime import batch
from targ_mlx.runtime.draft import draft, generate
from tests.conftest import SHARED_DATA

pytestmark = pytest.mark.slow


def _questions(n):
    with open(SHARED_DATA / "qa" / "nq_open_dev.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["question"] for _, line in zip(range(n), f)]


def test_batched_greedy_matches_batch1_draft(backbone):
    """Left-padded prompts of different lengths give the batch-1 greedy tokens and statistics."""
    ids = [backbone.tokenizer.chat_ids(prompts.messages(q, None, "short")) for q in _questions(3)]
    assert len({len(i) for i in ids}) > 1  # really different lengths, so padding is exercised
    g, samples = batch.draft_batch(backbone, ids, k=6, n_samples=2, max_greedy=6, seed=1)
    agree = 0
    for i, p in enumerate(ids):
        d = draft(backbone, p, 6)
        agree += d.tokens == g.tokens[i]
        n = min(len(d.gaps), len(g.gaps[i]))
        assert g.entropies[i][:n] == pytest.approx(d.entropies[:n], abs=1e-3)
        assert g.gaps[i][:n] == pytest.approx(d.gaps[:n], abs=1e-3)
        assert len(samples[i]) == 2 and all(1 <= len(s) <= 6 for s in samples[i])
    assert agree == len(ids)  # tiny float differences could flip a near-tie; none here


def test_greedy_batch_matches_generate_and_stops_at_eos(backbone):
    ids = [backbone.tokenizer.chat_ids(prompts.messages(q, None, "short")) for q in _questions(2)]
    out = batch.greedy_batch(backbone, ids, 5)
    for p, toks in zip(ids, out.tokens):
        ref, _, _ = generate(backbone, p, 5)
        assert toks == ref
        eos = [t for t in toks if t in backbone.tokenizer.eos_ids]
        assert not eos or toks[-1] in backbone.tokenizer.eos_ids  # nothing after EOS


@pytest.mark.parametrize("shared", [False, True], ids=["own-rows", "rows-over-shared-prompts"])
def test_rows_leaving_the_batch_change_no_row(backbone, shared):
    """Rows that finish early leave the batch; every row's tokens, statistics and sampled draws
    are the ones it gets when all rows run to the end (rows with their own cache, and rows that
    read their prompt's keys in place, as the variance draft's do)."""
    qs = _questions(6 if not shared else 3)
    ids = [backbone.tokenizer.chat_ids(prompts.messages(q, None, "short")) for q in qs]
    ids += [backbone.tokenizer.chat_ids(prompts.messages("Tell me a long story about the sea.", None, "paper"))]
    prompt_of = [i // 2 for i in range(2 * len(ids))] if shared else list(range(len(ids)))
    greedy = [True, False] * (len(prompt_of) // 2) + [True] * (len(prompt_of) % 2)

    def run(drop):
        logits, cache = batch.prefill_batch(backbone, ids)
        if shared:  # two rows (greedy, sampled) continue each prompt, as draft_batch's do
            logits, cache = logits[mx.array(prompt_of)], backbone.engine.share_rows(cache, prompt_of)
        return batch.decode_batch(backbone, cache, logits, 24, greedy, seed=5, drop_finished=drop)

    kept, dropped = run(False), run(True)
    lengths = [len(t) for t in kept.tokens]
    # a quarter of the rows had finished by the second check (step 8), so they left; others went on
    assert 4 * sum(n <= 8 for n in lengths) >= len(lengths) and max(lengths) > 12
    assert dropped.tokens == kept.tokens
    assert dropped.entropies == kept.entropies and dropped.gaps == kept.gaps
    assert dropped.logprobs == kept.logprobs


def test_yes_no_logprobs_are_normalised(backbone):
    lp = batch.last_logprobs(backbone, [[1, 2, 3], [4, 5]])
    assert lp.shape[0] == 2
    assert mx.allclose(mx.logsumexp(lp, axis=-1), mx.zeros(2), atol=1e-4).item()


def test_prefill_batch_rejects_empty(backbone):
    with pytest.raises(ValueError, match="non-empty"):
        batch.prefill_batch(backbone, [[1, 2], []])


def test_forced_logprobs_are_the_decoders_own_for_its_tokens(backbone):
    """Teacher-forcing the greedy tokens back gives the log p the decoder gave each as it chose
    it, row by row in a batch of prompts of different lengths and continuations of different lengths."""
    ids = [backbone.tokenizer.chat_ids(prompts.messages(q, None, "short")) for q in _questions(3)]
    out = batch.greedy_batch(backbone, ids, 6)
    follow = [t[: 6 - i] for i, t in enumerate(out.tokens)]  # rows of different lengths
    got = batch.forced_logprobs(backbone, ids, follow)
    for row, ref, f in zip(got, out.logprobs, follow):
        assert len(row) == len(f)
        assert row == pytest.approx(ref[: len(f)], abs=2e-3)
    assert all(x <= 0 for row in got for x in row)
