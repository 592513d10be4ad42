"""Render a model's chat template compiled for every prompt (as the tokenizer once did) against the
compiled template cached once per process (`tokenizer._compiled_template`), side by side.

    python scripts/bench/bench_chat_template.py [--model smollm2-135m] [--n 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import time

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads
from targ_mlx.runtime.backbone import load_backbone  # noqa: E402
from targ_mlx.runtime.tokenizer import _compiled_template  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=200, help="prompts rendered per round and way")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    tok = load_backbone(args.model).tokenizer
    msgs = [{"role": "user", "content": "who wrote the origin of species " + "[Title] some text " * 50}]
    kw = dict(messages=msgs, bos_token="", eos_token="", add_generation_prompt=True)
    for _ in range(args.rounds):
        t = time.perf_counter()
        for _ in range(args.n):
            _compiled_template.__wrapped__(tok.template).render(**kw)
        each = (time.perf_counter() - t) / args.n
        t = time.perf_counter()
        for _ in range(args.n):
            _compiled_template(tok.template).render(**kw)
        cached = (time.perf_counter() - t) / args.n
        print(f"compiled for every prompt {each * 1e3:.2f} ms, cached {cached * 1e3:.3f} ms ({each / cached:.0f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
