"""The CPU kernels as an engine (`targ_mlx.runtime.engine.Engine`): forward passes by `NativeLM`, token
choice by the fused select kernel, and rows that read their prompt's keys in place."""

from __future__ import annotations

from typing import Any, Sequence

import mlx.core as mx

from targ_mlx.runtime.native import pages
from targ_mlx.runtime.native.caches import SharedPrefixCache, take_rows
from targ_mlx.runtime.native.model import NativeLM


class NativeEngine:
    name = "targ_mlx.runtime.native"
    shares_prefix = True  # a row's keys do not depend on what follows: a reused head is bit for bit
    independent_rows = True  # every kernel computes a row by the same operations whatever the batch

    def __init__(self, lm: NativeLM):
        self.lm = lm

    @property
    def nbytes(self) -> int:
        return self.lm.nbytes

    def hidden(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        return self.lm.hidden(tokens, cache)

    def head(self, h: mx.array) -> mx.array:
        return self.lm.head(h)

    # advance and last_logits run prompts (prefills); hidden and step run decoded tokens
    def advance(self, tokens: mx.array, cache: list[Any]) -> None:
        self.lm.hidden(tokens, cache, prompt=True)

    def last_logits(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        return self.lm.head(self.lm.hidden(tokens, cache, last=True, prompt=True))[:, -1, :].astype(mx.float32)

    def step(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        return self.lm(tokens[:, None], cache)[:, -1, :]

    def select(self, logits: mx.array, inv_temp: mx.array, u: mx.array) -> tuple[mx.array, ...]:
        return self.lm.ops.select(logits, inv_temp, u)

    def share_rows(self, cache: list[Any], rows: Sequence[int]) -> list[Any]:
        return [SharedPrefixCache.from_cache(c, list(rows)) for c in cache]

    def row(self, cache: list[Any], b: int) -> list[Any]:
        return [c.row(b) for c in cache]

    def keep_rows(self, cache: list[Any], rows: Sequence[int]) -> list[Any]:
        """Only `rows` of a decoding batch: rows over a shared prompt keep reading it in place."""
        return [c.keep(rows) if isinstance(c, SharedPrefixCache) else take_rows(c, rows) for c in cache]

    def huge_pages(self, mode: str) -> int:
        """The weights on 2 MB pages (`pages.huge_pages`); bytes the OS took the request for."""
        return pages.huge_pages(self.lm.state().values(), mode)
