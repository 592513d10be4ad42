"""Prompt lookup: guesses of the next tokens, copied from where the text so far occurred before.

A read answer copies its passages ("Roald Amundsen ... on 14 December 1911") and a draft repeats its
question ("The first person to reach the South Pole was ..."). Where the last few tokens occurred
earlier in the prompt or the answer, the tokens that followed them there are a guess of what comes
next; `draft._greedy` feeds the guess with the current token as one short chunk and keeps the
guessed tokens the model itself picks (greedy verification, as in prompt-lookup decoding, Saxena
2023). On the CPU kernels a row's logits do not depend on the rows run beside it, so the tokens,
entropies and gaps are bit for bit those of one step at a time; a short chunk costs little more
than one step because a step's time is reading the weights.
"""

from __future__ import annotations

import os
from typing import Sequence

NGRAM = 3  # the longest run of last tokens looked up (then shorter ones, down to MIN_NGRAM)
MIN_NGRAM = 2  # a single token recurs too often to be a guess worth its verify cost
GUESS = 4  # tokens guessed per step: the chunk's rows cost more past ~4 (BENCHMARKS.md)
ENV = "TARG_MLX_LOOKUP"  # "0" turns it off (scripts/bench/bench_lookup.py times both)


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def propose(history: Sequence[int], n_max: int = NGRAM, n_min: int = MIN_NGRAM, m: int = GUESS) -> list[int]:
    """Up to `m` tokens that followed the latest earlier occurrence of the last n tokens of
    `history` (the longest n from `n_max` down to `n_min` that occurs); [] where none occurs."""
    h = list(history)
    size = len(h)
    if m <= 0:
        return []
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        key = h[size - n:]
        first = key[0]
        # latest occurrence that ends before the last n tokens themselves
        for i in range(size - n - 1, -1, -1):
            if h[i] == first and h[i:i + n] == key:
                return h[i + n:i + n + m]  # i + n < size: never empty
    return []
