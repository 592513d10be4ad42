"""The variance gate over several sampling seeds (the paper reports it over 3).

Of everything a record holds, only the N sampled prefixes depend on the sampling seed. This
re-draws them for the questions of a finished eval run (the same prompts, the same batches as
recorded, batch b of seed s seeded as the record seeds it), rescores U_var at every k, and reports
the budget-calibrated variance gate per seed (the run's own seed first) beside a random gate at
its rate, with the AUROCs of U_var, and the mean and spread over seeds. The draft, the Never and
Always answers are the run's, so a seed costs only its sampled rows.

    python -m targ_mlx.eval.seeds results/smollm2-135m/clean/nq_open --seeds 1 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from targ_mlx import bind_openblas

bind_openblas()  # an entry point: bind before the imports below load mlx.core
from targ_mlx.eval import analysis as an  # noqa: E402
from targ_mlx.eval import controls as ctl  # noqa: E402
from targ_mlx.eval import sweep  # noqa: E402
from targ_mlx.eval.record import gate_scores, sample_seed  # noqa: E402
from targ_mlx.eval.run import RECORDS, append_jsonl, read_jsonl, resume_jsonl  # noqa: E402
from targ_mlx.eval.sweep import Signals  # noqa: E402

SEEDS_FILE = "variance_seeds.jsonl"  # {"id", "seed", "samples", "variance": {k: U}} per question and seed
REPORT = "variance_seeds.md"
GATE = "variance"

logger = logging.getLogger(__name__)


def recorded_batches(records: Sequence[dict]) -> Iterator[tuple[int, list[dict]]]:
    """The run's batches as recorded: consecutive records with the same batch number (a batch is
    appended at once), so the same prompts are decoded together again."""
    for b, group in itertools.groupby(records, key=lambda r: r.get("batch", 0)):
        yield b, list(group)


def resample(bb, records: Sequence[dict], settings: dict, seed: int, done: set[str] = frozenset()) -> Iterator[list[dict]]:
    """Per recorded batch with a question not in `done`: that batch's N sampled prefixes under
    `seed` and their U_var at every k. The whole batch is decoded (its composition fixes the
    draws), so an interrupted run resumes to the same samples."""
    from targ_mlx import pipeline
    from targ_mlx.runtime import batch

    k_max, ks, beta = settings["k_max"], settings["ks"], settings["beta"]
    for b, group in recorded_batches(records):
        if all(r["id"] in done for r in group):
            continue
        ids = [pipeline.prompt_ids(bb, r["question"].strip(), settings["prompt_style"]) for r in group]
        _, samples = batch.draft_batch(bb, ids, k_max, settings["n_samples"], max(k_max, settings["max_tokens"]),
                                       settings["temperature"], seed=sample_seed(seed, b))
        yield [{"id": r["id"], "seed": seed, "samples": smp,
                "variance": gate_scores(r["entropies"], r["gaps"], smp, ks, beta)[GATE]}
               for r, smp in zip(group, samples) if r["id"] not in done]


CI = an.CI


@dataclass(frozen=True)
class SeedRow:
    """The budget-calibrated variance gate under one sampling seed, and U_var's AUROCs."""

    seed: int
    verdict: an.Verdict
    never_wrong: CI
    helps: CI


def with_variance(records: Sequence[dict], variance: dict[str, dict]) -> list[dict]:
    """The records with U_var replaced by another seed's (`variance`: id -> {k: U})."""
    return [{**r, "scores": {**r["scores"], GATE: variance[r["id"]]}} for r in records]


def seed_rows(records: Sequence[dict], by_seed: dict[int, dict[str, dict]], k: int, run_seed: int,
              n_boot: int, pool: int | None = None) -> tuple[str, list[SeedRow]]:
    """One row per seed, judged like the headline verdict (rho by dev score, tau by the one budget
    rule, test split of the run's seed) on the run's headline metric; returns (metric, rows)."""
    metric = an.headline_metric(Signals(records))
    dev, test = sweep.split(len(records), run_seed, pool=pool)
    rows = []
    for seed, variance in by_seed.items():
        sig = Signals(with_variance(records, variance))
        lab = ctl.labels(sig.never[metric], sig.always[metric])
        u = sig.u[GATE][k]

        rows.append(SeedRow(seed, an.verdict(sig, dev, test, metric, k, n_boot, run_seed, gate=GATE),
                            an.auroc_or_nan(u, lab["never_wrong"], n_boot, run_seed),
                            an.auroc_or_nan(u, lab["helps"], n_boot, run_seed)))
    return metric, rows


def _pp(c: CI) -> str:
    """A difference of means in points with its CI."""
    return f"{100 * c[0]:+.1f} [{100 * c[1]:+.1f}, {100 * c[2]:+.1f}]"


def _auc(c: CI) -> str:
    return "–" if not np.isfinite(c[0]) else f"{c[0]:.2f} [{c[1]:.2f}, {c[2]:.2f}]"


def _spread(values: Sequence[float], scale: float = 100.0, digits: int = 1) -> str:
    v = np.asarray(values, float) * scale
    v = v[np.isfinite(v)]
    if not len(v):
        return "–"
    sd = float(v.std(ddof=1)) if len(v) > 1 else 0.0
    return f"{v.mean():.{digits}f} ± {sd:.{digits}f}"


