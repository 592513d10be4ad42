"""Wikitext -> plain article text: a linear-time pre-pass, then mwparserfromhell on what is left.

Drops templates, references, tables, files, categories, headings and the trailing reference
sections; keeps link text. Only the XML dump reader needs this module (and mwparserfromhell).

Why a pre-pass: mwparserfromhell's `Wikicode.remove(node)` searches the whole tree for the node,
so removing the k templates/refs/files of an n-node article one by one costs O(n*k): quadratic
in article length (9 ms for 5 KB, 0.45 s for 60 KB, 1.2 s for 106 KB). Its Python tree builder is
slow too (0.6 MB/s just to parse), mostly on the nested templates (infoboxes, citations), tables
and links. So the parts we throw away are cut out of the string first by small bracket-matching
scanners (one regex pass each, a stack for nesting), plain [[links]] are replaced by their text,
and mwparserfromhell parses only what is left (prose, formatting, entities, the odd complex
link), once, for `strip_code`. Every step is linear: 1 ms for 5 KB, 15 ms for 60 KB.
"""

from __future__ import annotations

import re

from targ_mlx.index.chunking import normalise_space

_DROP_TAGS = ("ref", "references", "gallery", "math", "table", "timeline", "score", "imagemap",
              "syntaxhighlight", "source", "chem", "ce", "hiero", "graph", "templatedata")
_DROP_LINK = re.compile(r"\s*:?\s*(file|image|category|media|[a-z]{2,3}(-[a-z]+)?)\s*:", re.I)
_DROP_SECTIONS = {"references", "external links", "see also", "notes", "further reading",
                  "bibliography", "sources", "citations", "footnotes", "notes and references"}
_DISAMBIG = re.compile(r"\{\{\s*(disambiguation|disambig|dab|hndis|geodis|surname|given name|set index)[^}]*\}\}", re.I)
_TABLE = re.compile(r"^\s*(\{\||\|\}|\|-|\||!).*$", re.M)  # rows of tables too broken to match

# An unclosed comment hides the rest of the page, as in MediaWiki; `.*?` with `\Z` stays linear.
# Behaviour switches (__NOTOC__) are no markup to mwparserfromhell, so they go here too.
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)|__[A-Z]+__", re.S)
_TAG = re.compile(r"<(/?)(" + "|".join(_DROP_TAGS) + r")\b[^>]*?(/?)>", re.I)
_BRACES = re.compile(r"\{\{+|\}\}+")
_TABLE_EDGE = re.compile(r"^[ \t:]*(\{\||\|\})", re.M)  # tables open and close at line start
_LINK_EDGE = re.compile(r"\[\[|\]\]+")
# A plain [[title]] or [[title|text]]: mwparserfromhell's rules for a title (no newline, braces
# or angle brackets; otherwise it is text), no brackets inside. Most nodes of an article are
# these, so resolving them here halves what mwparserfromhell has to build.
_PLAIN_LINK = re.compile(r"\[\[([^\[\]{}<>|\n]*)(?:\|([^\[\]]*))?\]\]")
_HEADING = re.compile(r"^(=+)(.+?)(=+)[ \t]*$", re.M)
_HEADING_MARKUP = re.compile(r"\[\[(?:[^|\]]*\|)?|\]\]|'{2,}")


def is_disambiguation(title: str, wikitext: str) -> bool:
    return title.endswith("(disambiguation)") or bool(_DISAMBIG.search(wikitext))


