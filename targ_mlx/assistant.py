"""The name the session had before `targ_mlx.session`: `Assistant` is `Session`."""

from targ_mlx.errors import NoRetrieverError, TargError  # noqa: F401  (re-exported)
from targ_mlx.session.session import DecisionSink, NotScoredError, Session  # noqa: F401
from targ_mlx.settings import Settings  # noqa: F401  (re-exported: Assistant(bb, r, Settings(...)))

Assistant = Session
