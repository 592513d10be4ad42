"""Bring existing eval records up to the current evidence gate, without running the model.

For each run folder (`<folder>/records.jsonl`, as `python -m targ_mlx.eval` writes it):

1. `always.confirms`: whether the packed context the Always answer read says what the k-token
   draft says, for every k the record scores (`pipeline.confirms`, the
   runner's own test), and `always.support`: the selection's support over those passages
   (`pipeline.support_of`, the runner's own computation). The passages' texts come from the index's `passages.db` by the recorded
   keys, packed again to the run's token budget with the model's tokenizer (read from the GGUF
   header; no weights load); a record whose passages no longer pack to the recorded ones stops
   the script, naming it.
2. Every search-dependent gate's scores (the evidence gate's), recomputed from the record's own
   signals with the calibration shipped now (`eval.record.fill_scores`).

With `--reuse-records DIR` (the same run over another corpus, as the eval's flag of that name), each
record first takes DIR's corpus-free fields (draft, samples, Never answer, corpus-free probes and
scores) and keeps its own Always branch and CRAG grade: how a cell follows a re-recorded draft
without its index (a re-record would compute the same, since the Always answer does not read the
draft). The folder's config.json then names DIR under `corpus_free_from`.

Then `python -m targ_mlx.eval ... --report-only` rebuilds the tables.

    python scripts/analysis/rescore_records.py --model qwen2.5-coder-1.5b --index index/clean-minilm \\
        results/qwen2.5-coder-1.5b/clean/{nq_open,popqa,triviaqa}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from targ_mlx import pipeline
from targ_mlx.eval.record import fill_scores, over_corpus, passage_lookup, recorded_context
from targ_mlx.eval.run import corpus_free_source, read_jsonl, write_jsonl
from targ_mlx.runtime import gguf
from targ_mlx.runtime.model_spec import ALIASES, alias_path
from targ_mlx.runtime.tokenizer import tokenizer_from_gguf


def set_context_signals(records: list[dict], lookup, tok, budget: int, where: Path) -> int:
    added = 0
    for r in records:
        a = r["always"]
        try:
            packed = recorded_context(r, lookup, tok, budget)
        except LookupError as e:
            raise SystemExit(f"{where}: {e}; pass the --index the records were made with") from None
        except ValueError as e:
            raise SystemExit(f"{where}: {e}; pass the model the records were made with") from None
        ks = [int(k) for k in r["scores"].get("margin") or {}]
        a["confirms"] = {str(k): int(pipeline.confirms(tok, r["draft"][:k], packed.text, r["question"].strip()))
                         for k in ks}
        a["support"] = round(pipeline.support_of(r["question"].strip(), packed), 4)
        added += 1
    return added


def take_corpus_free(records: list[dict], cfg: dict, root: Path, where: Path) -> Path:
    """Replace each record (in place) by root's record of the same question over this corpus."""
    src, base, diff = corpus_free_source(root, where.name, cfg)
    if not base or not (src / "config.json").is_file():
        raise SystemExit(f"--reuse-records {root}: no records.jsonl and config.json in it or in {where.name}/; "
                         "pass an eval run folder")
    if diff:
        raise SystemExit(f"--reuse-records {src}: made with other settings than {where}: {', '.join(diff)}")
    missing = [r["id"] for r in records if r["id"] not in base]
    if missing:
        raise SystemExit(f"--reuse-records {src} lacks {len(missing)} of {where}'s questions (first: {missing[0]}); "
                         "finish recording it first")
    for i, r in enumerate(records):
        own = {k: v for k, v in r.get("cost", {}).items() if k in ("retrieval", "always")}
        records[i] = over_corpus(base[r["id"]], r["always"], r.get("probes", {}).get("p_relevant"), own)
    return src


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="run folders holding records.jsonl and config.json")
    ap.add_argument("--model", required=True, choices=sorted(ALIASES), help="the model the records were made with")
    ap.add_argument("--index", required=True, type=Path,
                    help="an index holding the recorded passages (the run's, or a rebuild of its corpora: "
                         "keys are stable, and `build --no-dense` is enough)")
    ap.add_argument("--reuse-records", metavar="DIR", type=Path,
                    help="the same run over another corpus (DIR/<dataset> or DIR): take its corpus-free fields")
    args = ap.parse_args(argv)
    db_path = args.index / "passages.db"
    if not db_path.is_file():
        ap.error(f"no passages.db in {args.index}; build the index the records were made with")
    path = alias_path(args.model)
    tok = tokenizer_from_gguf(gguf.metadata(path), path)
    lookup = passage_lookup(args.index)
    for folder in args.folders:
        rec_path, cfg_path = folder / "records.jsonl", folder / "config.json"
        if not rec_path.is_file() or not cfg_path.is_file():
            ap.error(f"{folder} has no records.jsonl and config.json; pass eval run folders")
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        if cfg.get("model") not in (None, args.model):
            ap.error(f"{folder} was recorded with {cfg['model']}, not {args.model}")
        settings = cfg["settings"]
        records = read_jsonl(rec_path)
        src = take_corpus_free(records, cfg, args.reuse_records, folder) if args.reuse_records else None
        added = set_context_signals(records, lookup, tok, int(settings["context_tokens"]), folder)
        rescored = fill_scores(records, args.model, float(settings["beta"]), search_changed=True)
        write_jsonl(rec_path, records)
        if src is not None:
            cfg_path.write_text(json.dumps({**cfg, "corpus_free_from": str(src)}, indent=2, default=str), encoding="utf-8")
        share = sum(r["always"]["confirms"].get("20", 0) for r in records) / max(1, len(records))
        print(f"{folder}: confirms and support set on {added} of {len(records)} records (k=20: {share:.1%} confirmed); "
              f"{rescored} rescored")
    return 0


if __name__ == "__main__":
    sys.exit(main())
