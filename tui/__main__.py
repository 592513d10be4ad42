"""`python -m tui` / `targ-chat`: the offline chat app. Model and index load inside the app."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from targ_mlx.cli import add_common_args
from targ_mlx.conversation import DEFAULT_HISTORY_TOKENS
from targ_mlx.gates import GATES


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="targ-chat", description="Chat with a local LLM that retrieves only when unsure; "
                                "every decision is shown and logged.")
    add_common_args(p)
    p.add_argument("--new", action="store_true", help="start a new chat instead of reopening the latest one")
    p.add_argument("--history-tokens", type=int, default=DEFAULT_HISTORY_TOKENS,
                   help=f"tokens of earlier turns kept in the prompt, oldest dropped first (default {DEFAULT_HISTORY_TOKENS})")
    return p


def make_loader(cfg, tau: float | None, history_tokens: int = DEFAULT_HISTORY_TOKENS):
    """`loader(progress) -> (Assistant, index label, notice)`: model, then index (built on first run)."""

    def load(progress):
        from targ_mlx.assistant import Assistant, Settings
        from targ_mlx.backbone import load_backbone

        progress(f"loading model {cfg.model}")
        bb = load_backbone(cfg.model)
        t = tau if tau is not None else (cfg.tau_for(bb.model_id, cfg.gate) if cfg.gate in GATES[:3] else None)
        settings = Settings(gate=cfg.gate, tau=t, k=cfg.k, beta=cfg.beta, n_samples=cfg.n_samples,
                            temperature=cfg.temperature, top_k=cfg.top_k, context_tokens=cfg.context_tokens,
                            max_tokens=cfg.max_tokens, history_tokens=history_tokens)
        retriever, index_id = None, None
        try:
            from targ_mlx import index

            folder = Path(cfg.index) if cfg.index else index.default_index_dir()
            if not cfg.index:
                folder = index.ensure_default_index(progress=lambda d, n: progress("building the default index", d, n))
            progress(f"opening index {folder.name}")
            retriever = index.open_retriever(folder)
            progress("loading the query encoder")
            retriever.encoder  # noqa: B018  (load now, not on the first retrieval)
            index_id = retriever.manifest_id
        except Exception as e:  # answer without retrieval rather than not at all
            return Assistant(bb, None, settings, source="chat"), "none", f"answering without retrieval: {e}"
        return Assistant(bb, retriever, settings, source="chat", index_id=index_id), folder.name, ""

    return load


def main(argv: list[str] | None = None) -> int:
    args = setup_arg_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from targ_mlx.config import load_config
    from targ_mlx.decision_log import DecisionLog, DecisionLogError
    from tui.app import make_app

    try:
        cfg = load_config(args.config).merged(model=args.model, gate=args.gate, k=args.k, index=args.index,
                                              db=args.db, max_tokens=args.max_tokens)
        log = DecisionLog(cfg.db)
    except (ValueError, FileNotFoundError, DecisionLogError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    app = make_app(make_loader(cfg, args.tau, args.history_tokens), log=log, config=cfg, config_path=args.config, resume=not args.new)
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
