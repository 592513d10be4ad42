"""`python -m targ_mlx ask "question"`: answer one question and show the gate's decision."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from targ_mlx import bind_openblas
from targ_mlx.defaults import BIGGER_INDEX_HINT
from targ_mlx.errors import check_text, run_cli
from targ_mlx.gates import SCORED_GATES
from targ_mlx.records import verdict
from targ_mlx.session.open import open_session
from targ_mlx.session.options import add_common_args, config_from_args

logger = logging.getLogger(__name__)


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="targ", description="TARG: answer with a local LLM, retrieving only when unsure.")
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="answer one question")
    ask.add_argument("question", help="the question (quote it)")
    add_common_args(ask, "ask")
    ask.add_argument("--chat", metavar="ID", help="continue the saved chat ID (its earlier turns go into the prompt); "
                     "--json prints the id each answer was saved under (default: a new single-turn chat)")
    ask.add_argument("--no-log", action="store_true", help="do not write the decision log")
    ask.add_argument("--json", action="store_true", help="print the result record as one JSON object")
    label = sub.add_parser("label", help="label a logged answer correct or wrong (for targ-calibrate refit)")
    label.add_argument("decision", type=int, help='the answer\'s decision id (`targ ask --json` prints it as "decision")')
    label.add_argument("label", choices=("correct", "wrong", "helpful", "unhelpful"), help="your verdict on the answer")
    label.add_argument("--db", help="decision log (default: the config's)")
    label.add_argument("--config", help="config file (default: the user config)")
    from targ_mlx.server.__main__ import add_serve_args

    serve = sub.add_parser("serve", help="serve the assistant on an OpenAI-compatible local API (/v1/chat/completions)")
    add_serve_args(serve)
    return parser


def ask(args: argparse.Namespace) -> int:
    bind_openblas()  # before the first import of mlx.core (the session's)
    check_text(args.question)  # bad values are one line before the model loads
    session = open_session(config_from_args(args), log=not args.no_log, chat=args.chat)
    for event in session.ask(args.question):  # drafted, searched, decided, text..., done
        last = event
    ans = last.answer
    logged = session.logs
    if args.json:
        record = ans.to_dict()
        record["tau"] = record["tau"] if ans.gate in SCORED_GATES else None  # never/always: +-inf, not JSON
        record["chat"] = session.session if logged else None
        record["decision"] = session.last_decision_id  # what `targ label ID correct|wrong` labels
        print(json.dumps(record, ensure_ascii=False))
        return 0
    print(ans.answer)
    if ans.no_source:
        print("(no good source found in the index: answered from memory, and the model is unsure)")
        print(f"  {BIGGER_INDEX_HINT}", file=sys.stderr)
    u = "-" if ans.score is None else f"{ans.score:.3f}"
    op = ">" if ans.retrieved else "<="
    where = verdict(ans.retrieved, len(ans.passages))
    lat = ans.latency
    tau_s = f"{ans.tau:.3f}" if ans.gate in SCORED_GATES else "-"
    # what the stages do not account for: opening (on first use, building) the index and its encoder
    setup = lat.total - lat.busy()
    first = f"opening the index {setup:.2f}, " if setup >= 1.0 else ""
    print(f"[{ans.gate} U={u} {op} tau={tau_s}: {where}; {lat.total:.2f}s ({first}draft {lat.draft:.2f}, "
          f"search {lat.retrieval:.2f}{' beside it' if lat.overlap else ''}, generation {lat.prefill + lat.decode:.2f})]", file=sys.stderr)
    if ans.reason:
        print(f"  why: {ans.reason}", file=sys.stderr)
    if ans.search_query and ans.search_query != ans.question:
        print(f"  searched: {ans.search_query}", file=sys.stderr)
    for p in ans.passages:  # cited: only what was read
        print(f"  [{p.score:.3f}] {p.title}", file=sys.stderr)
    if ans.searched and not ans.retrieved and ans.found:
        print("  searched, not read: " + "; ".join(f"[{p.score:.2f}] {p.title}" for p in ans.found[:3]),
              file=sys.stderr)
    if logged:
        print(f"  chat {session.session}: continue with --chat {session.session}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    # first, before anything loads mlx.core
    bind_openblas()

    return run_cli(setup_arg_parser(), dispatch, argv)


def label(args: argparse.Namespace) -> int:
    from targ_mlx.session import label_decision

    db = label_decision(args.decision, args.label, args.db, args.config)
    print(f"decision {args.decision} labelled {args.label} in {db}")
    return 0


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "label":
        return label(args)
    if args.command == "serve":
        from targ_mlx.server.__main__ import serve

        return serve(args)
    return ask(args)


if __name__ == "__main__":
    sys.exit(main())
