"""Write a GGUF model as an MLX folder offline, the way mlx-community's 4-bit repos are made.

The GGUF is dequantized (gguf-py) and written as a Hugging Face-style float16 folder
(model.safetensors, config.json, tokenizer.json, tokenizer_config.json), then
`mlx_lm.convert -q` quantizes it (4 bits, groups of 64 unless told otherwise):

    python scripts/tools/gguf_to_mlx.py qwen2.5-coder-1.5b /tmp/qwen15b-mlx-4bit
    python -m targ_mlx.cli ask "who wrote hamlet" --model /tmp/qwen15b-mlx-4bit
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads: importing targ_mlx alone binds nothing
import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from targ_mlx.runtime.backbone import ALIASES, alias_path
from targ_mlx.runtime.gguf import load_gguf
from targ_mlx.runtime.tokenizer import tokenizer_from_gguf


def write_tokenizer(tok, out: Path) -> None:
    """tokenizer.json and tokenizer_config.json (with the chat template) for mlx_lm.load."""
    tok._tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tok.bos, "eos_token": tok.eos,
        "chat_template": tok.template, "add_bos_token": False,
    }))


def write_dense_folder(gguf_path: str, out: Path) -> None:
    g = load_gguf(gguf_path, dtype="float16")
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(g.model.parameters())))
    args = {k: v for k, v in vars(g.model.args).items() if v is not None}
    (out / "config.json").write_text(json.dumps(args))
    write_tokenizer(tokenizer_from_gguf(g.metadata, gguf_path), out)


def convert(gguf_path: str, out: Path, bits: int = 4, group_size: int = 64) -> Path:
    from mlx_lm.convert import convert as mlx_convert

    dense = Path(tempfile.mkdtemp(prefix="gguf-dense-"))
    try:
        write_dense_folder(gguf_path, dense)
        if out.exists():
            shutil.rmtree(out)
        mlx_convert(str(dense), str(out), quantize=True, q_bits=bits, q_group_size=group_size)
    finally:
        shutil.rmtree(dense, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="alias or .gguf path")
    ap.add_argument("out", type=Path, help="the MLX folder to write (replaced if it exists)")
    ap.add_argument("--q-bits", type=int, default=4)
    ap.add_argument("--q-group-size", type=int, default=64)
    args = ap.parse_args(argv)
    path = alias_path(args.model) if args.model in ALIASES else args.model
    convert(path, args.out, args.q_bits, args.q_group_size)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
