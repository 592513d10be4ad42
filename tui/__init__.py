"""targ-chat: the Textual chat app over `targ_mlx.assistant`. Imports targ_mlx, never the reverse."""

from tui.app import ChatApp, make_app

__all__ = ["ChatApp", "make_app"]
