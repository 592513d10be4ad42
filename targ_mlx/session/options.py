"""`Options`: everything a front end decides before a session opens, as one frozen value.

Where things are (model, index folders, log, config file), how the index opens, and the explicit
setting overrides (a flag given; None = from the config file). `resolve` turns them, with the
config file, into the answer `Settings` and fails with one line on a bad value before anything
loads; `open_session` (session.open) loads what they name.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Mapping

from targ_mlx.config import Config, load_config
from targ_mlx.errors import QuestionError, check_text
from targ_mlx.flags import add_common_args  # noqa: F401  (re-exported for the faces)
from targ_mlx.settings import Settings, given

# how the index opens: on the first search (ask, serve: an answer from memory never loads it),
# now (eval), or now with a build of a missing or unfinished index in the background (chat)
IndexWhen = Literal["lazy", "eager", "background"]


@dataclass(frozen=True)
class Options:
    model: str | None = None  # alias, .gguf, MLX folder or repo id; None: the config's / the default
    index: tuple[str, ...] = ()  # index folders; () the configured one, else the default index
    retriever: str | None = None  # dense, bm25 or hybrid; None: each index's default
    db: str | None = None  # decision log; None: the config's
    config: str | None = None  # config TOML; None: the user's
    log: bool = True  # write the decision log (and the chat's transcript)
    source: str = "ask"  # the log's source: ask, chat or eval
    chat: str | None = None  # continue this saved chat (its turns go into every prompt)
    long_running: bool = False  # a chat, a server or an eval: the model's weights on 2 MB pages now
    index_when: IndexWhen = "lazy"
    quiet: bool = False  # no progress bar while an index builds
    settings: Mapping[str, Any] = field(default_factory=dict)  # explicit overrides of Settings' fields

    def __post_init__(self):
        object.__setattr__(self, "index", tuple(self.index or ()))
        object.__setattr__(self, "settings", MappingProxyType({k: v for k, v in dict(self.settings).items()
                                                                if v is not None}))
        for flag in ("model", "db", "config", "chat"):
            value = getattr(self, flag)
            if value is not None:
                check_text(value, f"--{flag} {value!r}")
        for folder in self.index:
            check_text(folder, f"--index {folder!r}")
        if self.chat and not self.log:
            raise QuestionError("--chat continues a chat saved in the decision log; drop --no-log")

    @classmethod
    def from_args(cls, args: argparse.Namespace, **kw: Any) -> Options:
        """From flags added by `add_common_args` (and `targ ask`'s own); `kw` sets the rest."""
        return cls(model=args.model, index=tuple(args.index or ()), retriever=args.retriever, db=args.db,
                   config=args.config, settings=given(args), **kw)

    def resolve(self) -> tuple[Config, Settings]:
        """(the config with this model and log, the answer settings): bad values fail here."""
        from targ_mlx.runtime.model_spec import model_key

        cfg = load_config(self.config).merged(model=self.model, db=self.db)
        over = dict(self.settings)
        return cfg, Settings.from_config(cfg, model_key(cfg.model), tau=over.pop("tau", None), **over)

    @property
    def huge_pages(self) -> str:
        """The weights' page policy: a long run gains from 2 MB pages at once (`runtime.native.pages`)."""
        return "collapse" if self.long_running else "advise"
