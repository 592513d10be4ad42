"""Decoding: the gate's k-token prefix draft (greedy + N sampled rows in one batch) and
greedy generation that continues it.

The draft records, per greedy step, the entropy of softmax(logits) and the top-1/top-2 logit
gap, computed in MLX (only scalars leave the device). It keeps its KV cache so a skipped
answer continues from it: the draft tokens are the answer's first tokens.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import mlx.core as mx

from targ_mlx.runtime import lookup
from targ_mlx.runtime.backbone import Backbone
from targ_mlx.runtime.batch import decode_batch
from targ_mlx.defaults import DEFAULT_K, DEFAULT_TEMPERATURE



@dataclass
class Draft:
    prompt_ids: list[int]
    tokens: list[int]  # greedy draft tokens, at most k
    entropies: list[float]
    gaps: list[float]
    samples: list[list[int]]  # N sampled prefixes (empty unless requested)
    cache: list[Any] = field(repr=False)  # holds the prompt and all draft tokens but the last
    ended: bool  # the greedy draft produced EOS
    prefill_s: float
    decode_s: float
    # tokens its guesses may also be copied from (prompt lookup): the passages a search found
    # before the draft; what an answer continued from it copies from too
    context: tuple[int, ...] = ()

    @property
    def history(self) -> list[int]:
        """What an answer continued from it may copy its guesses from: the context, the prompt and
        the draft's own tokens, in that order."""
        return [*self.context, *self.prompt_ids, *self.tokens]


def copies(bb: Backbone) -> bool:
    """Whether greedy decoding on `bb` copies guesses from what it was given (prompt lookup): where
    the engine computes each row alone (a chunk's logits are the one-step ones) and it is not off."""
    return bb.engine.independent_rows and lookup.enabled()


def _greedy(bb: Backbone, cache: list[Any], logits: mx.array, max_new: int, stats: bool = False,
            cancel: threading.Event | None = None, history: Sequence[int] | None = None
            ) -> Iterator[tuple[int, mx.array | None, mx.array | None]]:
    """Greedy tokens from `logits` (1, V) onward, at most `max_new`, stopping after EOS.

    The next step is scheduled (async_eval) before the current token is read back, so Python
    overhead overlaps with compute, as in mlx-lm's generate_step. The last token yielded is
    never fed to the model: the caller's cache ends just before it. With `history` (the tokens
    the cache holds, after any other text worth copying from) and an engine whose rows are
    computed alone, guesses copied from the history are verified a few at a time
    (`_greedy_lookup`): the same tokens, fewer steps.
    """
    if max_new <= 0:
        return
    if history is not None and copies(bb):
        yield from _greedy_lookup(bb, cache, logits, max_new, stats, cancel, history)
        return
    eos = bb.tokenizer.eos_ids

    zero = mx.zeros((1,), dtype=mx.float32)

    def pick(lg):
        if stats:
            y, e, g, _ = bb.select(lg, zero, zero)
            out = (y, e, g)  # (1,) each: no slicing ops in the step loop
        else:
            out = (mx.argmax(lg, axis=-1), None, None)
        mx.async_eval([a for a in out if a is not None])
        return out

    cur = pick(logits)
    for n in range(1, max_new + 1):
        nxt = pick(bb.step(cur[0], cache)) if n < max_new else None
        tok = int(cur[0].item())
        yield tok, cur[1], cur[2]
        if tok in eos or nxt is None or (cancel is not None and cancel.is_set()):
            return
        cur = nxt


