"""`targ serve` / `python -m targ_mlx.server`: load the model once and serve it on loopback.

    targ serve                                  # http://127.0.0.1:8080/v1, the offline defaults
    targ serve --host 0.0.0.0 --api-key KEY     # any other bind needs a key ($TARG_API_KEY too)
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import uuid

from targ_mlx import bind_openblas
from targ_mlx.errors import TargError, run_cli
from targ_mlx.server import DEFAULT_QUEUE
from targ_mlx.session import add_common_args, config_from_args, open_session

API_KEY_ENV = "TARG_API_KEY"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


class BindError(TargError):
    """A non-loopback bind without an API key."""


def add_serve_args(p: argparse.ArgumentParser) -> None:
    add_common_args(p, "serve")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' on every route but /health (default "
                                     f"${API_KEY_ENV}; required for a non-loopback --host)")
    p.add_argument("--queue", type=int, default=DEFAULT_QUEUE,
                   help=f"requests that may wait while one is answered; more get 503 (default {DEFAULT_QUEUE})")


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="targ serve", description=__doc__.splitlines()[0])
    add_serve_args(p)
    return p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key_for(host: str, given: str | None) -> str | None:
    """The key to require: the flag, else the environment; refused when a non-loopback bind has none."""
    key = given or os.environ.get(API_KEY_ENV) or None
    if key is None and not is_loopback(host):
        raise BindError(f"--host {host} is reachable from other machines: pass --api-key KEY (or set ${API_KEY_ENV}), "
                        f"or bind {DEFAULT_HOST}")
    return key


def build(args: argparse.Namespace):
    """(the ASGI app, the served model's name) from parsed flags: the session `targ ask` opens."""
    bind_openblas()  # before the session loads mlx.core
    from targ_mlx.server.app import make_app

    # a server decodes for hours (2 MB pages now); the log's schema knows the sources chat, eval,
    # ask: a served answer is an ask, its session says serve
    session = open_session(config_from_args(args), long_running=True)
    session.attach(session="serve-" + uuid.uuid4().hex[:8])
    return make_app(session, session.model_id, args.api_key, args.queue), session.model_id


def serve(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise BindError(f"--port must be in 1..65535; got {args.port}")
    if args.queue < 1:
        raise BindError(f"--queue must be >= 1; got {args.queue}")
    args.api_key = api_key_for(args.host, args.api_key)
    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as e:  # an optional extra: every other command works without it
        raise TargError(f"targ serve needs the serve extra ({e.name} is not installed): pip install -e '.[serve]'") from None

    app, name = build(args)
    print(f"serving {name} on http://{args.host}:{args.port}/v1 (OpenAI-compatible; GET /health)", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def main(argv: list[str] | None = None) -> int:
    bind_openblas()  # first: serving loads mlx.core
    return run_cli(setup_arg_parser(), serve, argv)


if __name__ == "__main__":
    sys.exit(main())
