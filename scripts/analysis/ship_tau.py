"""The shipped tau per gate (`gates.paper.CALIBRATED_TAU`) from an eval run's records.

Each line of `records.jsonl` (written by `python -m targ_mlx.eval`) holds the draft's U for
every gate at every k: `scores[gate][str(k)]`. Tau for a retrieval budget is the project's one
rule, `calibration.budget_threshold(U, rho)`, per gate. The run's `config.json` (beside the
records) says which prompt, k, beta, N and T drafted them; the script compares them with the
assistant's own defaults (`Settings()`), since a tau only carries over to the same draft:

    python scripts/analysis/ship_tau.py results/smollm2-135m/seeded/nq_open/records.jsonl --budget 0.3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from targ_mlx.calibration.thresholds import budget_threshold
from targ_mlx.gates import draft_only_names

from targ_mlx.settings import Settings

# records' config.json "settings" key -> the Settings field that drafts the same way
_DRAFT_FIELDS = {"prompt_style": "prompt_style", "beta": "beta", "n_samples": "n_samples",
                 "temperature": "temperature"}


def scores(records: Path, gate: str, k: int) -> list[float]:
    """U of `gate` at prefix length `k`, one per record that has it."""
    out = []
    with open(records, encoding="utf-8") as f:
        for line in f:
            u = ((json.loads(line).get("scores") or {}).get(gate) or {}).get(str(k))
            if u is not None:
                out.append(float(u))
    return out


def draft_mismatches(config: dict, k: int) -> list[str]:
    """Where the run's draft settings differ from the assistant's defaults."""
    run, ours = config.get("settings") or {}, Settings()
    out = [f"{name}: records {run[name]!r}, assistant {getattr(ours, field)!r}"
           for name, field in _DRAFT_FIELDS.items() if name in run and run[name] != getattr(ours, field)]
    if k != ours.k:
        out.append(f"k: {k} here, assistant {ours.k}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", type=Path, help="an eval run's records.jsonl")
    ap.add_argument("--budget", type=float, default=0.3, help="retrieval rate rho (default 0.3)")
    ap.add_argument("--k", type=int, default=Settings().k, help="draft prefix length (default: the assistant's)")
    ap.add_argument("--gates", nargs="+", default=list(draft_only_names()), choices=draft_only_names())
    args = ap.parse_args(argv)

    config_path = args.records.with_name("config.json")
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    print(f"records {args.records} (model {config.get('model', '?')}, "
          f"prompt {(config.get('settings') or {}).get('prompt_style', '?')}), budget {args.budget}, k {args.k}")
    for line in draft_mismatches(config, args.k):
        print(f"warning: draft differs from the assistant's: {line}", file=sys.stderr)
    for gate in args.gates:
        u = scores(args.records, gate, args.k)
        if not u:
            print(f"{gate}: no scores at k={args.k}")
            continue
        tau = budget_threshold(u, args.budget)
        rate = sum(x > tau for x in u) / len(u)
        print(f"{gate}: tau {tau!r}  (n {len(u)}, retrieval rate {rate:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
