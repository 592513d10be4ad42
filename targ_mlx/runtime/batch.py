"""Batched decoding of several questions at once: left-padded prefill and greedy/sampled decode.

B prompts of different lengths share one `BatchKVCache` per layer (mlx-lm's left-padded cache,
the one its `BatchGenerator` uses), so a decode step is one GEMM over B rows instead of B GEMVs.
Rows can be greedy or sampled; greedy rows also report the per-step entropy, top-1/top-2 gap and
the chosen token's log-probability, computed in MLX. Nothing here knows about gates or prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from targ_mlx.runtime.backbone import Backbone
from targ_mlx.runtime.sampling import uniforms

PAD_ID = 0  # any valid id: padded positions are masked out of attention
MIN_SHARED_PREFIX = 16  # a common prompt head at least this long is run once for the whole batch


class PrefixBatchKVCache(BatchKVCache):
    """A batch cache whose rows share their first `prefix_len` positions (a prompt header run
    once); each row's padding sits between that prefix and the row's own tokens, which the CPU
    kernels' attention hides like left padding."""

    def __init__(self, left_padding: list[int], prefix_len: int):
        super().__init__(left_padding)
        self.prefix_len = prefix_len


@dataclass
class BatchDecode:
    """Per row: the tokens up to and including EOS (or the step cap), and greedy-row statistics."""

    tokens: list[list[int]]
    entropies: list[list[float]]  # empty lists for sampled rows
    gaps: list[list[float]]
    logprobs: list[list[float]]  # log p of the chosen (greedy) token
    steps: int = 0  # decode steps run (a step feeds every row one token, but for the last step)


def make_batch_cache(bb: Backbone, left_padding: Sequence[int]) -> list[BatchKVCache]:
    return [BatchKVCache(list(left_padding)) for _ in bb.make_cache()]


