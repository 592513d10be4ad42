"""`targ serve`: an OpenAI-compatible local API over the gated assistant (`app.py`, wire format in
`api.py`). Needs the `serve` extra (starlette, uvicorn)."""
