"""Read one passage at a time only where the single prompt's answer has no evidence (issue 55)?

A cheap middle way between the two readers: keep the single prompt's answer where a sentence of
what it read holds it (`reader.holders`, what the choice rule cites by), else take `--read each`'s
chosen answer. On pairs of eval cells over the same questions (the single prompt's, then each's,
then the index holding their passages), prints both readers' accuracy, the fallback's, its paired
difference from the single prompt with a 95% bootstrap interval, and how often it fires. No model
runs: the passages come from the index's passages.db by the recorded keys.

    python scripts/analysis/fallback_each.py SINGLE_CELL EACH_CELL INDEX [SINGLE EACH INDEX ...]
"""
import random
import sys
from pathlib import Path

from targ_mlx import reader
from targ_mlx.eval.record import passage_lookup
from targ_mlx.eval.run import read_jsonl
from targ_mlx.retrieval import Passage


def rows(single: Path, each: Path, look) -> list[tuple[bool, float, float]]:
    """(the single prompt's answer held by what it read, single right, each right) per shared question."""
    s = {r["id"]: r for r in read_jsonl(single / "records.jsonl")}
    e = {r["id"]: r for r in read_jsonl(each / "records.jsonl")}
    out = []
    for i in (i for i in s if i in e):
        a = s[i]["always"]
        ps = a.get("read") or a["passages"]
        got = [look(p[0]) for p in ps]
        if not got or any(x is None for x in got):
            continue  # nothing read, or another index than the run's
        read = [Passage(p[0], t, x, 0.0) for p, (t, x) in zip(ps, got)]
        out.append((bool(reader.holders(s[i]["question"].strip(), a["answer"], read)), a["acc"], e[i]["always"]["acc"]))
    return out


def interval(d: list[float], n_boot: int = 2000) -> tuple[float, float]:
    rng = random.Random(0)
    means = sorted(sum(rng.choice(d) for _ in d) / len(d) for _ in range(n_boot))
    return means[int(0.025 * n_boot)], means[int(0.975 * n_boot) - 1]


def main(argv: list[str]) -> None:
    if not argv or len(argv) % 3:
        raise SystemExit(__doc__)
    lookups: dict[str, object] = {}
    for single, each, ix in zip(argv[::3], argv[1::3], argv[2::3]):
        look = lookups.setdefault(ix, passage_lookup(Path(ix)))
        got = rows(Path(single), Path(each), look)
        n = len(got)
        sa, ea = sum(r[1] for r in got), sum(r[2] for r in got)
        d = [(r[1] if r[0] else r[2]) - r[1] for r in got]
        lo, hi = interval(d)
        unheld = [r for r in got if not r[0]]
        print(f"{each}: n {n}; single {100 * sa / n:.1f}  each {100 * ea / n:.1f}  fallback "
              f"{100 * (sa + sum(d)) / n:.1f} ({100 * sum(d) / n:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]); "
              f"fires on {len(unheld)} (single right there {sum(r[1] for r in unheld):.0f}, "
              f"each right there {sum(r[2] for r in unheld):.0f})")


if __name__ == "__main__":
    main(sys.argv[1:])
