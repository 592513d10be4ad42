"""Flags shared by `targ ask`, the chat app (`targ-chat`) and `targ serve`.

Not an entry point: the front ends import it, so none has to import another.
"""

from __future__ import annotations

import argparse

from targ_mlx.retrieval import RETRIEVER_HELP, RETRIEVERS
from targ_mlx.settings import add_flags


def add_common_args(p: argparse.ArgumentParser, face: str) -> None:
    """Where things are, and one flag per answer setting (`settings.add_flags`), for ask, chat or
    serve (`face`); None means "from the config file"."""
    p.add_argument("--model", help="alias (qwen2.5-coder-1.5b, the default where installed; smollm2-135m, the "
                                   "small one), .gguf path, MLX folder or mlx-lm repo id")
    p.add_argument("--index", action="append", metavar="DIR",
                   help="index folder; repeat to search several at once, e.g. Wikipedia and your notes "
                        "(default: the offline default index, built on first use)")
    p.add_argument("--retriever", choices=RETRIEVERS, help=RETRIEVER_HELP)
    p.add_argument("--db", help="decision log (default: decisions.db under the user data dir)")
    p.add_argument("--config", help="config TOML (default: config.toml under the user config dir); its values "
                                    "apply where a flag is not given")
    add_flags(p, face)


def open_index(paths: list[str], retriever: str | None = None, quiet: bool = False):
    """A zero-argument loader for the retriever, so answers that skip retrieval never load it
    (the lazy index policy of `targ_mlx.session.open_session`).

    `retriever`: dense, bm25 or hybrid (None: `retriever_mode`'s choice: bm25 on BM25-only indexes,
    hybrid on big ones with both parts, else dense). `quiet`: no progress bar while a build runs."""

    def load():
        from targ_mlx import index
        from targ_mlx.index.progress import ProgressBar

        bar = None if quiet else ProgressBar()  # resumes an unfinished build of each index named, or builds the default
        return index.open_indexes([index.ensure_index(p, bar) for p in paths or [None]], retriever=retriever)

    return load