def _greedy_lookup(bb: Backbone, cache: list[Any], logits: mx.array, max_new: int, stats: bool,
                   cancel: threading.Event | None, history: Sequence[int]
                   ) -> Iterator[tuple[int, mx.array | None, mx.array | None]]:
    """`_greedy` with prompt lookup (`lookup.propose`): each step feeds the last token and up to
    `lookup.GUESS` guessed ones as one chunk, and keeps the guesses the chunk's own greedy picks
    confirm, then the pick after them; the cache is trimmed back to what was kept. Each row's
    logits are those of a step at its position (the engine computes rows alone), so tokens and
    statistics are `_greedy`'s exactly."""
    eos = bb.tokenizer.eos_ids
    seen = list(history)

    def picks(lg):  # (R, V) -> R tokens, and per-row entropies and gaps as (1,) arrays
        if stats:
            z = mx.zeros((lg.shape[0],), dtype=mx.float32)
            y, e, g, _ = bb.select(lg, z, z)
            mx.eval(y, e, g)
            return y.tolist(), [e[i:i + 1] for i in range(lg.shape[0])], [g[i:i + 1] for i in range(lg.shape[0])]
        return mx.argmax(lg, axis=-1).tolist(), [None] * lg.shape[0], [None] * lg.shape[0]

    toks, ents, gaps = picks(logits)
    n = 0
    while True:
        # toks: decided, not yet yielded; the cache ends just before the last of them
        for i, tok in enumerate(toks):
            last = tok in eos or n + 1 >= max_new
            if last and i < len(toks) - 1:  # stopping early: the cache must end just before `tok`
                _trim(cache, len(toks) - 1 - i)
            n += 1
            seen.append(tok)
            yield tok, ents[i], gaps[i]
            if last or (cancel is not None and cancel.is_set()):
                return
        guess = lookup.propose(seen, lookup.NGRAM, lookup.MIN_NGRAM, min(lookup.GUESS, max_new - n - 1))
        chunk = [toks[-1]] + guess
        lg = bb.step_chunk(mx.array(chunk, dtype=mx.int32), cache)
        toks, ents, gaps = picks(lg)
        kept = 0
        while kept < len(guess) and toks[kept] == guess[kept]:
            kept += 1
        _trim(cache, len(guess) - kept)  # the rejected guesses leave the cache
        toks, ents, gaps = toks[:kept + 1], ents[:kept + 1], gaps[:kept + 1]


def _trim(cache: list[Any], n: int) -> None:
    if n > 0:
        for c in cache:
            c.trim(n)


def draft(bb: Backbone, prompt_ids: list[int], k: int = DEFAULT_K, n_samples: int = 0,
          temperature: float = DEFAULT_TEMPERATURE, seed: int = 0, context: Sequence[int] = ()) -> Draft:
    """Prefill B(q) once and decode the k-token greedy draft (and N sampled prefixes).

    With n_samples > 0 the greedy row and the N sampled rows decode as one batch of N + 1
    that shares the single prefill, so the variance gate costs one batched draft. `context`:
    tokens the greedy draft's guesses may be copied from besides its prompt (never read by the
    model: the draft is closed-book, token for token the same with or without it).
    """
    if k < 1:
        raise ValueError(f"draft length k must be >= 1, got {k}")
    if n_samples < 0 or (n_samples > 0 and not temperature > 0):
        raise ValueError(f"variance sampling needs n_samples >= 1 and temperature > 0, got {n_samples}, {temperature}")
    t0 = time.perf_counter()
    cache = bb.make_cache()
    logits = bb.prefill(prompt_ids, cache)
    mx.eval(logits)
    t1 = time.perf_counter()
    if n_samples == 0:
        toks, ents, gaps = [], [], []
        for tok, e, g in _greedy(bb, cache, logits, k, stats=True, history=[*context, *prompt_ids]):
            toks.append(tok)
            ents.append(e)
            gaps.append(g)
        ents_f, gaps_f = mx.concatenate(ents).tolist(), mx.concatenate(gaps).tolist()
        samples: list[list[int]] = []
        ended = toks[-1] in bb.tokenizer.eos_ids
    else:
        toks, ents_f, gaps_f, samples, cache = _batched_draft(bb, cache, logits, k, n_samples, temperature, seed)
        ended = toks[-1] in bb.tokenizer.eos_ids
    t2 = time.perf_counter()
    return Draft(list(prompt_ids), toks, ents_f, gaps_f, samples, cache, ended, t1 - t0, t2 - t1, tuple(context))


def _batched_draft(bb: Backbone, cache: list[Any], logits: mx.array, k: int, n: int, temperature: float,
                   seed: int) -> tuple[list[int], list[float], list[float], list[list[int]], list[Any]]:
    """The greedy row and N sampled rows of one prompt as one batch of `batch.decode_batch`, the
    eval's decode loop: the same draws, tokens and statistics as its rows of a larger batch."""
    # on the kernels the N + 1 rows read the prompt's keys in place; elsewhere they are copied
    rows = bb.engine.share_rows(cache, [0] * (n + 1))
    # every row stays in the batch (row 0's cache continues the draft), cut at its first EOS after
    dec = decode_batch(bb, rows, mx.repeat(logits, n + 1, axis=0), k, [True] + [False] * n, temperature, seed,
                       drop_finished=False)
    greedy = dec.tokens[0]
    # Row 0's cache now holds prompt + every token fed so far; drop whatever follows the draft's
    # last token so the continuation feeds it next, as in the unbatched path.
    row0 = bb.engine.row(rows, 0)
    fed = dec.steps - 1 if dec.steps == k else dec.steps
    for c in row0:
        c.offset -= max(0, fed - (len(greedy) - 1))
        c.keys = c.keys[:, :, : c.offset, :]
        c.values = c.values[:, :, : c.offset, :]
    return greedy, dec.entropies[0], dec.gaps[0], dec.tokens[1:], row0


