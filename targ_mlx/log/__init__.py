"""The decision log: one SQLite file that every front end writes and `targ-calibrate` reads.

  store.py             the file: one connection, WAL, retries on a busy file, schema migrations
  decisions.py         `DecisionLog`: the decisions and feedback tables (what a gate decided, and why)
  transcript.py        the chat app's messages, linked to the decision behind each answer

Nothing here imports a model or the index; what calibration reads back from it (each row's score
and its labels) is `targ_mlx.calibration.rows`.
"""
