"""Log the gate scores the assistant's own prompt gives on real questions, to ship a tau per model.

Each question goes through `Assistant.answer` exactly as `targ ask` and the chat app run it
(their prompt, k, beta, N, T), by default with the variance gate so one draft yields all three
scores, and tau above any U so nothing is retrieved and only the k-token draft is decoded. The rows land in
a decision log; `targ-calibrate --budget RHO` then gives tau per gate:

    python scripts/analysis/draft_scores.py --n 200 --db runs/draft-scores.db
    python -m targ_mlx.calibration --db runs/draft-scores.db --gate margin --budget 0.3
"""

from __future__ import annotations

import argparse
import json
import os
import random

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

from targ_mlx.assistant import Assistant, Settings
from targ_mlx.log.decisions import DecisionLog
from targ_mlx.runtime.backbone import load_backbone

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "qa", "nq_open_dev.jsonl")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-file", default=DATA)
    ap.add_argument("--n", type=int, default=200, help="seeded sample of questions (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--db", required=True, help="decision log the scores go to")
    ap.add_argument("--gate", choices=("variance", "margin"), default="variance",
                    help="variance: all three scores per draft; margin: entropy and margin only, ~N+1 times "
                         "less decoding (default variance)")
    args = ap.parse_args(argv)
    with open(args.data_file) as f:
        questions = [json.loads(line)["question"] for line in f]
    questions = random.Random(args.seed).sample(questions, min(args.n, len(questions)))
    defaults = Settings()  # the assistant's own prompt and draft settings
    settings = Settings(gate=args.gate, tau=2.0, max_tokens=defaults.k)  # U < 2 for both: never retrieves
    with DecisionLog(args.db) as log:
        a = Assistant(load_backbone(args.model), None, settings, log=log, source="eval", session="draft-scores")
        for i, q in enumerate(questions, 1):
            a.answer(q)
            if i % 20 == 0:
                print(f"{i}/{len(questions)}", flush=True)
    print(f"prompt {defaults.prompt_style}, k {defaults.k}: {len(questions)} rows in {args.db}")


if __name__ == "__main__":
    main()
