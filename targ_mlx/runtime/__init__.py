"""The model runtime: everything that turns a model file into logits, tokens and step statistics.

`backbone` loads a model (GGUF or MLX) behind one interface; `engine` is the seam to what runs it
(MLX's layers or the CPU kernels in `native`); `gguf`, `gguf_blocks`, `repack` read and lay out
quantised weights; `tokenizer` and `sampling` turn logits into tokens with the gate's per-step
statistics; `draft` and `batch` decode (batch 1 and batched). Nothing here knows about gates,
retrieval or prompts: the TARG core (`targ_mlx.gates`, `targ_mlx.runner`, `targ_mlx.retrieval`,
`targ_mlx.prompts`) sits above it, as mlx-lm's `generate.py` sits above its `models/`.
"""

from targ_mlx.runtime._mlx_lm import defer as _defer_mlx_lm

_defer_mlx_lm()  # before any `mlx_lm.models` import below: a GGUF on the kernels never loads torch
