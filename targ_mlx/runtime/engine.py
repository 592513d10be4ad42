"""The engine seam: what a `Backbone` runs a model with.

An engine feeds tokens through a KV cache and turns hidden states into logits (`hidden`, `head`,
`advance`, `last_logits`), decodes one step for a batch (`step`), picks tokens with the gate's
statistics (`select`), lets several rows read one prompt's keys (`share_rows`, `row`), lets a
batch's finished rows go (`keep_rows`), and puts its weights on 2 MB pages where that helps
(`huge_pages`). Two implement it: `MlxLMEngine` here (plain mlx-lm layers; the default, any
device) and `targ_mlx.runtime.native.engine.NativeEngine` (the CPU kernels). Nothing above the
backbone asks which one runs.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import mlx.core as mx
import mlx.nn as nn

from targ_mlx.runtime import sampling
from targ_mlx.runtime.native.caches import take_rows


class Engine(Protocol):
    name: str
    shares_prefix: bool  # a batch's common prompt head can be run once and reused bit for bit
    independent_rows: bool  # a row's results do not depend on the other rows of its batch

    def advance(self, tokens: mx.array, cache: list[Any]) -> None: ...

    def last_logits(self, tokens: mx.array, cache: list[Any]) -> mx.array: ...

    def step(self, tokens: mx.array, cache: list[Any]) -> mx.array: ...

    def select(self, logits: mx.array, inv_temp: mx.array, u: mx.array) -> tuple[mx.array, ...]: ...

    def share_rows(self, cache: list[Any], rows: Sequence[int]) -> list[Any]: ...

    def row(self, cache: list[Any], b: int) -> list[Any]: ...

    def keep_rows(self, cache: list[Any], rows: Sequence[int]) -> list[Any]: ...

    def huge_pages(self, mode: str) -> int: ...


class MlxLMEngine:
    """mlx-lm's own layers: Metal, CUDA, or MLX's CPU ops. Shared rows are copies of the prompt's keys."""

    name = "mlx"
    shares_prefix = False
    independent_rows = False  # BLAS and GPU matmuls pick their blocking by the row count

    def __init__(self, model: nn.Module):
        self.model = model
        inner = getattr(model, "model", None)
        # architectures without the usual .model/.lm_head split run whole, all positions through the head
        self._split = inner is not None and hasattr(inner, "embed_tokens")

    def hidden(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        """Final-norm hidden states (B, L, H); advances the cache."""
        return self.model.model(tokens, cache=cache)

    def head(self, h: mx.array) -> mx.array:
        if getattr(self.model, "lm_head", None) is not None and not getattr(self.model.args, "tie_word_embeddings", False):
            return self.model.lm_head(h)
        return self.model.model.embed_tokens.as_linear(h)

    def advance(self, tokens: mx.array, cache: list[Any]) -> None:
        self.hidden(tokens, cache) if self._split else self.model(tokens, cache=cache)

    def last_logits(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        """Logits (B, V) float32 at the last position; only that position goes through the head."""
        if not self._split:
            return self.model(tokens, cache=cache)[:, -1, :].astype(mx.float32)
        return self.head(self.hidden(tokens, cache)[:, -1:, :])[:, -1, :].astype(mx.float32)

    def step(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        return self.model(tokens[:, None], cache=cache)[:, -1, :].astype(mx.float32)

    def select(self, logits: mx.array, inv_temp: mx.array, u: mx.array) -> tuple[mx.array, ...]:
        return sampling.select(logits, inv_temp, u)

    def share_rows(self, cache: list[Any], rows: Sequence[int]) -> list[Any]:
        """Row b of the result continues prompt row rows[b]; here each row gets its own copy."""
        return [take_rows(c, rows) for c in cache]

    def keep_rows(self, cache: list[Any], rows: Sequence[int]) -> list[Any]:
        """Only `rows` of a decoding batch, in that order (copies)."""
        return [take_rows(c, rows) for c in cache]

    def row(self, cache: list[Any], b: int) -> list[Any]:
        """Row b alone, to continue decoding it (a copy)."""
        return [take_rows(c, [b]) for c in cache]

    def huge_pages(self, mode: str) -> int:
        """Page sizes are the CPU kernels' concern (their weights stream once a token); MLX's own
        arrays stay as its allocator made them."""
        return 0