def clean_wikitext(wikitext: str) -> str:
    """Plain text of an article's wikitext, paragraphs kept, markup gone; linear in its length."""
    import mwparserfromhell

    text = _COMMENT.sub("", wikitext)
    text = _cut(text, _tag_spans(text))  # first: <math> and <ref> hold braces of their own
    text = _cut(text, _template_spans(text))
    text = _cut(text, _table_spans(text))  # after templates: `|}}` ends a template, not a table
    text = _cut(text, _link_spans(text))
    text = _PLAIN_LINK.sub(_link_text, text)  # after _link_spans: [[Category:X]] must go whole
    text = _drop_sections(text)
    text = mwparserfromhell.parse(text).strip_code(normalize=True, collapse=True)
    return normalise_space(_TABLE.sub("", text))


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` without the spans; nested or overlapping spans are merged (one sort, one join)."""
    if not spans:
        return text
    spans.sort()
    out, pos = [], 0
    for start, end in spans:
        if end <= pos:  # inside a span already cut
            continue
        out.append(text[pos:max(pos, start)])
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _tag_spans(text: str) -> list[tuple[int, int]]:
    """<ref>...</ref>, <ref name=x/>, <math>, <gallery>, HTML <table> (nested ones too), ...

    One pass with a stack. A close pops down to its opener; an opener never closed (or skipped
    over that way) drops only itself: MediaWiki shows what follows as text, and so must we
    rather than lose the prose after it. Stray closes and self-closing tags drop themselves.
    """
    spans, stack = [], []  # stack: (name, start, end) of open tags
    for m in _TAG.finditer(text):
        name = m.group(2).lower()
        if m.group(3) or (m.group(1) and all(name != open_[0] for open_ in stack)):
            spans.append(m.span())
        elif not m.group(1):
            stack.append((name, m.start(), m.end()))
        else:
            while (open_ := stack.pop())[0] != name:
                spans.append(open_[1:])
            spans.append((open_[1], m.end()))
    spans.extend(open_[1:] for open_ in stack)
    return spans


def _template_spans(text: str) -> list[tuple[int, int]]:
    """Every {{template}} and {{{parameter}}}, nested any depth, by brace matching.

    A run of n opening braces opens one `{{{` if n is odd and `{{`s for the rest; a closing run
    closes the innermost first, taking 3 braces for a `{{{`. Unclosed `{{` stays as text.
    """
    spans, stack = [], []  # stack: (start, braces) of open templates/parameters
    for m in _BRACES.finditer(text):
        s, e = m.span()
        if text[s] == "{":
            n = e - s
            if n % 2:
                stack.append((s, 3))
                s, n = s + 3, n - 3
            stack.extend((s + 2 * i, 2) for i in range(n // 2))
            continue
        while stack and e - s >= 2:
            start, braces = stack.pop()
            s += braces if braces <= e - s else 2
            spans.append((start, s))
    return spans


def _table_spans(text: str) -> list[tuple[int, int]]:
    """{| ... |} tables, nested ones too: `{|` and `|}` count only at the start of a line."""
    spans, stack = [], []
    for m in _TABLE_EDGE.finditer(text):
        if m.group(1) == "{|":
            stack.append(m.start())
        elif stack:
            spans.append((stack.pop(), m.end()))
    return spans


def _link_spans(text: str) -> list[tuple[int, int]]:
    """[[File:...]], [[Category:...]] and interlanguage links, whole, with links in captions.

    In a run of closing brackets an odd one out (`]]]`) belongs to an inner external link, so
    the outermost link ends at the end of the run.
    """
    spans, stack = [], []
    for m in _LINK_EDGE.finditer(text):
        s, e = m.span()
        if text[s] == "[":
            stack.append(s)
            continue
        k = min((e - s) // 2, len(stack))
        for i in range(k):
            start = stack.pop()
            if _DROP_LINK.match(text, start + 2):
                spans.append((start, e - 2 * (k - 1 - i)))
    return spans


def _link_text(m: re.Match) -> str:
    return m.group(1) if m.group(2) is None else m.group(2)


def _drop_sections(text: str) -> str:
    """Drop reference/see-also sections (a level-2 heading up to the next heading of level <= 2)
    and the text of every other heading, keeping its line break so paragraphs stay apart."""
    out, pos, dropping = [], 0, False
    for m in _HEADING.finditer(text):
        level = min(len(m.group(1)), len(m.group(3)), 6)
        if dropping and level > 2:
            continue
        if not dropping:
            out.append(text[pos:m.start()])
        title = _HEADING_MARKUP.sub("", m.group(2)).strip().lower()
        dropping = level == 2 and title in _DROP_SECTIONS
        pos = m.end()
    if not dropping:
        out.append(text[pos:])
    return "".join(out)
