"""Two eval runs over different corpora, on the questions both recorded: how much the corpus moves
Always-RAG and the gates (paired bootstrap CIs).

    python scripts/analysis/compare_corpora.py results/smollm2-135m/seeded results/smollm2-135m/clean \
        --names nq_open popqa --out results/smollm2-135m/corpora.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from targ_mlx.eval import analysis as an
from targ_mlx.eval import controls as ctl
from targ_mlx.eval.run import read_jsonl
from targ_mlx.eval.sweep import paired_ci


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def compare(a_dir: Path, b_dir: Path, name: str, k: int = 20, rho: float = 0.3, n_boot: int = 1000) -> list[str]:
    a = {r["id"]: r for r in read_jsonl(a_dir / name / "records.jsonl")}
    b = {r["id"]: r for r in read_jsonl(b_dir / name / "records.jsonl")}
    ids = [q for q in a if q in b]
    if not ids:
        return [f"| {name} | 0 | - | - | - | - | - | - |"]
    m = "acc"
    al_a = np.array([a[q]["always"][m] for q in ids], float)
    al_b = np.array([b[q]["always"][m] for q in ids], float)
    nv = np.array([a[q]["never"][m] for q in ids], float)
    u = np.array([a[q]["scores"]["margin"][str(k)] for q in ids], float)
    hit_b = [b[q]["always"].get("hit") for q in ids]
    r = ctl.retrieve_top(u, rho)
    gate_a, gate_b = ctl.gated(r, nv, al_a), ctl.gated(r, nv, al_b)
    d = paired_ci(al_b, al_a, n_boot)
    return [f"| {name} | {len(ids)} | {_pct(nv.mean())} | {_pct(al_a.mean())} | {_pct(al_b.mean())} | "
            f"{100 * d[0]:+.1f} [{100 * d[1]:+.1f}, {100 * d[2]:+.1f}] | {_pct(gate_a.mean())} / {_pct(gate_b.mean())} | "
            f"{'-' if None in hit_b else _pct(float(np.mean(hit_b)))} |"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("first", help="eval --output-dir over the first corpus")
    p.add_argument("second", help="eval --output-dir over the second corpus")
    p.add_argument("--names", nargs="+", required=True, help="dataset subfolders to compare")
    p.add_argument("--out", help="also write the table here")
    args = p.parse_args(argv)
    a, b = Path(args.first), Path(args.second)
    def regime(d: Path, n: str) -> str:
        cfg = d / n / "config.json"
        return json.loads(cfg.read_text()).get("corpus_regime", "?") if cfg.is_file() else "?"

    lines = [f"# {a.name} vs {b.name}: the same questions over two corpora ({an.LABEL['acc']}, %)", "",
             f"| dataset | n (both) | Never | Always {a.name} | Always {b.name} | Always {b.name} − {a.name} [95% CI] | "
             f"margin gate at 30% ({a.name} / {b.name}) | hit@5 {b.name} |", "|---" * 8 + "|"]
    for name in args.names:
        lines += compare(a, b, name)
    lines += ["", f"Regimes: {a.name} = {regime(a, args.names[0])}, {b.name} = {regime(b, args.names[0])}. The margin "
              "gate retrieves the 30% of these questions with the highest U (k = 20); its Never answers are the same "
              "under both corpora, so only the retrieved answers differ."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
