"""Wikitext -> plain article text, with mwparserfromhell (the maintained MediaWiki parser).

Drops templates, references, tables, files, categories and the trailing reference sections;
keeps link text. Only the XML dump reader needs this module (and mwparserfromhell).
"""

from __future__ import annotations

import re

from targ_mlx.index.chunking import normalise_space

_DROP_TAGS = {"ref", "references", "gallery", "math", "table", "timeline", "score", "imagemap", "syntaxhighlight"}
_DROP_LINK = re.compile(r"^\s*:?\s*(file|image|category|media|[a-z]{2,3}(-[a-z]+)?)\s*:", re.I)
_DROP_SECTIONS = {"references", "external links", "see also", "notes", "further reading",
                  "bibliography", "sources", "citations", "footnotes", "notes and references"}
_DISAMBIG = re.compile(r"\{\{\s*(disambiguation|disambig|dab|hndis|geodis|surname|given name|set index)[^}]*\}\}", re.I)
_TABLE = re.compile(r"^\s*(\{\||\|\}|\|-|\||!).*$", re.M)


def is_disambiguation(title: str, wikitext: str) -> bool:
    return title.endswith("(disambiguation)") or bool(_DISAMBIG.search(wikitext))


def clean_wikitext(wikitext: str) -> str:
    """Plain text of an article's wikitext, paragraphs kept, markup gone."""
    import mwparserfromhell

    code = mwparserfromhell.parse(wikitext)
    for section in code.get_sections(levels=[2]):
        heading = section.filter_headings()[0]
        if heading.title.strip_code().strip().lower() in _DROP_SECTIONS:
            code.remove(section)
    for node in code.filter_tags():
        if str(node.tag).strip().lower() in _DROP_TAGS:
            _remove(code, node)
    for node in code.filter_wikilinks():
        if _DROP_LINK.match(str(node.title)):
            _remove(code, node)
    for node in code.filter_templates(recursive=False):
        _remove(code, node)
    for node in code.filter_headings():
        _remove(code, node)
    text = code.strip_code(normalize=True, collapse=True)
    text = _TABLE.sub("", text)
    return normalise_space(text)


def _remove(code, node) -> None:
    try:
        code.remove(node)
    except ValueError:  # already gone with an enclosing node
        pass
