"""`python -m targ_mlx ask "question"`: answer one question and show the gate's decision."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid

from targ_mlx.conversation import DEFAULT_HISTORY_TOKENS, DEFAULT_REWRITE, REWRITE_METHODS
from targ_mlx.errors import QuestionError
from targ_mlx.gates import GATES

logger = logging.getLogger(__name__)


def add_common_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by `targ ask` and the chat app (`targ-chat`); None means "from config"."""
    p.add_argument("--model", help="alias (smollm2-135m, the offline default), .gguf path, MLX folder or mlx-lm repo id")
    p.add_argument("--index", help="index folder (default: the offline default index, built on first use)")
    p.add_argument("--db", help="decision log (default: decisions.db under the user data dir)")
    p.add_argument("--config", help="config TOML (default: config.toml under the user config dir)")
    p.add_argument("--gate", choices=GATES, help="gate (default from config: margin)")
    p.add_argument("--tau", type=float, help="retrieve iff U > tau (default: calibrated value from config, else a placeholder)")
    p.add_argument("--k", type=int, help="draft length in tokens (default 20)")
    p.add_argument("--max-tokens", type=int, help="answer length cap (default 32)")


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="targ", description="TARG: answer with a local LLM, retrieving only when unsure.")
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="answer one question")
    ask.add_argument("question", help="the question (quote it)")
    add_common_args(ask)
    ask.add_argument("--beta", type=float, help="margin link temperature (default 3)")
    ask.add_argument("--n-samples", type=int, help="variance gate: sampled prefixes (default 5)")
    ask.add_argument("--temp", type=float, help="variance gate: sampling temperature (default 0.7)")
    ask.add_argument("--seed", type=int, default=0, help="variance gate: RNG seed (default 0)")
    ask.add_argument("--top-k", type=int, help="passages to retrieve (default 5)")
    ask.add_argument("--context-tokens", type=int, help="context budget L_ctx in tokens (default 1024)")
    ask.add_argument("--recheck-every", type=int, default=0, help="re-check the gate every m tokens (default 0: off)")
    ask.add_argument("--prompt", choices=("paper", "short"), default="paper",
                     help="paper: the paper's system prompt; short: few-shot short answers (default paper)")
    ask.add_argument("--chat", metavar="ID", help="continue the saved chat ID (its earlier turns go into the prompt); "
                     "--json prints the id each answer was saved under (default: a new single-turn chat)")
    ask.add_argument("--history-tokens", type=int, default=DEFAULT_HISTORY_TOKENS,
                     help=f"with --chat: tokens of earlier turns kept, oldest dropped first (default {DEFAULT_HISTORY_TOKENS})")
    ask.add_argument("--rewrite", choices=REWRITE_METHODS, default=DEFAULT_REWRITE,
                     help=f"with --chat: how a follow-up becomes a standalone search query (default {DEFAULT_REWRITE})")
    ask.add_argument("--no-log", action="store_true", help="do not write the decision log")
    ask.add_argument("--json", action="store_true", help="print the result record as one JSON object")
    return parser


def open_index(path: str | None):
    """A zero-argument loader for the retriever, so answers that skip retrieval never load it."""

    def load():
        from targ_mlx import index
        from targ_mlx.index.progress import ProgressBar

        folder = path or index.ensure_default_index(progress=ProgressBar())
        return index.open_retriever(folder)

    return load


def ask(args: argparse.Namespace) -> int:
    from targ_mlx.assistant import Assistant, Settings
    from targ_mlx.backbone import load_backbone
    from targ_mlx.config import load_config

    cfg = load_config(args.config).merged(model=args.model, gate=args.gate, k=args.k, beta=args.beta,
                                          n_samples=args.n_samples, temperature=args.temp, top_k=args.top_k,
                                          context_tokens=args.context_tokens, max_tokens=args.max_tokens,
                                          index=args.index, db=args.db)
    if args.chat and args.no_log:
        raise QuestionError("--chat continues a chat saved in the decision log; drop --no-log")
    log = None
    if not args.no_log:
        from targ_mlx.decision_log import DecisionLog

        log = DecisionLog(cfg.db)
    history = chat_history(log, args.chat) if args.chat else []
    bb = load_backbone(cfg.model)
    tau = args.tau if args.tau is not None else (cfg.tau_for(bb.model_id, cfg.gate) if cfg.gate in ("entropy", "margin", "variance") else None)
    settings = Settings(gate=cfg.gate, tau=tau, k=cfg.k, beta=cfg.beta, n_samples=cfg.n_samples,
                        temperature=cfg.temperature, seed=args.seed, top_k=cfg.top_k,
                        context_tokens=cfg.context_tokens, max_tokens=cfg.max_tokens,
                        recheck_every=args.recheck_every, prompt_style=args.prompt,
                        history_tokens=args.history_tokens, rewrite=args.rewrite)
    chat = args.chat or uuid.uuid4().hex[:12]
    assistant = Assistant(bb, open_index(cfg.index), settings, log=log, source="ask", session=chat)
    ans = assistant.answer(args.question, history=history)
    if log is not None:  # the transcript, so `--chat ID` can continue it
        log.add_message(chat, "user", ans.question)
        log.add_message(chat, "assistant", ans.answer, assistant.last_decision_id)
    if args.json:
        print(json.dumps({**ans.to_dict(), "chat": chat if log is not None else None}, ensure_ascii=False))
        return 0
    print(ans.answer)
    u = "-" if ans.score is None else f"{ans.score:.3f}"
    op = ">" if ans.retrieved else "<="
    where = f"retrieved {len(ans.passages)} passages" if ans.retrieved else "answered without retrieval"
    lat = ans.latency
    tau_s = f"{ans.tau:.3f}" if ans.gate in ("entropy", "margin", "variance") else "-"
    print(f"[{ans.gate} U={u} {op} tau={tau_s}: {where}; {lat.total:.2f}s (draft {lat.draft:.2f}, "
          f"retrieval {lat.retrieval:.2f}, generation {lat.prefill + lat.decode:.2f})]", file=sys.stderr)
    if ans.search_query and ans.search_query != ans.question:
        print(f"  searched: {ans.search_query}", file=sys.stderr)
    for p in ans.passages:
        print(f"  [{p.score:.3f}] {p.title}", file=sys.stderr)
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
    args = setup_arg_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from targ_mlx.errors import run_main

    return run_main(ask, args)


if __name__ == "__main__":
    sys.exit(main())
