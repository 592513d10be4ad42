"""Cost of logging one decision: `DecisionLog.record` on a real file (WAL) and in memory.

    python scripts/bench/bench_log.py [--n 2000] [--repeats 3] [--dir DIR]

The record is realistic: 5 passages, three scores, gold answers and both eval branches. Each
call is one committed transaction, as in the chat app and eval. The target is <= 1 ms.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

from sqlite_utils import Database

from targ_mlx.log.decisions import DecisionLog
from targ_mlx.records import Answer, Latency, PassageRef, TokenCounts

DEFAULT_N = 2000
DEFAULT_REPEATS = 3


def sample_answer(i: int) -> Answer:
    passages = tuple(
        PassageRef(1000 + j, f"Title {j}", 0.8 - j / 50, "x" * 900) for j in range(5)
    )
    return Answer(
        question=f"who wrote the novel number {i}?",
        answer="George Eliot",
        model="smollm2-135m",
        gate="margin",
        tau=0.35,
        score=0.41,
        retrieved=True,
        scores={"entropy": 1.3, "margin": 0.41, "variance": 0.2},
        passages=passages,
        tokens=TokenCounts(prompt=40, draft=20, context=900, output=6, samples=100),
        latency=Latency(
            draft=0.21, gate=1e-4, retrieval=0.04, prefill=0.5, decode=0.1, total=0.85
        ),
    )


def time_records(log: DecisionLog, n: int) -> list[float]:
    answers = [sample_answer(i) for i in range(n)]
    branches = {"never": {"em": 0.0, "f1": 0.2, "answer": "Jane Austen"}}
    times = []
    for a in answers:
        start = time.perf_counter()
        log.record(
            a,
            source="eval",
            session="bench",
            gold=["George Eliot"],
            em=1.0,
            f1=1.0,
            branches=branches,
        )
        times.append(time.perf_counter() - start)
    return times


def summary(name: str, times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    p99 = ms[int(0.99 * (len(ms) - 1))]
    return (
        f"| {name} | {len(ms)} | {statistics.mean(ms):.3f} | {statistics.median(ms):.3f} | "
        f"{p99:.3f} | {ms[-1]:.2f} |"
    )


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Benchmark DecisionLog.record.")
    parser.add_argument(
        "--n",
        type=int,
        default=DEFAULT_N,
        help=f"records per run (default: {DEFAULT_N})",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        help=f"runs (default: {DEFAULT_REPEATS})",
    )
    parser.add_argument(
        "--dir", help="folder for the database file (default: a temp dir)"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = setup_arg_parser().parse_args(argv)
    print(f"{date.today()}  {platform.platform()}  {platform.processor() or platform.machine()}  "
          f"{os.cpu_count()} cpus  load {os.getloadavg()[0]:.1f}  python {platform.python_version()}")  # fmt: skip
    print("| target | records | mean ms | median ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(args.repeats):
            with DecisionLog(Path(tmp) / f"bench{r}.db") as log:
                print(summary(f"file, WAL (run {r + 1})", time_records(log, args.n)))
        for r in range(args.repeats):
            log = DecisionLog(Database(memory=True))
            print(summary(f"memory (run {r + 1})", time_records(log, args.n)))


if __name__ == "__main__":
    main()
