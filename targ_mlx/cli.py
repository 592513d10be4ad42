"""`python -m targ_mlx ask "question"`: answer one question and show the gate's decision."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid

from targ_mlx._blas import bind_openblas
from targ_mlx.defaults import (
    BIGGER_INDEX_HINT,
    DEFAULT_BETA,
    DEFAULT_CONTEXT_TOKENS,
    DEFAULT_N_SAMPLES,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    PROMPT_STYLES,
)
from targ_mlx.errors import QuestionError
from targ_mlx.flags import add_common_args, index_folders, open_index, settings_from_args
from targ_mlx.gates import SCORED_GATES

logger = logging.getLogger(__name__)


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="targ", description="TARG: answer with a local LLM, retrieving only when unsure.")
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="answer one question")
    ask.add_argument("question", help="the question (quote it)")
    add_common_args(ask)
    ask.add_argument("--beta", type=float, help=f"margin link temperature (default {DEFAULT_BETA:g})")
    ask.add_argument("--n-samples", type=int, help=f"variance gate: sampled prefixes (default {DEFAULT_N_SAMPLES})")
    ask.add_argument("--temp", type=float, help=f"variance gate: sampling temperature (default {DEFAULT_TEMPERATURE})")
    ask.add_argument("--seed", type=int, default=0, help="variance gate: RNG seed (default 0)")
    ask.add_argument("--top-k", type=int, help=f"passages to retrieve (default {DEFAULT_TOP_K})")
    ask.add_argument("--context-tokens", type=int, help=f"context budget L_ctx in tokens (default {DEFAULT_CONTEXT_TOKENS})")
    ask.add_argument("--recheck-every", type=int, default=0, help="re-check the gate every m tokens (default 0: off)")
    ask.add_argument("--prompt", choices=PROMPT_STYLES, default="paper",
                     help="paper: the paper's system prompt; short: few-shot short answers (default paper)")
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
    bind_openblas()  # before the first import of mlx.core (the assistant's)
    from targ_mlx.assistant import Assistant
    from targ_mlx.config import load_config
    from targ_mlx.runtime.backbone import load_backbone
    from targ_mlx.runtime.model_spec import model_key

    cfg = load_config(args.config).merged(model=args.model, db=args.db)
    settings = settings_from_args(args, cfg, model_key(cfg.model))  # fails before the model loads
    if args.chat and args.no_log:
        raise QuestionError("--chat continues a chat saved in the decision log; drop --no-log")
    log = None
    if not args.no_log:
        from targ_mlx.log.decisions import DecisionLog

        log = DecisionLog(cfg.db)
    history = chat_history(log, args.chat) if args.chat else []
    bb = load_backbone(cfg.model)
    chat = args.chat or uuid.uuid4().hex[:12]
    assistant = Assistant(bb, open_index(index_folders(args.index, cfg.index), args.retriever), settings, log=log, source="ask",
                          session=chat)
    ans = assistant.answer(args.question, history=history)
    if log is not None:  # the transcript, so `--chat ID` can continue it
        log.add_message(chat, "user", ans.question)
        log.add_message(chat, "assistant", ans.answer, assistant.last_decision_id)
    if args.json:
        record = ans.to_dict()
        record["tau"] = record["tau"] if ans.gate in SCORED_GATES else None  # never/always: +-inf, not JSON
        record["chat"] = chat if log is not None else None
        record["decision"] = assistant.last_decision_id  # what `targ label ID correct|wrong` labels
        print(json.dumps(record, ensure_ascii=False))
        return 0
    print(ans.answer)
    if ans.no_source:
        print("(no good source found in the index: answered from memory, and the model is unsure)")
        print(f"  {BIGGER_INDEX_HINT}", file=sys.stderr)
    u = "-" if ans.score is None else f"{ans.score:.3f}"
    op = ">" if ans.retrieved else "<="
    where = f"read {len(ans.passages)} passages" if ans.retrieved else "answered from memory"
    lat = ans.latency
    tau_s = f"{ans.tau:.3f}" if ans.gate in SCORED_GATES else "-"
    # what the stages do not account for: opening (on first use, building) the index and its encoder
    setup = lat.total - (lat.draft + lat.gate + lat.retrieval + lat.prefill + lat.decode)
    first = f"opening the index {setup:.2f}, " if setup >= 1.0 else ""
    print(f"[{ans.gate} U={u} {op} tau={tau_s}: {where}; {lat.total:.2f}s ({first}draft {lat.draft:.2f}, "
          f"search {lat.retrieval:.2f}, generation {lat.prefill + lat.decode:.2f})]", file=sys.stderr)
    if ans.reason:
        print(f"  why: {ans.reason}", file=sys.stderr)
    if ans.search_query and ans.search_query != ans.question:
        print(f"  searched: {ans.search_query}", file=sys.stderr)
    for p in ans.passages:  # cited: only what was read
        print(f"  [{p.score:.3f}] {p.title}", file=sys.stderr)
    if ans.searched and not ans.retrieved and ans.found:
        print("  searched, not read: " + "; ".join(f"[{p.score:.2f}] {p.title}" for p in ans.found[:3]),
              file=sys.stderr)
    if log is not None:
        print(f"  chat {chat}: continue with --chat {chat}", file=sys.stderr)
    return 0


def chat_history(log, chat: str) -> list:
    """The saved turns of chat `chat`; a clear error when the log has none."""
    from targ_mlx.conversation import turns_from_messages

    turns = turns_from_messages(log.messages(chat))
    if not turns:
        raise QuestionError(f"no chat {chat!r} in {log.path}; use the id `targ ask --json` printed as \"chat\" "
                            "(and the same --db)")
    return turns


def main(argv: list[str] | None = None) -> int:
    # first, before anything loads mlx.core
    bind_openblas()
    from targ_mlx.errors import run_cli

    return run_cli(setup_arg_parser(), dispatch, argv)


def label(args: argparse.Namespace) -> int:
    from targ_mlx.config import load_config
    from targ_mlx.log.decisions import DecisionLog

    db = load_config(args.config).merged(db=args.db).db
    with DecisionLog(db) as log:
        log.feedback(args.decision, args.label)
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
