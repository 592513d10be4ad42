"""Slash commands of the chat app: parsing, completion, help and Markdown export.

Pure functions over strings and numbers, so they are tested without the app; nothing here
imports Textual or touches the model, the index or the disk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from targ_mlx.defaults import DEFAULT_GATE
from targ_mlx.gates import GATES
from targ_mlx.session import flag_fields

# the app's keys, for /help
KEYS = (("Enter", "send"), ("Ctrl+J / Alt+Enter", "new line"), ("Tab", "complete a /command"),
        ("Esc", "stop the answer"), ("F2 / F3", "mark the answer correct / wrong"), ("F4", "copy the answer"),
        ("Ctrl+N", "new chat"), ("Ctrl+R", "reopen the last chat"), ("Ctrl+P", "command palette"), ("Ctrl+Q", "quit"))

# name -> (usage, help); the order is the order of /help and of the command palette
COMMANDS: dict[str, tuple[str, str]] = {
    "gate": ("/gate " + "|".join(GATES), f"choose the retrieval gate (default {DEFAULT_GATE})"),
    "tau": ("/tau X", "retrieve iff U > X"),
    "budget": ("/budget RHO", "set tau so that a fraction RHO of logged questions retrieve"),
    "k": ("/k N", "draft length in tokens for the gate"),
    "set": ("/set NAME VALUE", "change any answer setting for this chat by its name, as its targ-chat flag takes it "
                               "(/set read each, /set top_k 3, /set rewrite questions); /set alone lists them"),
    "recalibrate": ("/recalibrate [RHO]", "fit tau from the log: accuracy if labelled, else a budget"),
    "model": ("/model SPEC", "load another model (alias, .gguf path or mlx-lm repo id)"),
    "index": ("/index [add] DIR | get NAME", "open another index folder (an unfinished build resumes); with add, "
                                             "search it beside the open ones; get simplewiki (online) or get PATH "
                                             "builds a bigger index in the background and searches it too"),
    "export": ("/export [FILE]", "write this chat to Markdown"),
    "new": ("/new", "start a new chat"),
    "help": ("/help", "list commands and keys"),
}
_ARGS = {"gate": GATES, "index": ("add", "get")}
GET_NAMES = ("simplewiki",)  # what `/index get ` completes


class CommandError(ValueError):
    """A slash command the app cannot run as typed; the message says what to type instead."""


@dataclass(frozen=True)
class Command:
    name: str
    value: Any = None  # parsed argument: str | float | int | None


def is_command(text: str) -> bool:
    return text.lstrip().startswith("/")


def parse(text: str) -> Command:
    """`/gate margin` -> Command("gate", "margin"); raises CommandError with the fix."""
    head, _, arg = text.strip()[1:].partition(" ")
    name, arg = head.lower(), arg.strip()
    if name not in COMMANDS:
        raise CommandError(f"unknown command /{head}; type /help for the list")
    usage = COMMANDS[name][0]
    if name == "gate":
        if arg.lower() not in GATES:
            raise CommandError(f"/gate takes one of {', '.join(GATES)}; got {arg!r}")
        return Command(name, arg.lower())
    if name in ("tau", "budget") or (name == "recalibrate" and arg):
        value = _number(arg, usage)
        if name != "tau" and not 0.0 <= value <= 1.0:
            raise CommandError(f"{usage}: RHO is a retrieval rate in [0, 1]; got {arg}")
        return Command(name, value)
    if name == "k":
        try:
            k = int(arg)
        except ValueError:
            raise CommandError(f"{usage}: N is a whole number of tokens >= 1; got {arg!r}") from None
        if k < 1:
            raise CommandError(f"{usage}: N must be >= 1; got {k}")
        return Command(name, k)
    if name == "set":
        return Command(name, _setting(arg) if arg else None)
    if name == "index" and arg.partition(" ")[0].lower() == "get":
        what = arg.partition(" ")[2].strip()
        if not what:
            raise CommandError("/index get NAME: missing NAME; fix: /index get simplewiki (online), "
                               "or /index get PATH (a local corpus file or folder)")
        return Command(name, f"get {what}")
    if name in ("model", "index"):
        if not arg:
            raise CommandError(f"{usage}: missing {usage.split()[-1]}")
        return Command(name, arg)
    return Command(name, arg or None)


def _setting(arg: str) -> tuple[str, Any]:
    """`read each` -> ("read", "each"): the setting's name (a flag's, dashes or not) and its value,
    converted and checked as the flag converts it."""
    head, _, raw = arg.partition(" ")
    name, raw = head.lower().lstrip("-").replace("-", "_"), raw.strip()
    fields = flag_fields("chat")
    if name not in fields:
        raise CommandError(f"/set {head}: no such setting; one of {', '.join(fields)}")
    meta = fields[name].metadata
    if not raw:
        raise CommandError(f"/set {name} VALUE: missing VALUE" + (f" (one of {', '.join(meta['choices'])})"
                                                                  if meta["choices"] else ""))
    if meta["choices"]:
        if raw.lower() not in meta["choices"]:
            raise CommandError(f"/set {name} takes one of {', '.join(meta['choices'])}; got {raw!r}")
        return name, raw.lower()
    if meta["type"] in (int, float):
        try:
            value = meta["type"](raw)
        except ValueError:
            kind = "a whole number" if meta["type"] is int else "a number"
            raise CommandError(f"/set {name}: expected {kind}; got {raw!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise CommandError(f"/set {name}: expected a finite number; got {raw!r}")
        return name, value
    return name, "" if raw.lower() == "off" else raw


def _number(arg: str, usage: str) -> float:
    try:
        value = float(arg)
    except ValueError:
        raise CommandError(f"{usage}: expected a number; got {arg!r}") from None
    if not math.isfinite(value):
        raise CommandError(f"{usage}: expected a finite number; got {arg!r}")
    return value


def complete(text: str) -> list[str]:
    """Completions of a partly typed command line (whole lines, e.g. '/gate margin')."""
    if not is_command(text):
        return []
    head, space, arg = text.lstrip()[1:].partition(" ")
    if not space:
        return [f"/{name}" for name in COMMANDS if name.startswith(head.lower())]
    if head.lower() == "index" and arg.lstrip().lower().startswith("get "):
        typed = arg.lstrip()[4:].strip().lower()
        return [f"/index get {n}" for n in GET_NAMES if n.startswith(typed)]
    if head.lower() == "set":  # a setting's name, then its choices
        field, space2, value = arg.lstrip().partition(" ")
        fields = flag_fields("chat")
        if not space2:
            return [f"/set {n}" for n in fields if n.startswith(field.lower())]
        choices = fields[field.lower()].metadata["choices"] or () if field.lower() in fields else ()
        return [f"/set {field.lower()} {c}" for c in choices if c.startswith(value.strip().lower())]
    options = _ARGS.get(head.lower(), ())
    return [f"/{head.lower()} {opt}" for opt in options if opt.startswith(arg.strip().lower())]


def common_prefix(options: Sequence[str]) -> str:
    if not options:
        return ""
    first, last = min(options), max(options)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


def hint(text: str) -> str:
    """One line under the input while a command is typed: matching usages."""
    if not is_command(text):
        return ""
    head = text.lstrip()[1:].partition(" ")[0].lower()
    names = [n for n in COMMANDS if n.startswith(head)] if head not in COMMANDS else [head]
    return "   ".join(f"{COMMANDS[n][0]}" for n in names) or "no such command; /help lists them"


def help_text(keys: Sequence[tuple[str, str]] = ()) -> str:
    width = max(len(usage) for usage, _ in COMMANDS.values())
    lines = ["Commands:"] + [f"  {usage:<{width}}  {text}" for usage, text in COMMANDS.values()]
    if keys:
        lines.append("Keys:")
        lines += [f"  {key:<{width}}  {text}" for key, text in keys]
    return "\n".join(lines)


def duration(seconds: float) -> str:
    """'45 s', '3 min 20 s', '2 h 5 min': an ETA or an elapsed time in a chat line."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def build_progress(title: str, done: int, total: int, first: int, elapsed: float) -> str:
    """The chat's line for a running `/index get`: chunks, percent and ETA where the total is known
    (a plain local file is counted first; an online stream or a compressed file is not), rate, and
    where a resumed build began."""
    rate = (done - first) / elapsed if elapsed > 0 else 0.0
    head = f"building {title} (BM25 only, in the background): "
    if total:
        line = f"{done:,}/{total:,} chunks ({100 * done / total:.0f}%)"
        if rate > 0 and done < total:
            line += f", ETA {duration((total - done) / rate)}"
    else:
        line = f"{done:,} chunks so far (no total in advance for a stream or a compressed file)"
    if rate > 0:
        line += f", {rate:,.0f} chunks/s"
    if first:
        line += f"; resumed at chunk {first:,}"
    return head + line


def export_markdown(title: str, turns: Sequence[tuple[str, str, dict | None]]) -> str:
    """A chat as Markdown. `turns`: (role, text, decision row or None) in order."""
    out = [f"# {title}", ""]
    for role, text, row in turns:
        out += [f"**{'You' if role == 'user' else 'Assistant'}:** {text}", ""]
        if row:
            u = "-" if row.get("u") is None else f"{row['u']:.3f}"
            tau = "-" if row.get("tau") is None else f"{row['tau']:.3f}"
            what = "retrieved" if row.get("retrieved") else "no retrieval"
            out += [f"> {row.get('gate')} U={u} tau={tau}: {what}, {row.get('lat_total') or 0:.2f}s", ""]
            for i, p in enumerate(row.get("passages") or [], 1):
                out.append(f"> [{i}] {p['title']} ({p['score']:.3f})")
            if row.get("passages"):
                out.append("")
    return "\n".join(out).rstrip() + "\n"
