"""Repack weights for the CPU kernels: 4- or 8-bit affine groups of 32 along K, in tiles of 16
output columns.

MLX's own quantized layers (and Q4_0/Q4_1/Q8_0 GGUF tensors, which `mx.load` returns in that
form) already store w = scale * q + bias per group, so repacking is exact: groups of 64 or 128
are split into groups of 32 sharing a scale. The kernels read a tile's group as 32 rows k of
16 columns (`csrc/qgemm.h`); a 4-bit byte holds rows 2j and 2j+1 of one column. Float weights
are quantized to 8 bits (error at most half a step of 1/255 of each group's range).

The arrays keep matrix-like shapes, (N, K * bits / 8) and (N, K / 32), but their memory is in
tile order: rows 16t..16t+15 of each array are tile t, so stacking matrices along N is a plain
concatenation.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

QG = 32
NT = 16  # output columns per tile


@dataclass(frozen=True)
class Packed:
    q: mx.array  # (N, K * bits / 8) uint8
    scales: mx.array  # (N, K / 32) float16 or float32
    biases: mx.array
    bits: int

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.q.shape[0]), int(self.q.shape[1]) * 8 // self.bits

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scales.nbytes + self.biases.nbytes

    def args(self) -> tuple[mx.array, mx.array, mx.array, int]:
        return self.q, self.scales, self.biases, self.bits

    @property
    def kscale(self) -> bool:
        """Q4_K tiles: uint8 6-bit scales and mins per group, float16 d and dmin per 256 (`gguf_blocks.q4k_tiles`)."""
        return self.scales.dtype == mx.uint8

    @property
    def kind(self) -> tuple:
        return ("tiles", self.bits, self.kscale)

    @property
    def k6(self) -> bool:
        """Q6_K tiles: int8 scales per 16, float16 d per 256 (`gguf_blocks.q6k_tiles`)."""
        return self.bits == 6

    def linear(self, ops, x: mx.array, bias: mx.array | None = None, residual: mx.array | None = None,
               swiglu: bool = False) -> mx.array:
        """x W^T (+ bias) (+ residual); `swiglu`: W is gate|up and the result SwiGLU of its halves."""
        return ops.qlinear(x, *self.args(), bias=bias, residual=residual, swiglu=swiglu)

    def spec(self) -> tuple[int, list[mx.array]]:
        """(form, arrays) as the fused layer ops take a matrix: form = bits for tiles."""
        return self.bits, [self.q, self.scales, self.biases]

    def embed(self, ops, ids: mx.array) -> mx.array:
        return ops.embed(ids, *self.args())


# GGML type ids of the K-quant blocks the kernels read as the file stores them (csrc/kquant.h)
Q4_K, Q6_K = 12, 14
K_BLOCK_BYTES = {Q4_K: 144, Q6_K: 210}


@dataclass(frozen=True)
class KBlocks:
    """A matrix as GGUF K-quant super-blocks, row by row: the file's own bytes, read by the
    kernels without repacking (csrc/kquant.h)."""

    blocks: mx.array  # (N, K / 256 * block bytes) uint8
    qtype: int  # Q4_K or Q6_K

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.blocks.shape[0]), int(self.blocks.shape[1]) // K_BLOCK_BYTES[self.qtype] * 256

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes

    @property
    def kind(self) -> tuple:
        return ("kquant", self.qtype)

    def linear(self, ops, x: mx.array, bias: mx.array | None = None, residual: mx.array | None = None,
               swiglu: bool = False) -> mx.array:
        return ops.kqlinear(x, self.blocks, self.qtype, bias=bias, residual=residual, swiglu=swiglu)

    def spec(self) -> tuple[int, list[mx.array]]:
        """(form, arrays) as the fused layer ops take a matrix: form = the GGML type for blocks."""
        return self.qtype, [self.blocks]

    def embed(self, ops, ids: mx.array) -> mx.array:
        return ops.kembed(ids, self.blocks, self.qtype)


Weights = Packed | KBlocks


def _np_float(a: mx.array) -> np.ndarray:
    if a.dtype == mx.float16:
        return np.asarray(a)
    return np.asarray(a.astype(mx.float32))


def unpack_mlx(w: mx.array, bits: int) -> np.ndarray:
    """MLX-packed uint32 rows -> (N, K) unsigned values."""
    b = np.asarray(w).view(np.uint8)
    if bits == 8:
        return b
    if bits == 4:
        out = np.empty((b.shape[0], b.shape[1] * 2), np.uint8)
        out[:, 0::2] = b & 0x0F
        out[:, 1::2] = b >> 4
        return out
    raise ValueError(f"unpack_mlx handles 4 and 8 bits, got {bits}")


def from_values(vals: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int) -> Packed:
    """(N, K) unsigned values with per-32 scales/biases (N, K/32) -> Packed."""
    n, k = vals.shape
    if k % QG or n % NT:
        raise ValueError(f"the CPU kernels need K divisible by {QG} and N by {NT}, got N={n}, K={k}")
    g = k // QG
    v = vals.reshape(n // NT, NT, g, QG).transpose(0, 2, 3, 1)  # (tile, group, k, lane)
    if bits == 4:
        v = v[:, :, 0::2, :] | (v[:, :, 1::2, :] << 4)
    q = np.ascontiguousarray(v, dtype=np.uint8).reshape(n, k * bits // 8)
    dt = np.float16 if scales.dtype == np.float16 and biases.dtype == np.float16 else np.float32
    return Packed(mx.array(q), mx.array(tile_rows(scales.astype(dt))), mx.array(tile_rows(biases.astype(dt))), bits)


def from_quantized(w: mx.array, scales: mx.array, biases: mx.array, bits: int, group_size: int) -> Packed:
    """From an MLX affine-quantized matrix (QuantizedLinear / QuantizedEmbedding / mx.quantize)."""
    if bits not in (4, 8) or group_size % QG:
        # other widths: dequantize and requantize to 8 bits
        return from_float(mx.dequantize(w, scales, biases, group_size=group_size, bits=bits))
    vals = unpack_mlx(w, bits)
    rep = group_size // QG
    s, b = _np_float(scales), _np_float(biases)
    if rep > 1:
        s, b = np.repeat(s, rep, axis=1), np.repeat(b, rep, axis=1)
    return from_values(vals, s, b, bits)


def from_float(w: mx.array, bits: int = 8) -> Packed:
    """Quantize a float matrix (N, K) to `bits` per group of 32 (min/max affine)."""
    a = np.asarray(w.astype(mx.float32))
    n, k = a.shape
    if k % QG:
        raise ValueError(f"the CPU kernels need K divisible by {QG} and N by {NT}, got N={n}, K={k}")
    g = a.reshape(n, k // QG, QG)
    lo, hi = g.min(-1), g.max(-1)
    levels = (1 << bits) - 1
    scale = (hi - lo) / levels
    safe = np.where(scale > 0, scale, 1.0)
    q = np.clip(np.rint((g - lo[..., None]) / safe[..., None]), 0, levels).astype(np.uint8).reshape(n, k)
    return from_values(q, scale.astype(np.float32), lo.astype(np.float32), bits)


def tile_rows(a: np.ndarray) -> np.ndarray:
    """(N, m) per-column values -> tile order: per tile of 16 columns, m rows of 16, so rows
    16t .. 16t + 15 of the result are tile t's (the inverse of `_untile`)."""
    n = a.shape[0]
    return np.ascontiguousarray(a.reshape(n // NT, NT, -1).transpose(0, 2, 1)).reshape(n, -1)


def _untile(a: np.ndarray, n: int, g: int) -> np.ndarray:
    return a.reshape(n // NT, g, NT).transpose(0, 2, 1).reshape(n, g)


def k4_nibbles(vals: np.ndarray) -> np.ndarray:
    """(N, K) values 0..15 -> Q4_K tiles' bytes in the k4 layout (csrc/k4tiles.h): per tile and
    group, 4 runs of 64 bytes; in run j, byte 4c + i = k 8j + i | k 8j + 4 + i << 4 of column c."""
    n, k = vals.shape
    v = vals.astype(np.uint8).reshape(n // NT, NT, k // QG, 4, 2, 4)  # (tile, c, group, j, half, i)
    b = v[:, :, :, :, 0, :] | (v[:, :, :, :, 1, :] << 4)
    return np.ascontiguousarray(b.transpose(0, 2, 3, 1, 4)).reshape(n, k // 2)


def _k4(p: Packed) -> bool:
    if not p.kscale:
        return False
    from targ_mlx.runtime.native import q4k_layout

    return q4k_layout() == "k4"


def k6_bytes(vals: np.ndarray) -> np.ndarray:
    """(N, K) values 0..63 -> Q6_K tiles' bytes (csrc/k6tiles.h): per tile and group, the low 4
    bits in the k4 layout (256 bytes), then two planes of 64 bytes for the high 2 bits; in plane h,
    byte 4c + i holds at bits 2o, 2o + 1 those of k = 16h + 4o + i of column c."""
    n, k = vals.shape
    v = vals.astype(np.uint8)
    lo = k4_nibbles(v & 0x0F).reshape(n // NT, k // QG, 256)
    hi = (v >> 4).reshape(n // NT, NT, k // QG, 2, 4, 4)  # (tile, c, group, h, o, i)
    planes = np.zeros((n // NT, k // QG, 2, NT, 4), np.uint8)
    for o in range(4):
        planes |= hi[:, :, :, :, o, :].transpose(0, 2, 3, 1, 4) << (2 * o)
    out = np.concatenate([lo, planes.reshape(n // NT, k // QG, 128)], axis=2)
    return np.ascontiguousarray(out).reshape(n, k * 6 // 8)


def to_values(p: Packed) -> np.ndarray:
    """Packed -> (N, K) unsigned values (the inverse of the layout; for tests and concatenation)."""
    n, k = p.shape
    g = k // QG
    if p.k6:
        b = np.asarray(p.q).reshape(n // NT, g, 384)
        lo = b[:, :, :256].reshape(n // NT, g, 4, NT, 4)  # (tile, group, j, c, i)
        lo = np.stack([lo & 0x0F, lo >> 4], axis=3).transpose(0, 4, 1, 2, 3, 5).reshape(n, k)
        pl = b[:, :, 256:].reshape(n // NT, g, 2, NT, 4)  # (tile, group, h, c, i)
        hi = np.stack([(pl >> (2 * o)) & 3 for o in range(4)], axis=3)  # (tile, group, h, o, c, i)
        hi = hi.transpose(0, 4, 1, 2, 3, 5).reshape(n, k)
        return lo | (hi << 4)
    if _k4(p):
        b = np.asarray(p.q).reshape(n // NT, g, 4, NT, 4)  # (tile, group, j, c, i)
        v = np.stack([b & 0x0F, b >> 4], axis=3)  # (tile, group, j, half, c, i)
        return np.ascontiguousarray(v.transpose(0, 4, 1, 2, 3, 5)).reshape(n, k)
    q = np.asarray(p.q).reshape(n // NT, g, -1, NT)  # (tile, group, rows of bytes, lane)
    if p.bits == 4:
        v = np.empty((n // NT, g, QG, NT), np.uint8)
        v[:, :, 0::2, :], v[:, :, 1::2, :] = q & 0x0F, q >> 4
    else:
        v = q
    return np.ascontiguousarray(v.transpose(0, 3, 1, 2)).reshape(n, k)


def scales_biases(p: Packed) -> tuple[np.ndarray, np.ndarray]:
    """(N, K/32) float32 scales and biases in row order."""
    n, k = p.shape
    if p.kscale:
        def rows(a, m):  # the inverse of gguf_blocks.q4k_tiles' pair: (N, 2m) -> two (N, m)
            a = np.asarray(a).reshape(n // NT, m, 2, NT)
            return [a[:, :, i, :].transpose(0, 2, 1).reshape(n, m) for i in (0, 1)]

        sc, mn = (x.astype(np.float32) for x in rows(p.scales, k // QG))
        d, dmin = (np.repeat(x.astype(np.float32), 8, axis=1) for x in rows(p.biases, k // 256))
        return d * sc, -(dmin * mn)
    return (_untile(_np_float(p.scales).astype(np.float32), n, k // QG),
            _untile(_np_float(p.biases).astype(np.float32), n, k // QG))


def dequantize(p: Packed) -> mx.array:
    """The float32 matrix a Packed stands for (Q6_K tiles: as gguf-py computes it, (d * sc) * (q - 32))."""
    if p.k6:
        n, k = p.shape
        sc, d = _untile(np.asarray(p.scales), n, k // 16), _untile(np.asarray(p.biases), n, k // 256)
        ds = np.repeat(d.astype(np.float32), 16, axis=1) * sc.astype(np.float32)
        q = to_values(p).astype(np.int16) - 32
        return mx.array((np.repeat(ds, 16, axis=1) * q.astype(np.float32)).astype(np.float32))
    s, b = scales_biases(p)
    vals = to_values(p).astype(np.float32)
    return mx.array(vals * np.repeat(s, QG, axis=1) + np.repeat(b, QG, axis=1))


def concat(parts: list[Weights]) -> Weights:
    """Stack matrices along N (fused q|k|v or gate|up). 4-bit parts join 8-bit ones as 8-bit
    values in 0..15 with the same scales, which is exact; K-quant blocks join blocks of their type."""
    if all(isinstance(p, KBlocks) for p in parts):
        if len({p.qtype for p in parts}) != 1 or len({p.shape[1] for p in parts}) != 1:
            raise ValueError("concat of K-quant blocks needs one type and one K")
        return KBlocks(mx.concatenate([p.blocks for p in parts]), parts[0].qtype)
    if len({p.shape[1] for p in parts}) != 1:
        raise ValueError("concat needs the same K for every part")
    bits = max(p.bits for p in parts)
    if all(p.bits == bits for p in parts) and len({p.scales.dtype for p in parts}) == 1:
        return Packed(mx.concatenate([p.q for p in parts]), mx.concatenate([p.scales for p in parts]),
                      mx.concatenate([p.biases for p in parts]), bits)
    vals = np.concatenate([to_values(p) for p in parts])
    sb = [scales_biases(p) for p in parts]
    return from_values(vals, np.concatenate([x[0] for x in sb]), np.concatenate([x[1] for x in sb]), bits)
