"""targ-chat: the Textual chat app over `targ_mlx.assistant`. Imports targ_mlx, never the reverse.

The app is imported on first use of `tui.ChatApp` / `tui.make_app`, not with the package: the
app loads MLX, and `targ-chat` (`tui.__main__`) must bind OpenBLAS before anything imports
`mlx.core` (`targ_mlx.bind_openblas`), or MLX's CPU matmuls run on the reference BLAS.
"""

__all__ = ["ChatApp", "make_app"]


def __getattr__(name: str):
    if name in __all__:
        from tui import app

        return getattr(app, name)
    raise AttributeError(f"module 'tui' has no attribute {name!r}")
