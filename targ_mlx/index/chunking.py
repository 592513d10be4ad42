"""Cut article text into overlapping passages, and give each passage a stable key.

The paper's scheme: ~1,000 characters, 100 characters of overlap, minimum 200. Cuts fall on a
sentence end when one lies in the back half of the window, else on a word boundary. The chunker
knows nothing of encoders or indexes: text in, (start, end) offsets out.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass
from typing import Iterator, Sequence

DEFAULT_SIZE = 1000
DEFAULT_OVERLAP = 100
DEFAULT_MIN_SIZE = 200

# A sentence ends at . ! ? (optionally closed by a quote or bracket) followed by whitespace.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]?\s+|\n\s*")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class ChunkParams:
    size: int = DEFAULT_SIZE  # target characters per chunk
    overlap: int = DEFAULT_OVERLAP  # characters shared with the previous chunk
    min_size: int = DEFAULT_MIN_SIZE  # shorter articles are skipped, shorter tails merged

    def __post_init__(self) -> None:
        if not 0 < self.min_size <= self.size:
            raise ValueError(f"min_size must be in (0, size={self.size}], got {self.min_size}")
        if not 0 <= self.overlap < self.min_size:
            raise ValueError(f"overlap must be in [0, min_size={self.min_size}), got {self.overlap}")


@dataclass(frozen=True)
class Chunk:
    key: int  # stable id: hash of (corpus, article id, start offset), fits SQLite and usearch
    title: str
    text: str
    article: str  # article id within its corpus
    source: str  # corpus label, e.g. "vital-articles"
    start: int  # character offsets of `text` in the article text
    end: int


def chunk_key(source: str, article: str, start: int) -> int:
    """63-bit key, the same on every rebuild of the same corpus (SQLite integers are signed)."""
    digest = hashlib.blake2b(f"{source}\x00{article}\x00{start}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def _cut(text: str, start: int, end: int, params: ChunkParams) -> int:
    """Best cut in text[start:end]: last sentence end in the back half, else last space."""
    lo = start + max(params.min_size, params.size // 2)
    best = -1
    for m in _SENTENCE_END.finditer(text, lo, end):
        best = m.end()
    if best > lo:
        return best
    space = text.rfind(" ", start + params.min_size, end)
    return space + 1 if space > start else end


def split_text(text: str, params: ChunkParams = ChunkParams()) -> list[tuple[int, int]]:
    """Offsets of the chunks of `text`; empty if the whole text is shorter than min_size.

    Args:
        text: article text (already cleaned).
        params: size, overlap and minimum (the paper's 1000/100/200 by default).

    Returns:
        (start, end) pairs; text[start:end] is a chunk. Consecutive chunks overlap by about
        `overlap` characters, moved forward to the next word start.
    """
    n = len(text.rstrip())
    if n < params.min_size:
        return []
    spans: list[tuple[int, int]] = []
    start = 0
    while True:
        if n - start <= params.size:
            spans.append((start, n))
            return spans
        end = _cut(text, start, start + params.size, params)
        if n - end < params.min_size - params.overlap:
            # the tail would make a chunk under min_size: give it to this chunk instead
            spans.append((start, n))
            return spans
        spans.append((start, end))
        nxt = end - params.overlap
        space = text.find(" ", nxt, end)
        nxt = space + 1 if space != -1 else nxt
        while nxt < n and text[nxt].isspace():
            nxt += 1
        start = max(nxt, start + 1)


def chunk_article(
    source: str, article: str, title: str, text: str, params: ChunkParams = ChunkParams(),
    pages: Sequence[int] = (), keep_short: bool = False,
) -> Iterator[Chunk]:
    """Yield the chunks of one article, each carrying the article title; with `pages` (page start
    offsets, e.g. of a PDF), the title names the chunk's pages: "TITLE p. 3" or "TITLE p. 3-4".

    With `keep_short` a text below the minimum is one passage instead of none: a Wikipedia stub
    is noise, a 195-character memo of your own is the thing you will ask about."""
    spans = split_text(text, params)
    if not spans and keep_short and text.strip():
        spans = [(0, len(text.rstrip()))]
    for start, end in spans:
        body = text[start:end].strip()
        named = title
        if pages:
            first, last = bisect.bisect_right(pages, start), bisect.bisect_right(pages, end - 1)
            named = f"{title} p. {first}" + (f"-{last}" if last != first else "")
        yield Chunk(chunk_key(source, article, start), named, body, article, source, start, end)


def normalise_space(text: str) -> str:
    """Collapse runs of spaces and tabs, keep paragraph breaks (readers call this once)."""
    paras = (_SPACE.sub(" ", p).strip() for p in re.split(r"\n\s*\n", text))
    return "\n\n".join(p for p in paras if p)
