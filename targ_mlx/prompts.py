"""Prompt builders: B(q) and B(q) + C as chat messages, and the context-budget packer.

Pure functions over strings and a tokenizer's `encode`; no model, no index.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from targ_mlx.defaults import PROMPT_STYLES  # noqa: F401
from targ_mlx.retrieval import Passage

SYSTEM_PROMPT = "You are a helpful assistant. Answer concisely and factually."  # the paper's default
SHORT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Answer the question with a short answer only "
    "(a name, date, number or short phrase), no full sentence."
)
# Few-shot turns that teach a small model to answer with the answer span only: with the
# paper's prompt SmolLM2 answers in sentences and exact match is 0 (measured on NQ-Open).
SHORT_EXAMPLES = (
    ("who wrote the novel pride and prejudice", "Jane Austen"),
    ("what is the capital city of australia", "Canberra"),
    ("in which year did the first man land on the moon", "1969"),
)


@dataclass(frozen=True)
class PackedContext:
    passages: tuple[Passage, ...]  # as they go into the prompt; the last one may be cut
    text: str
    tokens: int
    # what reading reads when it is not these passages (the selected sentences of a deeper search:
    # `pipeline.retrieve`); the gate looks at the passages above either way
    read: "PackedContext | None" = None
    # read="each": what the search found (its top reader.SUPPORT_FROM: the choice's evidence) and the
    # query the choice matches sentences on (in a chat, the search form carrying the conversation)
    found: tuple[Passage, ...] = ()
    query: str = ""

    @property
    def reading(self) -> "PackedContext":
        return self.read or self


def _user_turn(question: str, context: str | None) -> str:
    if not context:
        return question
    return f"Context:\n{context}\n\nQuestion: {question}"


def _pairs(turns: Sequence[tuple[str, str]]) -> list[dict]:
    out = []
    for q, a, *_ in turns:  # a conversation.Turn also says whether its answer had a source
        out += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return out


def messages(question: str, context: str | None = None, style: str = "paper",
             history: Sequence[tuple[str, str]] = ()) -> list[dict]:
    """Chat messages for B(q) (context None) or B(q) + C, after earlier (question, answer) turns."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style {style!r} unknown; choose one of {', '.join(PROMPT_STYLES)}")
    system = SYSTEM_PROMPT if style == "paper" else SHORT_SYSTEM_PROMPT
    examples = SHORT_EXAMPLES if style == "short" else ()
    return ([{"role": "system", "content": system}] + _pairs(examples) + _pairs(history)
            + [{"role": "user", "content": _user_turn(question, context)}])


def pack_context(passages: Sequence[Passage], budget: int, encode: Callable[[str], list[int]],
                 decode: Callable[[list[int]], str]) -> PackedContext:
    """Format passages as `[title] text`, one per line, keeping at most `budget` tokens.

    Passages are taken in rank order; the first one that does not fit is cut at a token
    boundary (if at least a few tokens of it fit) and the rest are dropped.
    """
    kept: list[Passage] = []
    lines: list[str] = []
    used = 0
    for p in passages:
        line = p.format()
        ids = encode(("\n" if lines else "") + line)
        if used + len(ids) <= budget:
            kept.append(p)
            lines.append(line)
            used += len(ids)
            continue
        room = budget - used
        if room >= 16:  # a stub of a few tokens is noise, not context
            cut = decode(ids[:room]).lstrip("\n")
            title_len = len(p.title) + 3
            kept.append(replace(p, text=cut[title_len:] if len(cut) > title_len else ""))
            lines.append(cut)
            used += room
        break
    return PackedContext(tuple(kept), "\n".join(lines), used)
