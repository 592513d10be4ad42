"""`targ-calibrate fit`: the evidence gate fitted to a user's own model, in one command.

    targ-calibrate fit --model mlx-community/Qwen2.5-7B-Instruct-4bit --data-file qa.jsonl [--limit 300]

records N questions with the model (the eval's one-pass records: the draft, the search, both
branches, resumable in a run folder, a progress bar with ETA), fits the gate's two isotonic
calibrations and tau for a reading budget on them (`calibration.evidence`), and writes both to the config
under the model's key, where `targ ask`, the chat and the server read them. `--records DIR` fits
already-recorded eval cells instead (their dev halves: the test halves stay for judging).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import platformdirs

from targ_mlx.config import Config, default_config_path, load_config, save_evidence
from targ_mlx.errors import ModelLoadError, TargError
from targ_mlx.paths import APP_NAME
from targ_mlx.retrieval import RETRIEVERS
from targ_mlx.settings import Settings

DEFAULT_LIMIT = 300
MIN_QUESTIONS = 100  # below this the isotonic steps follow a handful of questions each


class TooFewQuestionsError(TargError):
    """Fewer labelled questions than a calibration needs."""


def add_fit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="alias, .gguf path, MLX folder or mlx-lm repo id (its key names the fit)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data-file", metavar="QA.jsonl",
                     help='questions with gold answers, {"question", "answers": [...]} per line')
    src.add_argument("--records", nargs="+", metavar="DIR",
                     help="fit already-recorded eval cells of this model (their dev halves) instead of recording")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help=f"questions to record (default {DEFAULT_LIMIT})")
    p.add_argument("--index", help="index folder to search (default: the config's, else the offline default)")
    p.add_argument("--retriever", choices=RETRIEVERS, help="search mode (default: the index's)")
    p.add_argument("--budget", type=float, default=None, metavar="RHO",
                   help="reading rate tau is set for, on the fitted questions (default 0.3)")
    p.add_argument("--output-dir", help="run folder for the records (default: under the user data dir; "
                   "rerunning the command continues there)")
    p.add_argument("--config", help=f"config file to write (default: {default_config_path()})")
    p.add_argument("--min-questions", type=int, default=MIN_QUESTIONS,
                   help=f"refuse below this many questions (default {MIN_QUESTIONS})")
    p.add_argument("--batch-size", type=int, default=8, help="questions decoded together (default 8)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run_dir(key: str, data_file: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return platformdirs.user_data_path(APP_NAME) / "calibration" / safe / Path(data_file).stem


def _bar(quiet: bool):
    if quiet:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the eval extra is not installed: no bar
        return None
    state: dict = {}

    def cb(done: int, total: int) -> None:
        if "t" not in state:
            state["t"] = tqdm(total=total, initial=done, desc="recording", unit="q", dynamic_ncols=True)
        state["t"].n = done
        state["t"].refresh()
        if done >= total:
            state["t"].close()

    return cb


def _refuse_few(n: int, minimum: int, where: str) -> None:
    if n < minimum:
        raise TooFewQuestionsError(f"{n} questions in {where}; a calibration needs at least {minimum} "
                                   f"(fix: --limit {max(minimum, DEFAULT_LIMIT)} with a larger file, or --min-questions)")


def record(args, key: str, k: int, beta: float, cfg) -> tuple[list[dict], str]:
    """Record (or continue recording) --limit questions of --data-file; returns (records, where)."""
    from targ_mlx.eval.datasets import read_jsonl as read_items, sample
    from targ_mlx.eval.record import EvalSettings, eval_answer
    from targ_mlx.eval.run import run_records

    items = sample(read_items(args.data_file), args.limit or None, 0)
    _refuse_few(len(items), args.min_questions, f"{args.data_file} (--limit {args.limit})")
    out = Path(args.output_dir) if args.output_dir else run_dir(key, args.data_file)
    settings = EvalSettings(eval_answer(beta=beta, n_samples=0), k_max=k, ks=(k,), baselines=False)
    from targ_mlx import index
    from targ_mlx.session import open_session

    folder = index.ensure_index(args.index or (cfg.index[0] if cfg.index else None))  # built or resumed here: the check below needs its path
    prev = out / "config.json"
    if prev.is_file():  # a rerun continues these records only if they were made the same way
        theirs = json.loads(prev.read_text())
        if (theirs.get("model"), theirs.get("settings"), theirs.get("index")) != (
                key, json.loads(json.dumps(settings.to_dict())), str(folder)):
            raise ValueError(f"{out} holds records of {theirs.get('model')} over {theirs.get('index')} made with "
                             "other settings; fix: pass another --output-dir, or delete that folder")
    try:  # the model and the index open as every face opens them (no log: the records are the output)
        session = open_session(cfg.merged(model=args.model, index=(str(folder),), retriever=args.retriever),
                               log=False, source="eval", long_running=True, index_when="eager", quiet=args.quiet)
    except ModelLoadError as e:
        raise ModelLoadError(f"cannot load model {args.model!r}: {e}") from None
    except TargError:  # the config's, the index's, the log's own one-line errors
        raise
    except Exception as e:  # noqa: BLE001  (any loader's failure: one line naming the spec)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelLoadError(f"cannot load model {args.model!r}: {first}") from None
    bb, retriever = session.backbone, session.retriever
    out.mkdir(parents=True, exist_ok=True)
    prev.write_text(json.dumps({"model": key, "settings": settings.to_dict(), "data_file": str(args.data_file),
                                "index": str(folder)}, indent=2))
    records = run_records(bb, retriever, items, settings, out, args.batch_size, _bar(args.quiet))
    return records, f"{out} ({len(records)} recorded with {args.model} over {folder})"


def _from_records(args, key: str, k: int, beta: float):
    from targ_mlx.calibration.evidence import cell_rows, cells

    for folder in args.records:
        for cell in cells(Path(folder)):
            model = json.loads((cell / "config.json").read_text()).get("model") if (cell / "config.json").is_file() else None
            if model not in (None, key):
                raise ValueError(f"--records {cell}: records of {model}, not {key}; fix: --model {model}")
    return cell_rows([Path(f) for f in args.records], k, beta, "dev")


def fit_command(args) -> str:
    """Run `targ-calibrate fit`; returns the report."""
    from targ_mlx.calibration.evidence import DEFAULT_RATE, fit, rows_of, scores, split_note
    from targ_mlx.runtime.model_spec import model_key

    rate = DEFAULT_RATE if args.budget is None else args.budget
    if not 0.0 < rate < 1.0:
        raise ValueError(f"--budget must be a reading rate in (0, 1); got {rate}")
    key = model_key(args.model)
    # --config may name a file this command is about to create
    cfg = Config() if args.config and not Path(args.config).exists() else load_config(args.config)
    answer = Settings.from_config(cfg, key)  # k and beta as the apps draft with them
    k, beta = answer.k, answer.beta
    t0 = time.perf_counter()
    if args.records:
        rows = _from_records(args, key, k, beta)
        where = ", ".join(rows.where)
    else:
        recs, where = record(args, key, k, beta, cfg)
        rows = rows_of(recs, k, beta, where)
    _refuse_few(rows.n, args.min_questions, where)
    before, label = cfg.evidence_calibration(key)
    result = fit(rows, rate)
    result["date"] = time.strftime("%Y-%m-%d")
    result["source"] = "records" if args.records else "recorded"
    path = save_evidence(key, result, args.config)
    mine = scores(result, rows) > result["tau"]
    theirs = scores(dict(before), rows) > float(before["tau"])
    took = time.perf_counter() - t0
    return "\n".join([
        f"fitted the evidence gate for {key} on {rows.n} questions ({result['n_confirmed']} confirmed; "
        f"{split_note(result)}) in {took:.0f} s",
        f"  read knots {len(result['read']['x'])}, memory knots {len(result['memory']['x'])}; "
        f"tau {result['tau']} reads {100 * float(np.mean(mine)):.1f}% of them (budget {rate:g})",
        f"  before: {label} (tau {before['tau']}), reading {100 * float(np.mean(theirs)):.1f}%; "
        f"{int(np.sum(mine != theirs))} of {rows.n} decisions change",
        f'wrote [evidence."{key}"] and [tau."{key}"] evidence to {path}',
        f"  targ ask / the chat / the server now say calibration: user, {rows.n} questions, {result['date']}",
    ])
