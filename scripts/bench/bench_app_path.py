"""The app's reading prefill against the backbone benchmark's, on the very same prompt (issue 58,
deliver 2: the app at the benchmark's speed).

Per question: `targ ask`'s path (the one answer runner, `--gate always`, the apps' settings: the
paper prompt, 1,024 context tokens) answers over an index, and its `latency.prefill` is kept with
the prompt it prefilled (`Done.prompt_ids`); then that prompt is prefilled as
`bench_backbone.py` times it (`Backbone.prefill` on a fresh cache, evaluated), the order of the
two alternating per question. Reports both tok/s and the median of per-question ratios (app /
benchmark; 1.0 = the app at the benchmark's speed; target >= 0.95).

    python scripts/bench/bench_app_path.py --index index/large-bm25 --model qwen2.5-coder-1.5b --n 8
"""

from __future__ import annotations

import statistics
import time

from targ_mlx import bind_openblas

bind_openblas()  # before mlx.core loads

import mlx.core as mx  # noqa: E402

from targ_mlx import runner  # noqa: E402
from targ_mlx.config import Config  # noqa: E402
from targ_mlx.settings import Settings  # noqa: E402
from answer_bench import open_parts, parser, questions as held_out, report  # noqa: E402


def bench_prefill(bb, ids) -> float:
    cache = bb.make_cache()
    t0 = time.perf_counter()
    mx.eval(bb.prefill(list(ids), cache))
    return time.perf_counter() - t0


def app_answer(bb, r, q, s):
    for ev in runner.stream_answer(bb, r, q, s):
        if isinstance(ev, runner.Done):
            return ev.answer.latency.prefill, ev.prompt_ids
    raise AssertionError("no Done")


def main(argv=None):
    args = parser(__doc__.splitlines()[0], n=8).parse_args(argv)
    questions = held_out(args)
    bb, r = open_parts(args)
    s = Settings.from_config(Config(), bb.model_id, gate="always")
    _, ids = app_answer(bb, r, questions[0], s)  # warm-up: weights touched, graphs built, encoder loaded
    bench_prefill(bb, ids)
    rows = []
    for i, q in enumerate(questions):
        if i % 2 == 0:
            app_s, ids = app_answer(bb, r, q, s)
            bench_s = bench_prefill(bb, ids)
        else:  # the benchmark first needs the app's prompt: search and pack it, then time both
            _, ids = app_answer(bb, r, q, s)
            bench_s = bench_prefill(bb, ids)
            app_s, ids2 = app_answer(bb, r, q, s)
            assert ids2 == ids
        rows.append((len(ids), app_s, bench_s))
    report(args, len(rows), prompt_tokens_median=statistics.median(n for n, _, _ in rows),
           app_tok_s_median=statistics.median(n / a for n, a, _ in rows),
           bench_tok_s_median=statistics.median(n / b for n, _, b in rows),
           app_over_bench_speed_median=statistics.median(b / a for _, a, b in rows))


if __name__ == "__main__":
    main()
