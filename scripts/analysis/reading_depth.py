"""Reading depth chosen per question: how many of the top 5 passages the Always branch needs.

Inputs: a committed cell's records (depth 5, what is read today) and re-records of the same
questions at depth 1, 2, 3 (`python -m targ_mlx.eval ... --reuse-records CELL --top-k D`: the draft
and the Never answer are shared, only the Always answer is computed again). Rules, from what is
known before reading (the search's scores and whether a depth's context already says what the
k-token draft says):

- fixed D: always read D passages;
- ratio R: read the passages scoring at least R x the top passage's score;
- confirm: read the fewest passages (1, 2, 3) whose context confirms the draft, else 5.

Each rule's parameter is chosen on the cell's dev half (the eval's seeded split): the fewest mean
context tokens at a dev accuracy not below fixed 5's; it is then reported on the test half, paired
against fixed 5 (accuracy difference with a bootstrap 95% CI, mean context tokens).

    python scripts/analysis/reading_depth.py results/smollm2-135m/clean/nq_open runs/depth/clean-d{1,2,3}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from targ_mlx.eval.run import read_jsonl
from targ_mlx.eval.sweep import paired_ci, split, split_pool

DEPTHS = (1, 2, 3, 5)
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


def depth_of(rule: str, param: float | None, r5: dict, rows: dict[int, dict]) -> int:
    if rule == "fixed":
        return int(param)
    if rule == "ratio":
        scores = [p[2] for p in r5["always"]["passages"]]
        if not scores or scores[0] <= 0:
            return 5
        return max(1, sum(s >= param * scores[0] for s in scores))
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
        d = d if d in rows else 5
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
