"""`targ serve`: an OpenAI-compatible local API over the gated assistant (`app.py`, wire format in
`api.py`). Needs the `serve` extra (starlette, uvicorn)."""

DEFAULT_QUEUE = 8  # requests waiting beside the one being answered (here: `targ ask`'s parser reads it without starlette)
