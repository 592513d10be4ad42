"""The decision log: one SQLite file that every front end writes and `targ-calibrate` reads.

  store.py             the file: one connection, WAL, retries on a busy file, schema migrations
  decisions.py         `DecisionLog`: the decisions and feedback tables (what a gate decided, and why)
  transcript.py        the chat app's messages, linked to the decision behind each answer
  calibration_rows.py  what threshold calibration reads back: each row's score and its labels

Nothing here imports a model or the index; the threshold maths it feeds is `targ_mlx.calibration`.
"""
