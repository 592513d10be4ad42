"""Calibration: the gates' thresholds and the evidence gate's fits, from records, labels and the log.

  thresholds.py  tau for a budget or for accuracy, a text histogram, isotonic fits: numbers in, out
  rows.py        what calibration reads back from the decision log: each row's score and its labels
  evidence.py    the evidence gate's two isotonic calibrations and tau, fitted from recorded questions
  refit.py       the same calibrations refitted from the user's labels in the decision log
  fit.py         `targ-calibrate fit`: record a model's questions, fit, write the user's config
  cli.py         `targ-calibrate` (`python -m targ_mlx.calibration`): tau from the log; fit and refit

Nothing is imported here, so the gates can take `thresholds` without the log or the model.
"""
