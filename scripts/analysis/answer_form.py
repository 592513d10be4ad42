"""What the runner's answer-form guard (`reader.fits_form`) would do on eval records.

In the apps a read answer that gives no time to a *when* question (no number to a *how many* one)
gives way to the gate's draft where the draft's k tokens give one; the draft is continued to its
end (`runner._kept_draft`). The eval records both answers of every question: the Always answer
(read) and the closed-book one (the draft continued), and the draft's tokens. For each cell (the
model's tokenizer from the cell's config.json): how often the guard fires and how many answers it
would make right or wrong, with a paired 95% bootstrap interval of the Always branch's accuracy.

    python scripts/analysis/answer_form.py results/*/*/*/records.jsonl
"""

from __future__ import annotations

import argparse
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from targ_mlx.eval.sweep import paired_ci
from targ_mlx.reader import fits_form
from targ_mlx.runtime.backbone import load_backbone


@lru_cache(maxsize=None)
def _tokenizer(model: str):
    return load_backbone(model).tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+")
    ap.add_argument("--k", type=int, default=20, help="draft length (the apps' k)")
    args = ap.parse_args()
    for path in args.records:
        with open(path, encoding="utf-8") as f:
            recs = [r for r in map(json.loads, f) if r.get("always") and r.get("never")]
        tok = _tokenizer(json.loads((Path(path).parent / "config.json").read_text())["model"])
        before, after, fired = [], [], 0
        for r in recs:
            q, read, memory = r["question"], r["always"], r["never"]
            drafted = tok.decode([t for t in r["draft"][: args.k] if t not in tok.eos_ids])
            keep = fits_form(q, drafted) and not fits_form(q, read["answer"])
            fired += keep
            before.append(read["acc"])
            after.append(memory["acc"] if keep else read["acc"])
        b, a = np.array(before), np.array(after)
        d, lo, hi = paired_ci(a, b)
        print(f"{path}: {len(recs)} questions, fires on {fired}, right {int((a > b).sum())}, wrong {int((a < b).sum())}, "
              f"Always {100 * b.mean():.1f} -> {100 * a.mean():.1f} ({100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}])")


if __name__ == "__main__":
    main()
