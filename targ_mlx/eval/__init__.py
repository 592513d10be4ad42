"""`python -m targ_mlx.eval`: the paper's evaluation in one command; every operating point priced
from one pass per question (record.py), swept without the model (sweep.py, baselines.py), and
written as tables and plots (report.py, plots.py).
"""


def main(argv: list[str] | None = None) -> int:
    from targ_mlx.eval.__main__ import main as _main

    return _main(argv)
