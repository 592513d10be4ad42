"""What the runner's answer-form guard (`reader.fits_form`) would do on eval records.

In the apps a read answer that gives no time to a *when* question (no number to a *how many* one)
gives way to the gate's draft where the draft finished with one (`runner._kept_draft`). The eval
records both answers of every question: the Always answer (read) and the closed-book one (whose
first k tokens are the draft). For each cell: how often the guard fires (the closed-book answer
finished within k tokens) and how many answers it would make right or wrong, with a paired 95%
bootstrap interval of the Always branch's accuracy.

    python scripts/analysis/answer_form.py results/*/*/*/records.jsonl
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from targ_mlx.eval.sweep import paired_ci
from targ_mlx.reader import fits_form


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+")
    ap.add_argument("--k", type=int, default=20, help="draft length: the guard needs a draft that finished")
    args = ap.parse_args()
    for path in args.records:
        with open(path, encoding="utf-8") as f:
            recs = [r for r in map(json.loads, f) if r.get("always") and r.get("never")]
        before, after, fired = [], [], 0
        for r in recs:
            q, read, memory = r["question"], r["always"], r["never"]
            keep = memory["tok_out"] < args.k and fits_form(q, memory["answer"]) and not fits_form(q, read["answer"])
            fired += keep
            before.append(read["acc"])
            after.append(memory["acc"] if keep else read["acc"])
        b, a = np.array(before), np.array(after)
        d, lo, hi = paired_ci(a, b)
        print(f"{path}: {len(recs)} questions, fires on {fired}, right {int((a > b).sum())}, wrong {int((a < b).sum())}, "
              f"Always {100 * b.mean():.1f} -> {100 * a.mean():.1f} ({100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}])")


if __name__ == "__main__":
    main()
