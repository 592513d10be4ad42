"""Seconds an answer's decoding takes with prompt lookup against one token a step, side by side in
one process (issue 58, deliver 4: the draft's time; and every answer's decode).

Each question is asked through the one answer runner (`targ ask`'s path) with the apps' settings,
once with `TARG_MLX_LOOKUP=1` and once with `=0`, the order alternating per question so drift on a
shared machine cancels. Reports the median seconds of the draft, the answer's decode and the
total each way, the ratios of the summed seconds, and whether every answer, draft statistic,
decision and passage list was the same both ways (it must be: the guesses are verified).

    python scripts/bench/bench_lookup.py --index index/large-bm25 --model qwen2.5-coder-1.5b --n 12
    python scripts/bench/bench_lookup.py --index index/large-bm25 --gate always --n 12
"""

from __future__ import annotations

import os
import statistics

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

from targ_mlx.runtime import lookup  # noqa: E402
from answer_bench import apps_assistant, parser, questions as held_out, report  # noqa: E402

WAYS = ("step", "lookup")


def main(argv=None):
    ap = parser(__doc__.splitlines()[0], n=12)
    ap.add_argument("--gate", default=None, help="default: the apps' evidence gate")
    args = ap.parse_args(argv)
    questions = held_out(args)
    ask = apps_assistant(args, questions)
    parts = {w: {"draft": [], "decode": [], "total": []} for w in WAYS}
    tokens = {w: 0 for w in WAYS}
    same = reads = 0
    for i, q in enumerate(questions):
        got = {}
        for w in (WAYS if i % 2 == 0 else WAYS[::-1]):
            os.environ[lookup.ENV] = "1" if w == "lookup" else "0"
            a = ask.answer(q)
            got[w] = (a.answer, a.retrieved, a.score, a.scores, a.passages)
            for k in parts[w]:
                parts[w][k].append(getattr(a.latency, k))
            tokens[w] += a.tokens.draft + a.tokens.output
        same += got["step"] == got["lookup"]
        reads += got["lookup"][1]
    os.environ.pop(lookup.ENV, None)
    total = {w: {k: sum(v) for k, v in p.items()} for w, p in parts.items()}
    report(args, len(questions), gate=ask.settings.gate, read=reads, draft_and_answer_tokens=tokens["lookup"],
           median_s={w: {k: round(statistics.median(v), 3) for k, v in p.items()} for w, p in parts.items()},
           sum_s={w: {k: round(v, 2) for k, v in t.items()} for w, t in total.items()},
           lookup_over_step={k: round(total["lookup"][k] / total["step"][k], 3) if total["step"][k] else None
                             for k in ("draft", "decode", "total")},
           answers_the_same=f"{same} of {len(questions)}")


if __name__ == "__main__":
    main()