def continue_with_stats(bb: Backbone, d: Draft, max_new: int, cancel: threading.Event | None = None
                        ) -> Iterator[tuple[int, float, float]]:
    """Greedy tokens after the draft's last token with each step's (entropy, gap), as the draft
    records them: what the optional re-check scores while the answer streams."""
    if d.ended or max_new <= 0:
        return
    logits = bb.step(mx.array([d.tokens[-1]], dtype=mx.int32), d.cache)
    for tok, e, g in _greedy(bb, d.cache, logits, max_new, stats=True, cancel=cancel,
                             history=d.history):
        yield tok, e.item(), g.item()


def continue_tokens(bb: Backbone, d: Draft, max_new: int, cancel: threading.Event | None = None) -> Iterator[int]:
    """Greedy tokens after the draft's last token (the draft itself not included), as they come."""
    if d.ended or max_new <= 0:
        return
    logits = bb.step(mx.array([d.tokens[-1]], dtype=mx.int32), d.cache)
    for tok, _, _ in _greedy(bb, d.cache, logits, max_new, cancel=cancel,
                             history=d.history):
        yield tok


def continue_greedy(bb: Backbone, d: Draft, max_new: int, cancel: threading.Event | None = None,
                    on_token: Callable[[int], None] | None = None) -> tuple[list[int], float]:
    """Greedy tokens after the draft's last token (the draft itself not included)."""
    t0 = time.perf_counter()
    out = []
    for tok in continue_tokens(bb, d, max_new, cancel):
        out.append(tok)
        if on_token:
            on_token(tok)
    return out, time.perf_counter() - t0


def generate_tokens(bb: Backbone, prompt_ids: list[int], max_new: int, cancel: threading.Event | None = None,
                    timing: dict | None = None) -> Iterator[int]:
    """Greedy tokens from a fresh prompt as they come; `timing` receives prefill and decode seconds."""
    t0 = time.perf_counter()
    cache = bb.make_cache()
    logits = bb.prefill(prompt_ids, cache)
    mx.eval(logits)
    t1 = time.perf_counter()
    if timing is not None:
        timing["prefill"] = t1 - t0
    try:
        for tok, _, _ in _greedy(bb, cache, logits, max_new, cancel=cancel, history=prompt_ids):
            yield tok
    finally:
        if timing is not None:
            timing["decode"] = time.perf_counter() - t1


def generate(bb: Backbone, prompt_ids: list[int], max_new: int, cancel: threading.Event | None = None,
             on_token: Callable[[int], None] | None = None) -> tuple[list[int], float, float]:
    """Greedy generation from a fresh prompt; returns (tokens, prefill seconds, decode seconds)."""
    timing: dict = {}
    out = []
    for tok in generate_tokens(bb, prompt_ids, max_new, cancel, timing):
        out.append(tok)
        if on_token:
            on_token(tok)
    return out, timing["prefill"], timing["decode"]


def token_logprobs(bb: Backbone, prompt_ids: list[int], tokens: list[int], top: int = 0
                   ) -> list[tuple[float, list[tuple[int, float]]]]:
    """log p of each of `tokens` given the prompt and the tokens before it (teacher-forced: one
    prefill and one step per token, the cost of decoding them again), with the `top` most likely
    alternatives at each position. For an API's `logprobs`, asked for per request."""
    out: list[tuple[float, list[tuple[int, float]]]] = []
    if not tokens:
        return out
    cache = bb.make_cache()
    logits = bb.prefill(prompt_ids, cache)
    for i, tok in enumerate(tokens):
        lp = logits[0].astype(mx.float32)
        lp = lp - mx.logsumexp(lp)
        alts: list[tuple[int, float]] = []
        if top:
            idx = mx.argpartition(-lp, top - 1)[:top]
            vals = lp[idx]
            alts = sorted(zip(idx.tolist(), vals.tolist()), key=lambda a: -a[1])
        out.append((float(lp[tok].item()), alts))
        if i + 1 < len(tokens):
            logits = bb.step(mx.array([tok], dtype=mx.int32), cache)
    return out
