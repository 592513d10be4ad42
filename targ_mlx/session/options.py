"""What a face decides before a session opens: the config (the user's file with the flags over it)
and the answer settings it resolves to, failing with one line on a bad value before anything loads;
`open_session` (session.open) loads what they name.
"""

from __future__ import annotations

import argparse
from typing import Literal

from targ_mlx.config import Config, load_config
from targ_mlx.flags import add_common_args  # noqa: F401  (re-exported for the faces)
from targ_mlx.settings import Settings, given

# how the index opens: on the first search (ask, serve: an answer from memory never loads it),
# now (eval), or now with a build of a missing or unfinished index in the background (chat)
IndexWhen = Literal["lazy", "eager", "background"]


def config_from_args(args: argparse.Namespace) -> Config:
    """The config file (`--config`, else the user's) with the flags added by `add_common_args` over it."""
    return load_config(args.config).merged(model=args.model, index=args.index, retriever=args.retriever,
                                           db=args.db, **given(args))


def resolve(cfg: Config) -> Settings:
    """The answer settings `cfg` gives for its model: bad values fail here."""
    from targ_mlx.runtime.model_spec import model_key

    return Settings.from_config(cfg, model_key(cfg.model))
