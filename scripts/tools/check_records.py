"""Re-record the first batch of a committed eval run and compare it field by field.

    python scripts/tools/check_records.py results/smollm2-135m/seeded/nq_open [--batch-size 8]

The committed records.jsonl were written by an earlier version of the code; this checks that
today's pipeline gives the same records bit for bit. The index those runs used may not be on
this machine, so the retrieval-dependent fields (the Always branch, the CRAG-lite probe, the scores
of gates that need the search) are re-recorded without passages and left out of the comparison;
everything else must be equal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads
from targ_mlx.runtime.backbone import load_backbone  # noqa: E402
from targ_mlx.eval.datasets import QAItem  # noqa: E402
from targ_mlx.eval.record import EvalSettings, record_batch  # noqa: E402
from targ_mlx.eval.run import read_jsonl  # noqa: E402
from targ_mlx.gates import draft_only_names  # noqa: E402

COMPARED = ("id", "question", "answers", "tok_prompt", "draft", "entropies", "gaps", "logprobs", "samples",
            "scores", "never", "batch")
PROBES = ("p_need", "p_supported")  # p_relevant grades retrieved passages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args(argv)
    config = json.loads((args.run_dir / "config.json").read_text(encoding="utf-8"))
    s = EvalSettings.from_dict(config["settings"])
    want = read_jsonl(args.run_dir / "records.jsonl")[: args.batch_size]
    items = [QAItem(r["id"], r["question"], r["answers"]) for r in want]
    bb = load_backbone(config.get("model") or "smollm2-135m")
    got = [r.to_dict() for r in record_batch(bb, None, items, s, batch_no=0, found=[[] for _ in items])]
    compared = COMPARED
    if args.batch_size != config["args"].get("batch_size", args.batch_size):
        # another batch draws other uniforms for the sampled rows; greedy rows do not depend on it
        compared = tuple(f for f in COMPARED if f != "samples")
        for r in want + got:
            r["scores"].pop("variance", None)
    # gates that read the search (evidence) score from passages this check does not retrieve
    searchless = set(draft_only_names())
    for r in want + got:
        r["scores"] = {n: v for n, v in r["scores"].items() if n in searchless}
    bad = 0
    for w, g in zip(want, got):
        diff = [f for f in compared if w[f] != g[f]] + [f"probes.{p}" for p in PROBES
                                                       if w["probes"].get(p) != g["probes"].get(p)]
        bad += bool(diff)
        print(f"{w['id']}: {'same' if not diff else 'DIFFERENT: ' + ', '.join(diff)}")
    print(f"{len(want) - bad}/{len(want)} records identical in {', '.join(compared + PROBES)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
