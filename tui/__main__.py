"""`python -m tui` / `targ-chat`: the offline chat app. Model and index load inside the app."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from targ_mlx.flags import add_common_args, index_folders, settings_from_args


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="targ-chat", description="Chat with a local LLM that retrieves only when unsure; "
                                "every decision is shown and logged.")
    add_common_args(p)
    p.add_argument("--new", action="store_true", help="start a new chat instead of reopening the latest one")
    return p


def _open_loaded(folders: list[Path], retriever_mode: str | None = None):
    """Open indexes and load their query encoders now, not on the first retrieval."""
    from targ_mlx.index import open_indexes

    retriever = open_indexes(folders, retriever=retriever_mode)
    for part in getattr(retriever, "parts", [retriever]):  # indexes built with other encoders
        part.encoder  # noqa: B018
    return retriever


def make_loader(cfg, settings, folders: list[str] | None = None, retriever_mode: str | None = None):
    """`loader(progress) -> (Assistant, index label, notice)`: model, then index (built on first run)."""

    def load(progress):
        from targ_mlx.assistant import Assistant
        from targ_mlx.index.background import BuildingIndex
        from targ_mlx.runtime.backbone import load_backbone

        progress(f"loading model {cfg.model}")
        bb = load_backbone(cfg.model, huge_pages="collapse")  # a chat runs long: 2 MB pages now
        retriever, index_id = None, None
        try:
            from targ_mlx import index

            paths = [Path(f) for f in folders or index_folders(None, cfg.index)]
            if (not paths and not (index.default_index_dir() / "manifest.json").is_file()) or any(
                    map(index.unfinished, paths)):
                # answer at once; questions the gate retrieves for skip retrieval until it is built
                # (an interrupted build of a named --index is resumed the same way)
                building = BuildingIndex(lambda cb: [index.ensure_index(p, cb) for p in paths or [None]],
                                         lambda paths: _open_loaded(paths, retriever_mode),
                                         lambda d, n: progress(f"index building {100 * d / max(n, 1):.0f}%", d, n))
                label = " + ".join(p.name for p in paths) or index.DEFAULT_INDEX_NAME
                return (Assistant(bb, building, settings, source="chat"), label,
                        f"the index {label} is building: answers skip retrieval until it is ready")
            # built: a no-op, but an index built before BM25 parts existed gains one (seconds)
            paths = paths or [index.ensure_default_index()]
            label = " + ".join(p.name for p in paths)
            progress(f"opening index {label} and its query encoder")
            retriever = _open_loaded(paths, retriever_mode)
            index_id = retriever.manifest_id
        except Exception as e:  # answer without retrieval rather than not at all
            return Assistant(bb, None, settings, source="chat"), "none", f"answering without retrieval: {e}"
        return Assistant(bb, retriever, settings, source="chat", index_id=index_id), label, ""

    return load


def main(argv: list[str] | None = None) -> int:
    from targ_mlx.errors import run_cli

    return run_cli(setup_arg_parser(), _run, argv)


def _run(args: argparse.Namespace) -> int:
    from targ_mlx import bind_openblas

    bind_openblas()  # before the first import of mlx.core (the app's assistant)
    from targ_mlx.config import load_config
    from targ_mlx.log.decisions import DecisionLog
    from targ_mlx.runtime.model_spec import model_key
    from tui.app import make_app

    cfg = load_config(args.config).merged(model=args.model, db=args.db)
    settings = settings_from_args(args, cfg, model_key(cfg.model))  # fails before the model loads
    log = DecisionLog(cfg.db)
    app = make_app(make_loader(cfg, settings, args.index, args.retriever), log=log, config=cfg, config_path=args.config,
                   resume=not args.new)
    if sys.stdin.isatty():
        app.exit_when_terminal_closes(sys.stdin.fileno())
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
