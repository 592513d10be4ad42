"""A stand-in GGUF for timing a model where its file cannot travel (a lent machine that can be sent
only ~64 MB): the real file's header (metadata, vocabulary, chat template, tensor table) and random
blocks with sane fp16 scales in place of the weights. Layout, block types and size are the real
file's byte for byte, so the kernels and llama.cpp do exactly the work they do on it; the answers
are noise, so it is for speed only.

    python scripts/device/synth_gguf.py head MODEL.gguf OUT.head     # the 1.5B's head is 5.9 MB
    python scripts/device/synth_gguf.py fill OUT.head SYNTH.gguf     # writes the full-size file
"""

from __future__ import annotations

import argparse
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES

# Where each block type keeps its fp16 scale(s), and a size for each that keeps weights near
# |0.05|, as trained ones are (random bytes there could be inf or NaN, or denormals that slow
# float math down and would time something the real file never does).
SCALES = {
    Q.Q4_0: [(0, 6e-3)], Q.Q4_1: [(0, 6e-3), (2, -0.05)], Q.Q5_0: [(0, 3e-3)], Q.Q5_1: [(0, 3e-3), (2, -0.05)],
    Q.Q8_0: [(0, 4e-4)], Q.Q4_K: [(0, 2e-4), (2, 2e-4)], Q.Q5_K: [(0, 1e-4), (2, 1e-4)], Q.Q6_K: [(208, 2e-5)],
}


def head(src: str, out: str) -> None:
    """The bytes before the tensor data, then the full file's size as 8 bytes."""
    reader = GGUFReader(src)
    size = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)  # the end of the last tensor
    with open(src, "rb") as f, open(out, "wb") as g:
        g.write(f.read(reader.data_offset))
        g.write(struct.pack("<Q", size))


def fill(head_path: str, out: str, seed: int = 0) -> None:
    data = open(head_path, "rb").read()
    prefix, size = data[:-8], struct.unpack("<Q", data[-8:])[0]
    with open(out, "wb") as g:
        g.write(prefix)
        g.truncate(size)
    rng = np.random.default_rng(seed)
    for t in GGUFReader(out, "r+").tensors:
        qt = t.tensor_type
        if qt == Q.F32 or qt == Q.F16:  # norms at 1, biases and float matrices small
            is_norm = t.name.endswith("norm.weight")
            t.data[...] = 1.0 if is_norm else rng.standard_normal(t.data.shape).astype(t.data.dtype) * 0.02
            continue
        if qt not in SCALES:
            sys.exit(f"synth_gguf: block type {qt.name} of {t.name} has no scale layout here; add it to SCALES")
        blocks = t.data.reshape(-1, GGML_QUANT_SIZES[qt][1])
        blocks[...] = rng.integers(0, 256, blocks.shape, dtype=np.uint8)
        for off, scale in SCALES[qt]:
            d = (rng.uniform(0.5, 1.5, (blocks.shape[0], 1)) * scale).astype(np.float16)
            blocks[:, off : off + 2] = d.view(np.uint8)
    print(f"{out}: {size:,} bytes")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("head", help="save a GGUF's header and size")
    h.add_argument("model")
    h.add_argument("out")
    f = sub.add_parser("fill", help="write a full-size file from a saved header")
    f.add_argument("head")
    f.add_argument("out")
    f.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    head(args.model, args.out) if args.cmd == "head" else fill(args.head, args.out, args.seed)


if __name__ == "__main__":
    main()
