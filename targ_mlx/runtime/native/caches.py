"""The KV caches the kernels read besides mlx-lm's own: a prompt's keys shared by several decoded
rows (the variance draft), and a copy of a cache's chosen rows."""

from __future__ import annotations

import copy
from typing import Any, Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache


class SharedPrefixCache(KVCache):
    """Rows decoded from prompts that were run once: row b attends to row `rows[b]` of the
    prompts' keys and values (shared, never copied), then to its own positions, which this
    (B-row) KVCache holds. The variance gate's N + 1 rows read one prompt's keys instead of
    N + 1 copies: at a few hundred prompt positions those copies, not the weights, were most of
    the memory a decode step read. Only the kernels' attention understands it.
    """

    def __init__(self, keys: mx.array, values: mx.array, rows: list[int], positions: mx.array,
                 pad: mx.array | None = None, hole: int = 0):
        super().__init__()
        R = keys.shape[0]
        if not rows or min(rows) < 0 or max(rows) >= R:
            raise ValueError(f"rows must index the {R} prompt rows, got {rows}")
        self.shared_keys, self.shared_values, self.shared_pad, self.shared_hole = keys, values, pad, hole
        self.rows = mx.array(rows, dtype=mx.int32)
        self.base = positions[self.rows]  # RoPE position of each row's first own token

    @classmethod
    def from_cache(cls, c: Any, rows: list[int]) -> "SharedPrefixCache":
        """Over a prefilled `KVCache` (one prompt) or `BatchKVCache` (left-padded prompts)."""
        if isinstance(c, BatchKVCache):
            return cls(c.keys[..., : c._idx, :], c.values[..., : c._idx, :], rows, c.offset, c.left_padding,
                       int(getattr(c, "prefix_len", 0)))
        if isinstance(c, KVCache):
            return cls(c.keys[..., : c.offset, :], c.values[..., : c.offset, :], rows,
                       mx.array([c.offset], dtype=mx.int32))
        raise TypeError(f"cannot share the prompt of a {type(c).__name__}")

    def row(self, b: int) -> "SharedPrefixCache":
        """Row b alone, still reading its prompt's keys in place (to continue decoding it)."""
        out = self.keep([b])
        if out.keys is not None:  # one row continues alone: its buffers need no spare room
            out.keys, out.values = out.keys[..., : self.offset, :], out.values[..., : self.offset, :]
        return out

    def keep(self, rows: list[int]) -> "SharedPrefixCache":
        """These rows alone (in this order), still reading their prompts' keys in place."""
        out = copy.copy(self)
        src = self.rows.tolist()
        out.rows = mx.array([src[b] for b in rows], dtype=mx.int32)  # a ready array: no ops per layer
        idx = mx.array(list(rows), dtype=mx.int32)
        out.base = self.base[idx]
        if self.keys is not None:
            out.keys, out.values = self.keys[idx], self.values[idx]
        return out

    @property
    def positions(self) -> int:
        """Cached positions a row attends to: its prompt's (padding included) and its own."""
        return int(self.shared_keys.shape[2]) + self.offset


def take_rows(c: Any, rows: Sequence[int]) -> Any:
    """A copy of cache `c` holding its rows `rows` (in that order, repeats allowed), positions and
    padding as they are: the kept rows' keys stay where attention read them before."""
    idx = mx.array(list(rows))
    if isinstance(c, BatchKVCache):
        kv = copy.copy(c)  # keeps the cache class (and a shared prefix's length)
        kv.keys, kv.values = c.keys[idx], c.values[idx]
        kv.offset, kv.left_padding, kv._idx = c.offset[idx], c.left_padding[idx], c._idx
        return kv
    kv = KVCache()
    kv.keys = c.keys[:, :, : c.offset, :][idx]
    kv.values = c.values[:, :, : c.offset, :][idx]
    kv.offset = c.offset
    return kv
