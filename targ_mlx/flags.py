"""Flags shared by `targ ask` and the chat app (`targ-chat`), and the settings they resolve to.

Not an entry point: both front ends import it, so neither has to import the other.
"""

from __future__ import annotations

import argparse

from targ_mlx.config import Config
from targ_mlx.defaults import (
    DEFAULT_HISTORY_TOKENS,
    DEFAULT_K,
    DEFAULT_MAX_TOKENS,
    DEFAULT_READ,
    READ_MODES,
    DEFAULT_REWRITE,
    REWRITE_METHODS,
)
from targ_mlx.gates import GATES
from targ_mlx.retrieval import RETRIEVER_HELP, RETRIEVERS
from targ_mlx.settings import Settings


def add_common_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by `targ ask` and the chat app (`targ-chat`); None means "from config"."""
    p.add_argument("--model", help="alias (qwen2.5-coder-1.5b, the default where installed; smollm2-135m, the "
                                   "small one), .gguf path, MLX folder or mlx-lm repo id")
    p.add_argument("--index", action="append", metavar="DIR",
                   help="index folder; repeat to search several at once, e.g. Wikipedia and your notes "
                        "(default: the offline default index, built on first use)")
    p.add_argument("--retriever", choices=RETRIEVERS, help=RETRIEVER_HELP)
    p.add_argument("--db", help="decision log (default: decisions.db under the user data dir)")
    p.add_argument("--config", help="config TOML (default: config.toml under the user config dir)")
    p.add_argument("--gate", choices=GATES, help="gate (default from config: evidence, which searches first and reads only where it likely helps; the paper's: entropy, margin, variance)")
    p.add_argument("--tau", type=float, help="retrieve iff U > tau (default: calibrated value from config, else a placeholder)")
    p.add_argument("--k", type=int, help=f"draft length in tokens (default {DEFAULT_K})")
    p.add_argument("--max-tokens", type=int, help=f"answer length cap (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--history-tokens", type=int, help="in a chat: tokens of earlier turns kept in the prompt, "
                   f"oldest dropped first (default {DEFAULT_HISTORY_TOKENS})")
    p.add_argument("--rewrite", choices=REWRITE_METHODS, help="in a chat: how a follow-up becomes a standalone "
                   f"search query (default {DEFAULT_REWRITE})")
    p.add_argument("--read", choices=READ_MODES, help="what reading reads: passages (the top K), distinct (the top K "
                   "topics, no article or subject twice), each (the first 3 distinct topics each read on its own, the "
                   "answer chosen by the evidence for it), sentences (the sentences of the top 20 most likely to hold "
                   f"the answer); default {DEFAULT_READ}")
    p.add_argument("--rerank", metavar="NAME|PATH|llm", help="re-order the search's top 20 before reading: a "
                   "sentence-transformers CrossEncoder (Hub id or folder), or llm (the loaded model judges each "
                   "passage; slower); default: off")
    p.add_argument("--draft-route", type=float, metavar="W", help="search question + the closed-book draft too and "
                   "fuse that ranking beside the question's own at weight W (the evidence gate drafts before it "
                   "searches; default 0: off)")
    p.add_argument("--depth-ratio", type=float, metavar="R", help="read only the top-K passages whose similarity is "
                   "at least R x the most similar one's (0 reads all K; default from config, else 0)")


def setting_flags(args: argparse.Namespace) -> dict:
    """The answer settings the flags give (`add_common_args` and ask's own; None: not given)."""
    return dict(tau=args.tau, gate=args.gate, k=args.k, max_tokens=args.max_tokens,
                history_tokens=args.history_tokens, rewrite=args.rewrite, read=getattr(args, "read", None),
                rerank=getattr(args, "rerank", None), draft_route=getattr(args, "draft_route", None), depth_ratio=getattr(args, "depth_ratio", None),
                beta=getattr(args, "beta", None), n_samples=getattr(args, "n_samples", None),
                temperature=getattr(args, "temp", None), seed=getattr(args, "seed", None),
                top_k=getattr(args, "top_k", None), context_tokens=getattr(args, "context_tokens", None),
                recheck_every=getattr(args, "recheck_every", None), prompt_style=getattr(args, "prompt", None))


def settings_from_args(args: argparse.Namespace, cfg: Config, key: str) -> Settings:
    """The answer settings from config + the flags given (`add_common_args` and ask's own)."""
    flags = setting_flags(args)
    return Settings.from_config(cfg, key, tau=flags.pop("tau"), **flags)


def index_folders(flag: list[str] | None, configured: str | None) -> list[str]:
    """The `--index` folders given, else the configured one, else none (the default index)."""
    return flag or ([configured] if configured else [])


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