def render(name: str, metric: str, rows: Sequence[SeedRow], k: int, n: int, changed: float) -> str:
    lab = an.LABEL[metric]
    out = [f"# {name}: the variance gate over {len(rows)} sampling seeds (k = {k}, {lab})", "",
           f"Budget-calibrated variance gate (rho by dev {lab}, tau by the one budget rule), judged on the "
           f"test half (n = {rows[0].verdict.n if rows else 0}); AUROCs of U_var on all {n} questions. Only the "
           f"sampled prefixes change with the seed; the draft and both answers are the run's. "
           f"U_var differs from the first seed's for {100 * changed:.0f}% of questions.", "",
           f"| seed | rho | rate | gate | random @ rate [95% band] | gate − random [95% CI] | gate − Never | "
           f"AUROC: Never wrong | AUROC: retrieval helps |", "|---" * 9 + "|"]
    for r in rows:
        v = r.verdict
        out.append(f"| {r.seed} | {v.rho:.2f} | {v.rate:.2f} | {100 * v.gate:.1f} | {100 * v.random.expected:.1f} "
                   f"[{100 * v.random.lo:.1f}, {100 * v.random.hi:.1f}] | {_pp(v.vs_random)} | {_pp(v.vs_never)} | "
                   f"{_auc(r.never_wrong)} | {_auc(r.helps)} |")
    if len(rows) > 1:
        out.append(f"| mean ± sd | | {_spread([r.verdict.rate for r in rows], 1.0, 2)} | "
                   f"{_spread([r.verdict.gate for r in rows])} | | {_spread([r.verdict.vs_random[0] for r in rows])} | "
                   f"{_spread([r.verdict.vs_never[0] for r in rows])} | "
                   f"{_spread([r.never_wrong[0] for r in rows], 1.0, 2)} | {_spread([r.helps[0] for r in rows], 1.0, 2)} |")
    return "\n".join(out) + "\n"


def report(run_dir: Path, k: int, n_boot: int) -> str:
    """variance_seeds.md for a run folder from its records and the seeds drawn so far."""
    cfg = json.loads((run_dir / "config.json").read_text())
    run_seed = int(cfg["settings"]["seed"])
    records = read_jsonl(run_dir / RECORDS)
    by_seed: dict[int, dict[str, dict]] = {run_seed: {r["id"]: r["scores"][GATE] for r in records}}
    for row in read_jsonl(run_dir / SEEDS_FILE):
        by_seed.setdefault(int(row["seed"]), {})[row["id"]] = row["variance"]
    ids = {r["id"] for r in records}
    complete = {s: v for s, v in by_seed.items() if ids <= v.keys()}
    for s in sorted(by_seed.keys() - complete.keys()):
        logger.warning("seed %d has %d of %d questions; left out of the report (rerun to finish it)",
                       s, len(by_seed[s]), len(ids))
    first = complete[run_seed]
    changed = float(np.mean([any(complete[s][q].get(str(k)) != first[q].get(str(k)) for s in complete)
                             for q in ids])) if ids else 0.0
    metric, rows = seed_rows(records, complete, k, run_seed, n_boot, sweep.split_pool(cfg))
    text = render(cfg.get("dataset", run_dir.name), metric, rows, k, len(records), changed)
    (run_dir / REPORT).write_text(text, encoding="utf-8")
    return text


def draw(run_dir: Path, seeds: Sequence[int], model: str | None = None, quiet: bool = False) -> None:
    """Append the missing (question, seed) rows to run_dir/variance_seeds.jsonl."""
    from targ_mlx.session import load_config, open_session

    cfg = json.loads((run_dir / "config.json").read_text())
    records = read_jsonl(run_dir / RECORDS)
    have, _ = resume_jsonl(run_dir / SEEDS_FILE)
    # the model only (the index opens on a first search, which resampling never makes); a long run
    bb = open_session(load_config().merged(model=model or cfg["model"]), log=False, long_running=True).backbone
    for seed in seeds:
        if seed == int(cfg["settings"]["seed"]):
            logger.warning("seed %d is the run's own: its samples are in %s already", seed, RECORDS)
            continue
        done = {r["id"] for r in have if int(r["seed"]) == seed}
        n = len(done)
        for rows in resample(bb, records, cfg["settings"], seed, done):
            append_jsonl(run_dir / SEEDS_FILE, rows)
            n += len(rows)
            if not quiet:
                print(f"\r{run_dir.name} seed {seed}: {n}/{len(records)}", end="", file=sys.stderr, flush=True)
        if not quiet:
            print(file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m targ_mlx.eval.seeds", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="eval output folders (one dataset each)")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="sampling seeds to add (default 1 2)")
    p.add_argument("--model", help="the run's model when its alias is not in config.json")
    p.add_argument("--k", type=int, help="prefix length (default: the run's --k)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for CIs (default 1000)")
    p.add_argument("--report-only", action="store_true", help="tables from the seeds drawn so far; run no model")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    for d in map(Path, args.run_dirs):
        if not (d / RECORDS).is_file() or not (d / "config.json").is_file():
            print(f"error: {d} has no {RECORDS} and config.json; fix: pass a folder an eval run wrote "
                  f"(for example results/smollm2-135m/clean/nq_open)", file=sys.stderr)
            return 2
    for d in map(Path, args.run_dirs):
        if not args.report_only:
            draw(d, args.seeds, args.model, args.quiet)
        k = args.k or json.loads((d / "config.json").read_text())["args"].get("k") or 20
        text = report(d, k, args.bootstrap)
        if not args.quiet:
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
