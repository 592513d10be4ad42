"""Your own documents as a corpus: a folder of .md, .txt, .html and .pdf files, read recursively.

Each file is one `Article`: its id is the path inside the folder, its title the folder's name
joined with that path (what answers cite), its source the folder's absolute path. A PDF's pages
are read with pypdf and joined, and the article carries where each page starts, so each chunk
is titled with the page it starts on ("notes/paper.pdf p. 3"). Files are identified by the
sha256 of their bytes: `scan` lists them, and `update.py` re-chunks only those that changed.
"""

from __future__ import annotations

import hashlib
import logging
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterator, Mapping

from targ_mlx.index.chunking import normalise_space
from targ_mlx.index.article import Article
from targ_mlx.index.errors import CorpusError

logger = logging.getLogger(__name__)

SUFFIXES = (".md", ".markdown", ".txt", ".html", ".htm", ".pdf")
_SKIP_TAGS = {"script", "style", "head", "noscript", "template"}
_BLOCK_TAGS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article",
               "blockquote", "pre", "table", "ul", "ol", "title"}


# WikiExtractor's part files (AA/wiki_00, AA/wiki_01.bz2, ...): a folder of them is a Wikipedia
# corpus (`corpus.read_wikiextractor`), not your documents
WIKI_PART = re.compile(r"wiki_\d+(\.(bz2|gz|xz))?$")


def is_wikiextractor_folder(path: Path) -> bool:
    return path.is_dir() and any(WIKI_PART.match(p.name) for p in path.rglob("wiki_*") if p.is_file())


def is_document_folder(path: Path) -> bool:
    """A folder holding documents (no parquet files, which `corpus.read_parquet` reads, and no
    WikiExtractor parts)."""
    return path.is_dir() and not any(path.glob("**/*.parquet")) and not is_wikiextractor_folder(path)


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def scan(folder: Path) -> dict[str, str]:
    """{path inside the folder: sha256 of its bytes} for every readable document, in sorted order."""
    return scan_report(folder)[0]


def scan_report(folder: Path) -> tuple[dict[str, str], dict[str, str]]:
    """({path: sha256} of the documents that read, {path: why} of those that do not).

    Each file is read once here (a corrupt PDF, text that is not UTF-8, an unreadable file), so
    one bad file among hundreds is skipped with one warning line instead of sinking the build.
    """
    folder = Path(folder)
    files, skipped = {}, {}
    for p in _files(folder):
        rel = p.relative_to(folder).as_posix()
        try:
            read_document(folder, rel)
            files[rel] = digest(p)
        except (CorpusError, OSError) as e:
            why = str(e).split(": ", 1)[-1].split("; fix:")[0] if isinstance(e, CorpusError) else e.strerror or str(e)
            skipped[rel] = why
            logger.warning("skipped %s: %s", p, why)
    return files, skipped


class _HtmlText(HTMLParser):
    """Visible text of an HTML page, a paragraph break at each block element."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in _SKIP_TAGS:
            self._skip += 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag in _SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def _html_text(raw: bytes) -> str:
    parser = _HtmlText()
    parser.feed(raw.decode("utf-8", errors="replace"))
    parser.close()
    return "".join(parser.parts)


def _pdf_pages(path: Path) -> list[str]:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        return [page.extract_text() or "" for page in PdfReader(path).pages]
    except (PdfReadError, ValueError, KeyError) as e:
        raise CorpusError(f"{path}: unreadable PDF ({e}); fix: repair or remove the file") from None


def read_document(folder: Path, rel: str) -> Article:
    """One file as an `Article` (text normalised; a PDF's page starts in `pages`)."""
    path = folder / rel
    title = f"{folder.name}/{rel}"
    if path.suffix.lower() == ".pdf":
        text, pages = "", []
        for page in map(normalise_space, _pdf_pages(path)):
            pages.append(len(text) + (2 if text and page else 0))
            text = f"{text}\n\n{page}" if text and page else text or page
        return Article(rel, title, text, str(folder), tuple(pages), keep_short=True)
    raw = path.read_bytes()
    if path.suffix.lower() in (".html", ".htm"):
        body = _html_text(raw)  # pages declare their own charsets; a stray byte is not worth a skip
    else:
        try:
            body = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorpusError(f"{path}: not UTF-8 text (byte {e.start}); fix: save it as UTF-8") from None
    return Article(rel, title, normalise_space(body), str(folder), keep_short=True)


def read_documents(folder: Path, files: Mapping[str, str] | None = None) -> Iterator[Article]:
    """The documents of `folder`; with `files` ({path: sha256}), exactly those, each checked
    against its hash (a build or an update resumes only over the bytes it began with)."""
    folder = Path(folder).resolve()
    if files is None:
        files = scan(folder)
    for rel, sha in files.items():
        path = folder / rel
        if not path.is_file() or digest(path) != sha:
            raise CorpusError(
                f"{path} changed while the index was being built or updated; fix: run the same "
                "command again once the folder is settled (unchanged files are not encoded again)"
            )
        article = read_document(folder, rel)
        if not article.text:
            logger.warning("%s: no text found (a scanned PDF?); skipped", path)
        yield article
