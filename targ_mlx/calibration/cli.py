"""`targ-calibrate` (`python -m targ_mlx.calibration`): fit the gate threshold tau from the decision log.

Two objectives, as in the paper:
  --budget RHO           tau = empirical F_U^-1(1 - RHO) of the logged U (retrieval rate ~ RHO)
  --objective accuracy   tau maximising mean correctness over rows that carry labels

Rows that count as labelled for accuracy:
  * rows with both counterfactual branches scored (eval runs: em_never and em_always, or f1_*
    with --metric f1) use them as they are;
  * other rows with user feedback tell us about the branch that ran only, so we read the label
    as a vote on the decision: a good answer (correct / helpful) after retrieving, or a bad one
    without, votes "retrieve"; the other two cases vote "do not retrieve". The unseen branch is
    taken to have gone the other way, which favours the cheaper choice when both were fine.

`--write` stores tau for (model, gate) in the config file that `targ ask` and the chat app read.

`targ-calibrate fit --model SPEC --data-file QA.jsonl` fits the evidence gate's calibrations
themselves to a model (`calibration.fit`); `targ-calibrate refit` refits them from the user's
labels (`calibration.refit`).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from targ_mlx.calibration.thresholds import (
    accuracy_threshold,
    budget_threshold,
    gated_accuracy,
    retrieval_rate,
    text_histogram,
)
from targ_mlx.config import GATES, Config, default_config_path, load_config, save_tau
from targ_mlx.errors import run_cli
from targ_mlx.calibration.rows import MIN_ROWS, NotEnoughRowsError, labelled_rows, score_rows
from targ_mlx.log.decisions import SOURCES, DecisionLog
from targ_mlx.settings import Settings

DEFAULT_BINS = 20
_SPAN = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """`7d`, `12h`, `30m`, `2w`, `90s`, or an ISO date/time (UTC if no zone) -> UTC datetime."""
    now = now or datetime.now(timezone.utc)
    match = _SPAN.match(text.strip())
    if match:
        return now - timedelta(**{_UNITS[match[2]]: float(match[1])})
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since {text!r} is neither a span like 7d, 12h, 30m, 2w nor an ISO date like 2026-08-01"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="targ-calibrate",
        description="Fit the retrieval gate's threshold tau from the decision log "
                    "(`targ-calibrate fit --help`: fit the evidence gate's calibrations to a model).",
    )
    parser.add_argument(
        "--db", help="decision log (default: the config's db, under the user data dir)"
    )
    parser.add_argument(
        "--config",
        help=f"config file to read and --write (default: {default_config_path()})",
    )
    parser.add_argument(
        "--gate",
        choices=GATES,
        help="gate whose U to calibrate (default: config, margin)",
    )
    parser.add_argument(
        "--k", type=int, help="prefix length of the rows to use (default: config, 20)"
    )
    parser.add_argument(
        "--model",
        help="only rows of this model (default: all; needed for --write if several)",
    )
    parser.add_argument(
        "--beta", type=float, help="only rows with this margin beta (default: any)"
    )
    parser.add_argument(
        "--since", help="only rows newer than this: 7d, 12h, 30m, 2w or an ISO date"
    )
    parser.add_argument(
        "--source",
        choices=SOURCES,
        help="only rows from chat, eval or ask (default: all)",
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--budget", type=float, metavar="RHO", help="target retrieval rate in [0, 1]"
    )
    target.add_argument(
        "--objective", choices=["accuracy"], help="maximise accuracy on labelled rows"
    )
    parser.add_argument(
        "--metric", choices=["em", "f1"], default="em",
        help="correctness of eval branches for --objective accuracy (default: em)",
    )  # fmt: skip
    parser.add_argument(
        "--min-rows",
        type=int,
        default=MIN_ROWS,
        help=f"refuse below this many usable rows (default: {MIN_ROWS})",
    )
    parser.add_argument(
        "--bins",
        type=int,
        default=DEFAULT_BINS,
        help=f"histogram bins (default: {DEFAULT_BINS})",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="store tau for (model, gate) in the config file",
    )
    return parser


def _config(path: str | None) -> Config:
    # --config may name a file that --write is about to create.
    if path is not None and not Path(path).exists():
        return Config()
    return load_config(path)


def run(args: argparse.Namespace) -> str:
    """Calibrate as `args` say; returns the report text."""
    cfg = _config(args.config)
    app = Settings.from_config(cfg, args.model or "")  # the gate and k the apps run with
    gate = args.gate or (app.gate if app.gate in GATES else "margin")
    k = args.k if args.k is not None else app.k
    db_path = Path(args.db or cfg.db)
    if not db_path.exists():
        raise FileNotFoundError(
            f"Decision log not found: {db_path} (log some answers with targ ask/chat/eval, or pass --db)"
        )
    since = parse_since(args.since) if args.since else None
    with DecisionLog(db_path) as log:
        rows = score_rows(
            log, gate, k, model=args.model, since=since, source=args.source, beta=args.beta
        )

    what = f"gate {gate}, k={k}" + "".join(
        f", {name}={value}"
        for name, value in (
            ("model", args.model),
            ("source", args.source),
            ("since", args.since),
            ("beta", args.beta),
        )
        if value is not None
    )
    if args.budget is not None:
        u = [r.u for r in rows]
        used = f"{len(u)} rows with u_{gate}"
    else:
        labelled = labelled_rows(rows, args.metric)
        u = labelled.u
        used = (
            f"{len(u)} labelled rows ({labelled.from_branches} with both branches scored, "
            f"{labelled.from_feedback} with feedback) of {len(rows)} with u_{gate}"
        )
    if len(u) < args.min_rows:
        raise NotEnoughRowsError(
            f"Only {len(u)} usable rows for {what} in {db_path} (need {args.min_rows}); "
            "log more answers, or widen --since / --source / --model"
        )

    lines = [f"{what}: {used}"]
    if args.budget is not None:
        tau = budget_threshold(u, args.budget)
        lines.append(f"tau = {tau!r}  (budget rho = {args.budget:g})")
    else:
        tau = accuracy_threshold(u, labelled.correct_never, labelled.correct_always)
        acc = gated_accuracy(u, tau, labelled.correct_never, labelled.correct_always)
        never = sum(labelled.correct_never) / len(u)
        always = sum(labelled.correct_always) / len(u)
        lines.append(f"tau = {tau!r}  (max mean {args.metric} on labelled rows)")
        lines.append(
            f"gated {args.metric} = {acc:.4f}  (never {never:.4f}, always {always:.4f})"
        )
    rate = retrieval_rate(u, tau)
    lines.append(
        f"predicted retrieval rate = {100 * rate:.1f}% ({round(rate * len(u))}/{len(u)} rows)"
    )
    lines.append(text_histogram(u, tau, bins=args.bins))

    if args.write:
        models = sorted({r.model for r in rows})
        model = args.model or (models[0] if len(models) == 1 else None)
        if model is None:
            raise ValueError(
                f"Rows come from several models ({', '.join(models)}); pass --model to --write"
            )
        written = save_tau(model, gate, tau, args.config)
        lines.append(f'wrote [tau."{model}"] {gate} = {tau!r} to {written}')
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    if args.budget is not None and not 0.0 <= args.budget <= 1.0:
        raise ValueError(f"--budget must be a retrieval rate in [0, 1]; got {args.budget}")
    print(run(args))
    return 0


def fit_arg_parser() -> argparse.ArgumentParser:
    from targ_mlx.calibration.fit import add_fit_args

    parser = argparse.ArgumentParser(
        prog="targ-calibrate fit",
        description="Fit the evidence gate's calibrations and tau to a model: record N questions with it, "
                    "fit, and write them to the config under the model's key.",
    )
    add_fit_args(parser)
    return parser


def _fit(args: argparse.Namespace) -> int:
    from targ_mlx.calibration.fit import fit_command

    print(fit_command(args))
    return 0


def refit_arg_parser() -> argparse.ArgumentParser:
    from targ_mlx.calibration.refit import MIN_LABELS

    parser = argparse.ArgumentParser(
        prog="targ-calibrate refit",
        description="Refit the evidence gate's calibrations for a model from the labels on its logged decisions "
                    "(each label speaks for the branch that ran), and tau with them; --write stores them.",
    )
    parser.add_argument("--model", required=True, help="the model key whose decisions to read (as the log names it)")
    parser.add_argument("--db", help="decision log (default: the config's db)")
    parser.add_argument("--config", help=f"config file to read and --write (default: {default_config_path()})")
    parser.add_argument("--prior", type=float, metavar="N",
                        help="how many questions the current calibration counts for (default: its n)")
    parser.add_argument("--budget", type=float, metavar="RHO",
                        help="reading rate for tau (default: the rate the current tau reads the logged questions at)")
    parser.add_argument("--min-labels", type=int, default=MIN_LABELS,
                        help=f"refuse below this many labelled decisions (default {MIN_LABELS})")
    parser.add_argument("--write", action="store_true", help="store the refitted calibration and tau in the config")
    return parser


def refit_report(args: argparse.Namespace) -> str:
    from targ_mlx.config import save_evidence
    from targ_mlx.calibration.refit import refit_from_log

    cfg = _config(args.config)
    db_path = Path(args.db or cfg.db)
    if not db_path.exists():
        raise FileNotFoundError(f"Decision log not found: {db_path} (label some answers first, or pass --db)")
    if args.budget is not None and not 0.0 < args.budget < 1.0:
        raise ValueError(f"--budget must be a reading rate in (0, 1); got {args.budget}")
    if args.prior is not None and args.prior <= 0:
        raise ValueError(f"--prior must be > 0 questions; got {args.prior}")
    cal, label = cfg.evidence_calibration(args.model)
    app = Settings.from_config(cfg, args.model, gate="evidence")  # its tau, k and beta as the apps use them
    with DecisionLog(db_path) as log:
        r = refit_from_log(log, args.model, app.k, app.beta, cal, app.tau, args.prior, args.min_labels, args.budget)
    lines = [f"refit of the evidence gate for {args.model} from {r.calibration['feedback']} labelled decisions "
             f"(from {label}, counted as {args.prior or cal.get('n', 300):g} questions)"]
    for name, rows in r.used.items():
        lines.append(f"  {name:<18} {rows:4d} labelled rows, moved by at most {100 * r.moved.get(name, 0):.1f} points")
    lines.append(f"  tau {r.tau_before:.6g} -> {r.tau_after:.6g}, reading {100 * r.rate:.0f}% of the {r.logged} logged "
                 f"questions (the old calibration on them: tau {r.tau_unlabelled:.6g})")
    if args.write:
        fit = {**r.calibration, "date": time.strftime("%Y-%m-%d"), "source": "feedback"}
        path = save_evidence(args.model, fit, args.config)
        lines.append(f'wrote [evidence."{args.model}"] and [tau."{args.model}"] evidence to {path}')
    return "\n".join(lines)


def _refit(args: argparse.Namespace) -> int:
    print(refit_report(args))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["refit"]:
        return run_cli(refit_arg_parser(), _refit, argv[1:])
    if argv[:1] == ["fit"]:
        from targ_mlx import bind_openblas

        bind_openblas()  # it may load a model: bind before mlx.core loads
        return run_cli(fit_arg_parser(), _fit, argv[1:], interrupted="interrupted; rerun the same command to continue")
    return run_cli(setup_arg_parser(), _main, argv)
