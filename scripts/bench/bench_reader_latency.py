"""Seconds a reading answer takes at batch 1, one reader against another, side by side in one
process (issue 55's target: read="each" within 1.3x of the single prompt).

Each question is asked with `--gate always` through the one answer runner (`targ ask`'s path:
search, pack, read, answer) once per reader, the order alternating per question so drift on a
shared machine cancels; the apps' settings otherwise (the paper prompt, 1,024 context tokens,
256-token answer cap). Reports the median seconds each way (total, and its search / prefill /
decode parts), the ratio of medians and the median of per-question ratios, and the share of read
passage slots whose title repeats one read before (the duplicates "distinct" and "each" drop).

    python scripts/bench/bench_reader_latency.py --index index/large-bm25 --model qwen2.5-coder-1.5b --n 20
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

from targ_mlx.assistant import Assistant, Settings  # noqa: E402
from targ_mlx.config import Config  # noqa: E402
from targ_mlx.defaults import DEFAULT_PROMPT  # noqa: E402
from targ_mlx.matching import normalize  # noqa: E402
from answer_bench import open_parts, parser, questions as held_out, report  # noqa: E402


def repeats(titles: list[str]) -> int:
    seen, n = set(), 0
    for t in map(normalize, titles):
        n += t in seen
        seen.add(t)
    return n


def main(argv=None):
    ap = parser(__doc__.splitlines()[0], n=20)
    ap.add_argument("--readers", default="passages,each")
    args = ap.parse_args(argv)
    questions = held_out(args)
    readers = args.readers.split(",")
    bb, r = open_parts(args)
    app = Settings.from_config(Config(), bb.model_id, gate="always")  # the apps' answer cap and budget
    asks = {m: Assistant(bb, r, replace(app, read=m, prompt_style=DEFAULT_PROMPT)) for m in readers}
    asks[readers[0]].answer(questions[0])  # warm-up: weights touched, graphs built
    times = {m: [] for m in readers}
    parts = {m: {"retrieval": [], "prefill": [], "decode": []} for m in readers}
    slots = {m: [0, 0] for m in readers}
    for i, q in enumerate(questions):
        for m in (readers if i % 2 == 0 else readers[::-1]):
            ans = asks[m].answer(q)
            times[m].append(ans.latency.total)
            for k in parts[m]:
                parts[m][k].append(getattr(ans.latency, k))
            titles = [p.title for p in ans.passages]  # read ("each": the cited, of distinct topics read)
            slots[m][0] += repeats(titles)
            slots[m][1] += len(titles)
    a, b = readers[1], readers[0]
    report(args, len(questions), median_s={m: statistics.median(v) for m, v in times.items()},
           parts_median_s={m: {k: statistics.median(v) for k, v in p.items()} for m, p in parts.items()},
           ratio_of_medians=statistics.median(times[a]) / statistics.median(times[b]),
           median_ratio=statistics.median(x / y for x, y in zip(times[a], times[b])),
           repeated_title_share={m: s[0] / s[1] if s[1] else 0.0 for m, s in slots.items()})


if __name__ == "__main__":
    main()
