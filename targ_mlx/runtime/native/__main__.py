"""python -m targ_mlx.runtime.native build|info: build the CPU kernels now, or say where they stand."""

from __future__ import annotations

import argparse
import sys



def setup_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m targ_mlx.runtime.native", description=__doc__)
    ap.add_argument("command", choices=("build", "info"))
    ap.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    ap.add_argument("--remeasure", action="store_true",
                    help="info: time the kernels against MLX's own layers again (the choice is saved per build)")
    return ap


def main(argv: list[str] | None = None) -> int:
    from targ_mlx.errors import run_cli
    from targ_mlx.runtime.native.build import BuildError

    return run_cli(setup_arg_parser(), _run, argv, errors=(BuildError,))


def _run(args: argparse.Namespace) -> int:
    from targ_mlx import bind_openblas

    bind_openblas()  # before the first import of mlx.core
    from targ_mlx.runtime import native
    from targ_mlx.runtime.native.build import build, module_path

    if args.command == "build":
        if not native.wanted():
            print("targ_mlx.runtime.native: not needed here (MLX has a GPU, or TARG_MLX_NATIVE=0); nothing built")
            return 0
        print(build(force=args.force))
        native.ops()  # times the kernels against MLX's own layers now, not at the first question
        print(f"kernels: {native.status()}")
        return 0
    if args.remeasure:
        from targ_mlx.runtime.native.choice import choice_path

        mod = native.module()
        if mod is not None:
            choice_path(mod).unlink(missing_ok=True)
    native.ops()
    print(f"kernels: {native.status()}\nmodule: {module_path()}")
    if native.module() is not None:  # which K-quant forms and kernels this process's flags pick
        print(f"K-quant forms: Q4_K tiles in the {native.q4k_layout()} layout; Q6_K in {native.q6k_layout()}"
              f" ({native.q6k_kernel()} row kernel)")
        print(f"AMX tiles: {native.module().amx_status()}")
        bf16 = "yes: the encoder's mlx-bf16" if native.module().bf16_products() else f"no ({native.module().simd()} build)"
        print(f"bfloat16 products (AVX512-BF16): {bf16}")
        tiles = native.module().prompt_attention_tiles(128)
        print(f"a prompt's attention: {'AMX-BF16 tiles (TARG_MLX_ATTN_BF16=0: float32)' if tiles else 'float32'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
