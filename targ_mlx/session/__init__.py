"""The one front door: `open_session(config)` loads the model, the index, the log and the
gate's settings once, and returns a `Session` whose `ask(question)` yields the runner's events;
`DecisionView` is what a face shows of a decision, live or logged.

    session = open_session(load_config().merged(model="smollm2-135m", index=("index/notes",)))
    for event in session.ask("who painted the mona lisa"):
        ...  # Drafted, Searched, Decided, Text (cumulative answer), Done(answer)

`targ ask`, `targ serve`, the chat app and the eval import this package and the small shared
vocabulary (`targ_mlx.records`, `errors`, `defaults`, `gates`) only. Names load on first use, so
importing the package (to parse flags) loads no model runtime.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same names as type checkers, farm-studio and readers see them; at run time
    # they load on first use (`__getattr__` below), so parsing flags loads no model runtime
    from targ_mlx.config import Config, default_model, load_config
    import targ_mlx.index.named as named_index
    from targ_mlx.log.decisions import LABELS, UnknownDecisionError
    from targ_mlx.runner import Decided, Done, Drafted, Event, Searched, Text
    from targ_mlx.runtime.model_spec import model_key
    from targ_mlx.session.feedback import label_decision
    from targ_mlx.session.open import open_session
    from targ_mlx.session.options import IndexWhen, add_common_args, config_from_args, resolve
    from targ_mlx.session.session import NotScoredError, Session, new_chat_id
    from targ_mlx.session.view import DecisionView
    from targ_mlx.settings import Settings, add_flags, flag_fields, given

_WHERE = {
    "IndexWhen": "options", "add_common_args": "options", "config_from_args": "options", "resolve": "options",
    "open_session": "open",
    "Session": "session", "NotScoredError": "session", "new_chat_id": "session",
    "DecisionView": "view",
    "Drafted": "events", "Searched": "events", "Decided": "events", "Text": "events", "Done": "events",
    "Event": "events",
    "Settings": "settings", "add_flags": "settings", "flag_fields": "settings", "given": "settings",
    "default_model": "config", "load_config": "config", "Config": "config", "model_key": "model_spec",
    "label_decision": "feedback", "LABELS": "decisions", "UnknownDecisionError": "decisions",
    "named_index": "named",  # the module: what `/index get NAME` builds, where, and the build itself
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'targ_mlx.session' has no attribute {name!r}")
    if where == "events":
        return getattr(import_module("targ_mlx.runner"), name)
    if where in ("settings", "config"):
        return getattr(import_module(f"targ_mlx.{where}"), name)
    if where == "named":
        return import_module("targ_mlx.index.named")
    if where == "decisions":
        return getattr(import_module("targ_mlx.log.decisions"), name)
    if where == "model_spec":
        return getattr(import_module("targ_mlx.runtime.model_spec"), name)
    return getattr(import_module(f"targ_mlx.session.{where}"), name)
