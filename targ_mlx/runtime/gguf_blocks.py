"""GGUF block types as affine groups of 32: w = scale * q + bias, q unsigned 4 or 8 bits.

This is the form MLX's quantized layers and the CPU kernels (`targ_mlx.runtime.native.pack`) take, so a
GGUF tensor in one of these types loads without a float32 copy:

  Q4_0, Q4_1, Q4_K  -> 4 bits, exact (Q4_K: sub-blocks of 32, scale d*sc, bias -dmin*m)
  Q5_0, Q5_1, Q5_K, Q8_0 -> 8 bits holding the 5- or 8-bit values, exact
  Q6_K  -> 8 bits per 32, not exact: its sub-blocks of 16 have their own int8 scales. The group's
           step is a quarter of the larger sub-block's (d*|s|/4), so that sub-block stays exact
           and the other is rounded to that step (error <= d*max|s|/8, an eighth of a Q6_K step;
           a group spanning 257 steps, about 1 in 400, has its extreme value clipped by one).

"Exact" holds with float32 scales and biases; `affine()` returns float32 and the caller picks the
stored precision. Other types (Q2_K, Q3_K, IQ*) return None and are dequantized to float.
The bit layouts follow gguf-py's `gguf.quants` (and ggml-quants.c); the tests compare every
type with `gguf.quants.dequantize`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

QK_K = 256
GROUP = 32


@dataclass(frozen=True)
class Affine:
    vals: np.ndarray  # (N, K) uint8, each value < 2**bits
    scales: np.ndarray  # (N, K/32) float32
    biases: np.ndarray  # (N, K/32) float32
    bits: int


def _f16(b: np.ndarray) -> np.ndarray:
    """(n, 2) bytes -> (n, 1) float32."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """(n, width/2 * m) bytes -> (n, m * width): per run of width/2 bytes, low nibbles then high."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, width // 2) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, -1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Q5_0/Q5_1: a little-endian uint32 per block -> (n, 32) bits."""
    h = np.ascontiguousarray(qh).view(np.uint32).reshape(-1, 1) >> np.arange(count, dtype=np.uint32)
    return (h & 1).astype(np.uint8)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins per super-block."""
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _blocks(raw: np.ndarray, qtype: T) -> tuple[np.ndarray, int]:
    from gguf.constants import GGML_QUANT_SIZES

    size, nbytes = GGML_QUANT_SIZES[qtype]
    return np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, nbytes), size


def _legacy(b: np.ndarray, qtype: T) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 blocks of 32 -> (values (n, 32), scale (n, 1), bias (n, 1), bits)."""
    d = _f16(b[:, 0:2])
    if qtype == T.Q8_0:
        return (b[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8), d, -128 * d, 8
    if qtype == T.Q4_0:
        return _nibbles(b[:, 2:], 32), d, -8 * d, 4
    if qtype == T.Q4_1:
        return _nibbles(b[:, 4:], 32), d, _f16(b[:, 2:4]), 4
    if qtype == T.Q5_0:
        return _nibbles(b[:, 6:], 32) | (_high_bits(b[:, 2:6], 32) << 4), d, -16 * d, 8
    if qtype == T.Q5_1:
        return _nibbles(b[:, 8:], 32) | (_high_bits(b[:, 4:8], 32) << 4), d, _f16(b[:, 2:4]), 8
    raise ValueError(qtype)


def _q45k(b: np.ndarray, qtype: T) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Q4_K/Q5_K super-blocks of 256 -> 8 groups of 32 each: (values, scales, biases, bits)."""
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scale_min(b[:, 4:16])
    if qtype == T.Q4_K:
        q, bits = _nibbles(b[:, 16:], 64), 4
    else:
        qh = b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
        q, bits = _nibbles(b[:, 48:], 64) | ((qh & 1).reshape(n, -1) << 4), 8
    return q.reshape(-1, GROUP), (d * sc).reshape(-1, 1), (-dmin * mn).reshape(-1, 1), bits


def _q6k_values(b: np.ndarray) -> np.ndarray:
    """Q6_K super-blocks (n, 210) -> their 256 unsigned 6-bit values each (n, 256), in k order:
    value e = 128 h + 32 t + i is nibble t // 2 of ql[64 h + 32 (t % 2) + i] with bits 2t of
    qh[32 h + i] above it."""
    ql, qh = b[:, :128], b[:, 128:192]
    lo = (ql.reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F  # (block, h, t // 2, 64)
    hi = (qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 0x03  # (block, h, t, 32)
    return (lo.reshape(-1, 2, 4, 32) | (hi << 4)).reshape(-1, 256)


def _q6k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Q6_K super-blocks of 256 (16 sub-blocks of 16) -> 8 groups of 32 at 8 bits (see module doc)."""
    n = b.shape[0]
    sc, d = b[:, 192:208].view(np.int8), _f16(b[:, 208:210])
    q = _q6k_values(b).reshape(n, 8, 32).astype(np.float32) - 32
    s = sc.astype(np.float32).reshape(n, 8, 2)  # the two sub-block scales of each group
    big = np.take_along_axis(s, np.abs(s).argmax(-1)[..., None], -1)  # (n, 8, 1), signed
    # In units of step = d*|big|/4, sub-block j's values are q * 4 * s_j / |big|: integers for
    # the larger sub-block, rounded for the other.
    units = q.reshape(n, 8, 2, 16) * (np.float32(4) * s / np.where(big == 0, 1, np.abs(big)))[..., None]
    units = np.rint(units, out=units).astype(np.int16).reshape(n * 8, GROUP)
    lo_u = units.min(-1, keepdims=True)
    vals = np.clip(units - lo_u, 0, 255).astype(np.uint8)
    step = (d[:, :, None] * np.abs(big) / 4.0).reshape(-1, 1).astype(np.float32)
    return vals, step, lo_u.astype(np.float32) * step, 8


_LEGACY = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
SUPPORTED = _LEGACY + (T.Q4_K, T.Q5_K, T.Q6_K)


def affine(raw: np.ndarray, qtype: T, shape: tuple[int, int]) -> Affine | None:
    """A GGUF tensor's raw blocks (as `GGUFReader` gives them) as affine groups of 32, or None
    if its type has no such form. `shape` is the row-major (N, K)."""
    if qtype not in SUPPORTED or len(shape) != 2 or shape[1] % GROUP:
        return None
    b, _ = _blocks(raw, qtype)
    if qtype in _LEGACY:
        vals, s, bias, bits = _legacy(b, qtype)
    elif qtype == T.Q6_K:
        vals, s, bias, bits = _q6k(b)
    else:
        vals, s, bias, bits = _q45k(b, qtype)
    n, k = shape
    return Affine(vals.reshape(n, k), s.reshape(n, k // GROUP).astype(np.float32),
                  bias.reshape(n, k // GROUP).astype(np.float32), bits)


def dequantize(a: Affine) -> np.ndarray:
    """The float32 matrix `a` stands for (for tests and measurements)."""
    n, k = a.vals.shape
    v = a.vals.reshape(n, k // GROUP, GROUP).astype(np.float32)
    return (v * a.scales[..., None] + a.biases[..., None]).reshape(n, k)


def mlx_packed(a: Affine) -> np.ndarray:
    """Values packed as MLX stores quantized weights: uint32 words, element j at bits bits*(j % w)."""
    v = a.vals
    if a.bits == 4:
        v = v[:, 0::2] | (v[:, 1::2] << 4)
    return np.ascontiguousarray(v, dtype=np.uint8).view(np.uint32)


# ---- the CPU kernels' forms of K-quant matrices (targ_mlx.runtime.native) ----

def q4k_tiles(blocks: np.ndarray):
    """GGUF Q4_K blocks (N, K/256 * 144) -> 4-bit tiles that keep the block's own scales: per
    column and group of 32 its 6-bit scale and min (a byte each), per column and super-block its
    float16 d and dmin (csrc/qgemm.h, group_affine): 4.625 bits a weight against the file's 4.5.
    The nibbles are in the layout this build's kernels read (`native.q4k_layout()`)."""
    import mlx.core as mx

    from targ_mlx.runtime.native import q4k_layout
    from targ_mlx.runtime.native.pack import NT, QG, Packed, from_values, k4_nibbles

    n = blocks.shape[0]
    b = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, 144)
    k = b.shape[0] // n * 256
    if n % NT:
        raise ValueError(f"the CPU kernels need N divisible by {NT}, got N={n}")
    vals = _nibbles(b[:, 16:], 64).reshape(n, k)
    sc, mn = (a.astype(np.uint8).reshape(n, k // QG) for a in _k_scale_min(b[:, 4:16]))
    d, dmin = (np.ascontiguousarray(b[:, i : i + 2]).view(np.float16).reshape(n, k // 256) for i in (0, 2))
    if q4k_layout() == "k4":
        q = mx.array(k4_nibbles(vals))
    else:
        q = from_values(vals, np.ones((n, k // QG), np.float32), np.zeros((n, k // QG), np.float32), 4).q

    def pair(a, c):  # (N, m) twice -> per tile and m: 16 of a then 16 of c, rows of tile t = tile t
        t = lambda x: x.reshape(n // NT, NT, -1).transpose(0, 2, 1)  # noqa: E731
        return np.ascontiguousarray(np.stack([t(a), t(c)], axis=2)).reshape(n, -1)

    return Packed(q, mx.array(pair(sc, mn)), mx.array(pair(d, dmin)), 4)


def q6k_tiles(blocks: np.ndarray):
    """GGUF Q6_K blocks (N, K/256 * 210) -> 16-column tiles of the same values, scales and d
    (csrc/k6tiles.h): 6 bits a value, an int8 scale per column and 16 k, a float16 d per column
    and 256: 6.5625 bits a weight, as the file."""
    import mlx.core as mx

    from targ_mlx.runtime.native.pack import NT, Packed, k6_bytes, tile_rows

    n = blocks.shape[0]
    b = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, 210)
    k = b.shape[0] // n * 256
    if n % NT:
        raise ValueError(f"the CPU kernels need N divisible by {NT}, got N={n}")
    vals = _q6k_values(b).reshape(n, k)
    sc = b[:, 192:208].view(np.int8).reshape(n, k // 16)
    d = np.ascontiguousarray(b[:, 208:210]).view(np.float16).reshape(n, k // 256)
    return Packed(mx.array(k6_bytes(vals)), mx.array(tile_rows(sc)), mx.array(tile_rows(d)), 6)


def kernel_weights(qtype: int, blocks: np.ndarray, embedding: bool = False):
    """The kernels' form of a matrix of GGUF K-quant blocks (the journal's
    "K-quant blocks", docs/archive/benchmarks-journal.md):
    Q6_K as the file stores it (csrc/kquant.h: 6.56 bits a weight instead of 9 in 8-bit tiles,
    and faster products), or on AVX512-VNNI builds in 16-column tiles of the same bits
    (`q6k_tiles`, `native.q6k_layout()`); Q4_K in 4-bit tiles that keep its 6-bit scales and
    mins (4.625 bits a weight, the file's 4.5; tiles multiply faster than its rows); an
    embedding as stored (its rows are only looked up)."""
    import mlx.core as mx

    from targ_mlx.runtime.native.pack import NT, KBlocks

    if qtype == T.Q4_K and not embedding and blocks.shape[0] % NT == 0:
        return q4k_tiles(blocks)
    if qtype == T.Q6_K and not embedding and blocks.shape[0] % NT == 0:
        from targ_mlx.runtime.native import q6k_layout

        if q6k_layout() == "tiles":
            return q6k_tiles(blocks)
    return KBlocks(mx.array(blocks), int(qtype))
