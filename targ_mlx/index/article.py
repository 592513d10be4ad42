"""What every corpus reader yields: one article (or document) at a time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Article:
    id: str  # stable within its corpus: page id, line id, title, or a document's path
    title: str
    text: str
    source: str  # corpus label, recorded with every chunk
    pages: tuple[int, ...] = ()  # a PDF's page start offsets in `text`; chunks cite their page
    keep_short: bool = False  # one passage even below the chunk minimum (your own short notes)
