"""Reading depth chosen per question: how many of the top 5 passages the Always branch needs.

Inputs: a committed cell's records (depth 5, what is read today) and re-records of the same
questions at depth 1, 2, 3 (`python -m targ_mlx.eval ... --reuse-records CELL --top-k D`: the draft
and the Never answer are shared, only the Always answer is computed again). Rules, from what is
known before reading (the search's scores and whether a depth's context already says what the
k-token draft says):

- fixed D: always read D passages;
- ratio R: what `--depth-ratio R` reads, the passages scoring at least R x the best one's score
  (on a dense ranking, sorted by similarity, the first D of it);
- confirm: read the fewest passages (1, 2, 3) whose context confirms the draft, else 5.

A rule that needs a depth with no records (a ratio rule needs every depth its cutoff gives some
question) is refused in one line naming the depth and the command that records it,
never scored as depth 5; so is a ratio whose passages are not the first D of the ranking (a BM25
or hybrid cell), which no depth's records read.

Each rule's parameter is chosen on the cell's dev half (the eval's seeded split): the fewest mean
context tokens at a dev accuracy not below fixed 5's; it is then reported on the test half, paired
against fixed 5 (accuracy difference with a bootstrap 95% CI, mean context tokens).

    python scripts/analysis/reading_depth.py results/smollm2-135m/clean/nq_open runs/depth/clean-d{1,2,3,4}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from targ_mlx.eval.run import read_jsonl
from targ_mlx.eval.sweep import paired_ci, split, split_pool
from targ_mlx.selection import read_among

DEPTHS = (1, 2, 3, 4, 5)
RATIOS = (0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)
K = "20"  # the draft length the confirmation reads (the eval's headline k)


def load(base: Path, others: list[Path]) -> tuple[dict[int, dict], list[str], dict]:
    """{depth: {id: record}} and the ids every depth holds, in the base cell's order."""
    by = {5: {r["id"]: r for r in read_jsonl(base / "records.jsonl")}}
    for folder in others:
        cfg = json.loads((folder / "config.json").read_text())
        by[int(cfg["settings"]["top_k"])] = {r["id"]: r for r in read_jsonl(folder / "records.jsonl")}
    ids = [i for i in by[5] if all(i in by[d] for d in by)]
    return by, ids, json.loads((base / "config.json").read_text())


class NoRecords(ValueError):
    """A rule asks for passages no given records read."""


def depth_of(rule: str, param: float | None, r5: dict, rows: dict[int, dict]) -> int:
    if rule == "fixed":
        return int(param)
    if rule == "ratio":
        scores = [p[2] for p in r5["always"]["passages"]]
        keep = read_among(scores, param)
        if keep != list(range(len(keep))):
            raise NoRecords(f"--depth-ratio {param} reads passages {keep} of {r5['id']}'s ranking, not its first "
                            f"{len(keep)}: no depth's records read them (a ranking not sorted by similarity); "
                            "measure it on a dense cell")
        return len(keep) or 5
    if rule == "confirm":
        for d in (1, 2, 3):
            if d in rows and rows[d]["always"]["confirms"].get(K):
                return d
        return 5
    raise ValueError(rule)


def evaluate(rule: str, param, by, ids, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per question: correct, context tokens, depth read."""
    acc, tok, dep = [], [], []
    for i in ids:
        rows = {d: by[d][i] for d in by}
        d = depth_of(rule, param, rows[5], rows)
        if d not in rows:  # never another depth in its place: the figures would not be what the rule reads
            raise NoRecords(f"no records at depth {d} ({rule} {param} reads {d} passages for {i}): record them with "
                            f"`python -m targ_mlx.eval ... --reuse-records BASE --top-k {d} --output-dir DIR` "
                            "and pass DIR too")
        acc.append(rows[d]["always"][metric])
        tok.append(rows[d]["always"]["tok_ctx"])
        dep.append(d)
    return np.array(acc, float), np.array(tok, float), np.array(dep, float)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base", type=Path, help="the committed cell (depth 5)")
    p.add_argument("depths", type=Path, nargs="+", help="re-records at other depths")
    p.add_argument("--metric", default="acc")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args(argv)
    try:
        return report(args)
    except NoRecords as e:
        print(f"reading_depth.py: {e}", file=sys.stderr)
        return 2


def report(args: argparse.Namespace) -> int:
    by, ids, cfg = load(args.base, args.depths)
    dev, test = split(len(ids), args.seed, pool=split_pool(cfg))
    dev_ids, test_ids = [ids[i] for i in dev], [ids[i] for i in test]
    rules = [("fixed", d) for d in DEPTHS if d in by] + [("ratio", r) for r in RATIOS] + [("confirm", None)]
    base_dev = evaluate("fixed", 5, by, dev_ids, args.metric)[0].mean()
    out = {"n": len(ids), "dev": len(dev_ids), "test": len(test_ids), "depths": sorted(by), "rules": []}
    print(f"{len(ids)} questions (dev {len(dev_ids)}, test {len(test_ids)}); dev accuracy at depth 5: {100 * base_dev:.1f}")
    chosen = {}
    for rule, param in rules:
        a, t, d = evaluate(rule, param, by, dev_ids, args.metric)
        row = {"rule": rule, "param": param, "dev_acc": 100 * a.mean(), "dev_tokens": t.mean(), "dev_depth": d.mean()}
        out["rules"].append(row)
        print(f"  dev {rule:7} {param!s:5} acc {100 * a.mean():5.1f} tokens {t.mean():6.1f} depth {d.mean():.2f}")
        ok = a.mean() >= base_dev - 1e-12
        if not (rule == "fixed" and param == 5) and ok and (rule not in chosen or t.mean() < chosen[rule][1]):
            chosen[rule] = (param, t.mean())
    a5, t5, _ = evaluate("fixed", 5, by, test_ids, args.metric)
    out["test_fixed5"] = {"acc": 100 * a5.mean(), "tokens": t5.mean()}
    print(f"test fixed 5: acc {100 * a5.mean():.1f} tokens {t5.mean():.1f}")
    out["test"] = []
    for rule, (param, _) in chosen.items():
        a, t, d = evaluate(rule, param, by, test_ids, args.metric)
        est, lo, hi = paired_ci(a, a5)
        row = {"rule": rule, "param": param, "acc": 100 * a.mean(), "diff": 100 * est, "ci": [100 * lo, 100 * hi],
               "tokens": t.mean(), "token_share": t.mean() / t5.mean(), "depth": d.mean()}
        out["test"].append(row)
        print(f"test {rule:7} {param!s:5} acc {100 * a.mean():5.1f} ({100 * est:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]) "
              f"tokens {t.mean():6.1f} ({100 * t.mean() / t5.mean():.0f}% of fixed 5) depth {d.mean():.2f}")
    for d in DEPTHS:
        if d in by and d != 5:
            a, t, _ = evaluate("fixed", d, by, test_ids, args.metric)
            est, lo, hi = paired_ci(a, a5)
            print(f"test fixed {d}: acc {100 * a.mean():5.1f} ({100 * est:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]) tokens {t.mean():.1f}")
            out.setdefault("test_fixed", {})[d] = {"acc": 100 * a.mean(), "diff": 100 * est, "ci": [100 * lo, 100 * hi],
                                                  "tokens": t.mean()}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