def common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest common head of `seqs`, leaving every sequence one token of its own."""
    n = min(len(s) for s in seqs) - 1
    first = seqs[0]
    for i in range(max(n, 0)):
        if any(s[i] != first[i] for s in seqs[1:]):
            return i
    return max(n, 0)


def prefill_batch(bb: Backbone, seqs: Sequence[Sequence[int]]) -> tuple[mx.array, list[BatchKVCache]]:
    """Left-pad `seqs` to one length and run them together; returns last-position logits (B, V).

    On the CPU kernels a common head of the prompts (the system prompt and few-shot turns) is
    taken from `Backbone.prefix_kv` instead of being run once per row. Chunked like
    `Backbone.prefill` so attention scratch stays bounded; only the last position goes through
    the LM head.
    """
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("prefill_batch needs one or more non-empty token sequences")
    shared = common_prefix(seqs) if bb.engine.shares_prefix else 0
    if shared < MIN_SHARED_PREFIX:
        shared = 0
    rest = [list(s[shared:]) for s in seqs]
    width = max(len(s) for s in rest)
    pads = [width - len(s) for s in rest]
    tokens = mx.array([[PAD_ID] * p + s for p, s in zip(pads, rest)], dtype=mx.int32)
    if shared:
        cache = [PrefixBatchKVCache(pads, shared) for _ in bb.make_cache()]
        n = len(seqs)
        for c, (k, v) in zip(cache, bb.prefix_kv(tuple(seqs[0][:shared]))):
            c.keys, c.values = mx.repeat(k, n, axis=0), mx.repeat(v, n, axis=0)
            c._idx = shared
            c.offset = c.offset + shared
    else:
        cache = make_batch_cache(bb, pads)
    logits = bb.prefill_tokens(tokens, cache)
    mx.eval(logits)
    return logits, cache


def decode_batch(bb: Backbone, cache: list[BatchKVCache], logits: mx.array, max_new: Sequence[int] | int,
                 greedy: Sequence[bool] | None = None, temperature: float = 0.7, seed: int = 0,
                 drop_finished: bool = True) -> BatchDecode:
    """Decode every row until EOS or its own step cap; stops when all rows are done.

    Args:
        cache, logits: from `prefill_batch` (rows shared by `Engine.share_rows`); consumed.
        max_new: a step cap per row (or one for all).
        greedy: per row, True for argmax, False for sampling at `temperature` (default all greedy).
        seed: RNG seed for the sampled rows.
        drop_finished: let finished rows leave the batch (below); False runs every row to the end.

    On an engine whose rows are independent (the CPU kernels), finished rows leave the batch
    (`Engine.keep_rows`) once a quarter of it is done: short answers are the common case (the
    1.5B's drafts average 5 tokens of their 40-token cap), and a step costs by the rows it runs.
    Each row's tokens, statistics and draws are then the same as in a batch that kept every row
    (the uniforms are drawn for all rows and then picked). mlx-lm's layers keep every row: their
    matmuls round differently as the row count changes (1e-5 in the entropies on MLX's CPU ops).
    """
    rows = logits.shape[0]
    caps = [int(max_new)] * rows if isinstance(max_new, int) else [int(m) for m in max_new]
    greedy = [True] * rows if greedy is None else list(greedy)
    if len(caps) != rows or len(greedy) != rows:
        raise ValueError(f"max_new and greedy need one entry per row ({rows})")
    eos = mx.array(sorted(bb.tokenizer.eos_ids), dtype=mx.int32)
    any_sampled = not all(greedy)
    drop = drop_finished and bb.engine.independent_rows
    key = mx.random.key(seed)
    out = BatchDecode([[] for _ in range(rows)], [[] for _ in range(rows)], [[] for _ in range(rows)],
                      [[] for _ in range(rows)])
    live = list(range(rows))  # the batch's rows, as indices of the caller's rows

    def state(live):
        sel = mx.array(live)
        inv = mx.array([0.0 if greedy[r] else 1.0 / temperature for r in live], dtype=mx.float32)
        return sel, inv, mx.array([caps[r] for r in live]), mx.zeros((len(live),), dtype=mx.float32)

    sel, inv_temp, cap, u = state(live)
    done = cap <= 0
    steps: list[tuple[mx.array, ...]] = []  # (token or -1, entropy, gap, log p) per step since `live` changed

    def collect(live, steps):
        if not steps:
            return
        grids = [mx.stack(col, axis=1).tolist() for col in zip(*steps)]
        for i, r in enumerate(live):
            for tok, ent, gap, lp in zip(*(g[i] for g in grids)):
                if tok < 0:
                    break
                out.tokens[r].append(tok)
                if greedy[r]:
                    out.entropies[r].append(ent)
                    out.gaps[r].append(gap)
                    out.logprobs[r].append(lp)

    lg = logits
    for t in range(max(caps)):
        if any_sampled:
            key, u = uniforms(key, rows)  # for every row, as if none had left: the same draws
            u = u[sel]
        y, ent, gap, lp = bb.select(lg, inv_temp, u)
        y = mx.where(done, eos[0], y)
        steps.append((mx.where(done, -1, y), ent, gap, lp))  # -1 marks steps after a row finished
        done = done | mx.any(y[:, None] == eos[None, :], axis=-1) | (cap <= t + 1)
        if t + 1 < max(caps):
            lg = bb.step(y, cache)
        mx.async_eval(lg, done, *steps[-1])
        if t % 4 == 3:
            finished = done.tolist()
            if all(finished):
                break
            if drop and 4 * sum(finished) >= len(live):
                keep = [i for i, f in enumerate(finished) if not f]
                collect(live, steps)
                steps = []
                live = [live[i] for i in keep]
                idx = mx.array(keep)
                cache = bb.engine.keep_rows(cache, keep)
                lg, done = lg[idx], done[idx]
                sel, inv_temp, cap, u = state(live)
        out.steps = t + 1
    collect(live, steps)
    return out


def greedy_batch(bb: Backbone, seqs: Sequence[Sequence[int]], max_new: int) -> BatchDecode:
    """Greedy generation for several prompts at once (the batched `draft.generate`)."""
    logits, cache = prefill_batch(bb, seqs)
    return decode_batch(bb, cache, logits, max_new)


def last_logprobs(bb: Backbone, seqs: Sequence[Sequence[int]]) -> mx.array:
    """Next-token log-probabilities after each prompt (B, V): for yes/no probes."""
    logits, _ = prefill_batch(bb, seqs)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def forced_logprobs(bb: Backbone, prompts: Sequence[Sequence[int]], follow: Sequence[Sequence[int]]) -> list[list[float]]:
    """log p of each row's `follow` tokens after its prompt, teacher-forced (query likelihood:
    the LLM reranker "upr"). The prompts run as one batch; then each following token is fed as a
    decode step for every row at once, a row whose tokens are done fed padding it never reads."""
    if len(prompts) != len(follow) or any(not f for f in follow):
        raise ValueError("forced_logprobs needs one non-empty token list to score per prompt")
    logits, cache = prefill_batch(bb, prompts)
    width = max(len(f) for f in follow)
    grid = mx.array([list(f) + [PAD_ID] * (width - len(f)) for f in follow], dtype=mx.int32)
    picked = []
    for t in range(width):
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        picked.append(mx.take_along_axis(lp, grid[:, t: t + 1], axis=-1)[:, 0])
        if t + 1 < width:
            logits = bb.step(grid[:, t], cache)
        mx.async_eval(picked[-1], logits)
    rows = mx.stack(picked, axis=1).tolist()
    return [row[: len(f)] for row, f in zip(rows, follow)]


def yes_no_ids(tokenizer) -> tuple[list[int], list[int]]:
    """First token ids of the spellings of yes and no (with and without a leading space)."""
    def first(words):
        return sorted({tokenizer.encode(w)[0] for w in words if tokenizer.encode(w)})

    return first(["Yes", "yes", " Yes", " yes", "YES"]), first(["No", "no", " No", " no", "NO"])


def p_yes(logprobs: mx.array, yes: list[int], no: list[int]) -> list[float]:
    """P(yes) / (P(yes) + P(no)) per row of next-token log-probabilities (B, V)."""
    py = mx.sum(mx.exp(logprobs[:, mx.array(yes)]), axis=-1)
    pn = mx.sum(mx.exp(logprobs[:, mx.array(no)]), axis=-1)
    return (py / mx.maximum(py + pn, 1e-30)).tolist()


def draft_batch(bb: Backbone, seqs: Sequence[Sequence[int]], k: int, n_samples: int, max_greedy: int,
                temperature: float = 0.7, seed: int = 0) -> tuple[BatchDecode, list[list[list[int]]]]:
    """One prefill for B prompts, then per prompt one greedy row (up to `max_greedy` tokens: the
    draft and the Never answer in one) and `n_samples` sampled rows of `k` tokens, decoded together.

    Returns the greedy rows (with statistics) and, per prompt, its N sampled prefixes.
    """
    logits, cache = prefill_batch(bb, seqs)
    n = n_samples + 1
    if n_samples:  # the n rows of a prompt continue its prefill (on the kernels, reading its keys in place)
        rows = [i // n for i in range(len(seqs) * n)]
        logits, cache = logits[mx.array(rows)], bb.engine.share_rows(cache, rows)
    greedy = [j % n == 0 for j in range(len(seqs) * n)]
    caps = [max_greedy if g else k for g in greedy]
    dec = decode_batch(bb, cache, logits, caps, greedy, temperature, seed)
    g = BatchDecode([], [], [], [])
    samples: list[list[list[int]]] = []
    for i in range(len(seqs)):
        r = i * n
        g.tokens.append(dec.tokens[r])
        g.entropies.append(dec.entropies[r])
        g.gaps.append(dec.gaps[r])
        g.logprobs.append(dec.logprobs[r])
        samples.append([dec.tokens[r + j] for j in range(1, n)])
    return g, samples


def cache_rows(cache: list[Any]) -> int:
    return 0 if not cache or cache[0].keys is None else int(cache[0].keys.shape[0])
