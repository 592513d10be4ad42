"""`python -m tui` / `targ-chat`: the offline chat app. The session opens inside the app."""

from __future__ import annotations

import argparse
import sys

from targ_mlx import bind_openblas
from targ_mlx.errors import run_cli
from targ_mlx.session import Config, add_common_args, config_from_args, open_session, resolve


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="targ-chat", description="Chat with a local LLM that retrieves only when unsure; "
                                "every decision is shown and logged.")
    add_common_args(p, "chat")
    p.add_argument("--last", action="store_true", help="reopen the latest chat instead of starting a new one "
                   "(in the app: Ctrl+R)")
    p.add_argument("--new", action="store_true", help="start a new chat (the default)")
    return p


def make_loader(config: Config):
    """`loader(progress) -> Session`: model, then index (built on first run), run in the app's worker.
    The chat's session: a long run; an index still building answers from memory meanwhile."""

    def load(progress):
        return open_session(config, progress, source="chat", long_running=True, index_when="background")

    return load


def main(argv: list[str] | None = None) -> int:
    return run_cli(setup_arg_parser(), _run, argv)


def _run(args: argparse.Namespace) -> int:
    bind_openblas()  # before the first import of mlx.core (the app's session)
    from tui.app import make_app

    config = config_from_args(args)
    resolve(config)  # bad values fail here, before the app starts
    app = make_app(make_loader(config), config_path=args.config, resume=args.last and not args.new)
    if sys.stdin.isatty():
        app.exit_when_terminal_closes(sys.stdin.fileno())
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
