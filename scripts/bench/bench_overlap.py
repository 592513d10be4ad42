"""Seconds an answer takes with the search run beside the draft against one after the other (before
it, as the CPU runs it), side by side in one process (issue 58, deliver 4: the evidence gate's search does not need the draft).

Each question is asked through the one answer runner (`targ ask`'s path) with the apps' settings
and the evidence gate, once with `runner.OVERLAP_SEARCH` on and once off, the order alternating per
question so drift on a shared machine cancels. Reports the median seconds each way (total; draft
and search as each measured them: overlapped, they run at once), the ratio of medians, the median
of per-question ratios, and whether every answer, decision and passage list was the same both ways.

    python scripts/bench/bench_overlap.py --index index/large-bm25 --model qwen2.5-coder-1.5b --n 20
"""

from __future__ import annotations

import statistics

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

from targ_mlx import runner  # noqa: E402
from answer_bench import apps_assistant, parser, questions as held_out, report  # noqa: E402

WAYS = ("after", "beside")  # "after": the two one after the other (the search first since 2026-11-30)


def main(argv=None):
    ap = parser(__doc__.splitlines()[0], n=20)
    ap.add_argument("--gate", default=None, help="a search-first gate (default: the apps' evidence gate)")
    args = ap.parse_args(argv)
    questions = held_out(args)
    ask = apps_assistant(args, questions)
    times = {w: [] for w in WAYS}
    parts = {w: {"draft": [], "retrieval": [], "prefill": [], "decode": []} for w in WAYS}
    same, reads = 0, 0
    for i, q in enumerate(questions):
        got = {}
        for w in (WAYS if i % 2 == 0 else WAYS[::-1]):
            runner.OVERLAP_SEARCH = w == "beside"  # forced either way, whatever the machine
            ans = ask.answer(q)
            got[w] = (ans.answer, ans.retrieved, ans.score, ans.found, ans.passages)
            times[w].append(ans.latency.total)
            for k in parts[w]:
                parts[w][k].append(getattr(ans.latency, k))
        same += got["after"] == got["beside"]
        reads += got["beside"][1]
    report(args, len(questions), gate=ask.settings.gate, read=reads,
           median_s={w: statistics.median(v) for w, v in times.items()},
           parts_median_s={w: {k: statistics.median(v) for k, v in p.items()} for w, p in parts.items()},
           ratio_of_medians=statistics.median(times["beside"]) / statistics.median(times["after"]),
           median_ratio=statistics.median(b / a for a, b in zip(times["after"], times["beside"])),
           answers_the_same=f"{same} of {len(questions)}")


if __name__ == "__main__":
    main()
