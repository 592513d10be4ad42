"""Memory and speed of the MediaWiki XML dump reader (`read_xml_dump`) on a synthetic dump.

  generate  write a dump in the real export-0.11 format (siteinfo, namespaces, pages with
            revisions), streamed to disk: articles with infoboxes, links, <ref>s, headings,
            tables and categories, plus redirects, disambiguation pages and other namespaces
            (talk, template, category, project). .xml or .xml.bz2 by the file name. Page ids run
            1..N, so an article's id says how far through the dump the reader is. A manifest
            (PATH.manifest.json) records the page counts.
  read      stream the dump through `read_xml_dump`, counting articles and characters, and
            record peak RSS (getrusage) and VmRSS sampled every N articles; prints a markdown
            table (RSS at 10%, 50%, 100% of the pages when a manifest is present).

    python scripts/bench/bench_dump.py generate /tmp/enwiki-synth.xml --gb 2
    python scripts/bench/bench_dump.py read /tmp/enwiki-synth.xml
    python scripts/bench/bench_dump.py read /tmp/enwiki-synth.xml --no-clean --reader /tmp/old/corpus.py

`--no-clean` swaps clean_wikitext (mwparserfromhell, by far the slowest step) for the identity,
to stream a multi-GB dump through the XML layer in minutes. `--reader FILE.py` loads
`read_xml_dump` from another copy of corpus.py (e.g. an older commit's, from
`git show REV:targ_mlx/index/corpus.py`) to compare against the current one.
"""

from __future__ import annotations

import argparse
import bz2
import importlib.util
import json
import random
import resource
import sys
import time
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

# ------------------------------------------------------------------------------------ generate
_WORDS = (
    "the of and in to was a is for on as by with from at his that which it an were be are its "
    "first city river war film album team university village population county district school "
    "station church battle party season species album series league company government state "
    "national american british french german century world new north south east west island "
    "railway bridge museum festival kingdom empire province municipality election parliament "
    "minister army navy football cricket baseball player coach record released single chart "
    "band singer actor director novel author poet painter composer physicist chemist genus family "
    "located known founded built named became served won lost played moved born died married "
    "elected appointed published recorded produced designed described discovered established "
    "Zürich São Paulo Kraków Düsseldorf Malmö Montréal Besançon Łódź Reykjavík Škoda"
).split()
_SECTIONS = ["History", "Early life", "Career", "Geography", "Demographics", "Economy", "Culture",
             "Reception", "Legacy", "Personal life", "Description", "Taxonomy", "Distribution",
             "Track listing", "Plot", "Production", "Education", "Transport", "Climate", "Politics"]
_TAIL_SECTIONS = ["See also", "Notes", "References", "Further reading", "External links"]
_INFOBOX = ["person", "settlement", "film", "album", "football biography", "company", "station",
            "river", "species", "officeholder", "school", "military conflict", "book", "video game"]
_FIELDS = ["name", "image", "caption", "birth_date", "birth_place", "death_date", "occupation",
           "country", "population_total", "area_km2", "established_date", "genre", "label",
           "producer", "length", "website", "coordinates", "leader_name", "founder", "type"]
_DISAMBIG_TEMPLATES = ["{{disambiguation}}", "{{Disambiguation|geo}}", "{{hndis}}", "{{dab}}",
                       "{{surname}}", "{{geodis}}"]
_NON_ARTICLE_NS = [(1, "Talk"), (10, "Template"), (14, "Category"), (4, "Wikipedia")]


class _Text:
    """Wikitext generator: a fixed-seed pool of sentences, combined differently for every page."""

    def __init__(self, rng: random.Random, pool: int = 20_000):
        self.rng = rng
        self.sentences = [self._sentence() for _ in range(pool)]

    def words(self, lo: int, hi: int) -> str:
        return " ".join(self.rng.choices(_WORDS, k=self.rng.randint(lo, hi)))

    def title(self) -> str:
        return " ".join(w.capitalize() for w in self.rng.choices(_WORDS, k=self.rng.randint(1, 4)))

    def _sentence(self) -> str:
        r = self.rng
        parts = []
        for _ in range(r.randint(3, 7)):
            k = r.random()
            if k < 0.35:
                parts.append(f"[[{self.title()}]]")
            elif k < 0.55:
                parts.append(f"[[{self.title()}|{self.words(1, 3)}]]")
            elif k < 0.6:
                parts.append(f"'''{self.words(1, 2)}'''")
            elif k < 0.65:
                parts.append(f"''{self.words(1, 3)}''")
            elif k < 0.7:
                parts.append(f"{{{{convert|{r.randint(1, 9000)}|km|mi}}}}")
            else:
                parts.append(self.words(2, 8))
        s = " ".join(parts).capitalize() + "."
        k = r.random()
        if k < 0.3:
            s += (f'<ref>{{{{cite web |url=https://example.org/{r.randint(1, 10**6)} |title={self.words(2, 6)}'
                  f' |access-date={r.randint(2005, 2024)}-0{r.randint(1, 9)}-1{r.randint(0, 9)}}}}}</ref>')
        elif k < 0.4:
            s += f'<ref name="r{r.randint(1, 40)}" />'
        elif k < 0.45:
            s += f"{{{{citation needed|date=May {r.randint(2008, 2024)}}}}}"
        return s

    def paragraph(self) -> str:
        return " ".join(self.rng.choices(self.sentences, k=self.rng.randint(2, 8)))

    def table(self) -> str:
        r = self.rng
        cols = r.randint(2, 5)
        rows = [f'{{| class="wikitable sortable"', "! " + " !! ".join(self.words(1, 2) for _ in range(cols))]
        for _ in range(r.randint(2, 12)):
            rows += ["|-", "| " + " || ".join(f"[[{self.title()}]]" if r.random() < 0.3 else str(r.randint(1, 9999))
                                                for _ in range(cols))]
        return "\n".join(rows + ["|}"])

    def article(self, title: str) -> str:
        r = self.rng
        out = [f"{{{{Short description|{self.words(2, 6)}}}}}"]
        if r.random() < 0.6:
            fields = r.sample(_FIELDS, r.randint(5, 15))
            box = "\n".join(f"| {f} = {self.words(1, 4) if r.random() < 0.7 else '[[' + self.title() + ']]'}"
                            for f in fields)
            out.append(f"{{{{Infobox {r.choice(_INFOBOX)}\n{box}\n}}}}")
        if r.random() < 0.3:
            out.append(f"[[File:{self.title()}.jpg|thumb|upright|{self.words(3, 8)}]]")
        out.append(f"'''{title}''' " + self.paragraph())
        # Section count from a log-normal: most articles are short, a few are very long
        # (wikitext median ~5.6 KB, mean ~8.2 KB, p99 ~45 KB).
        n_sections = min(60, int(r.lognormvariate(0.8, 0.9)))
        for _ in range(n_sections):
            out.append(f"\n== {r.choice(_SECTIONS)} ==")
            for _ in range(r.randint(1, 4)):
                if r.random() < 0.15:
                    out.append(f"\n=== {self.words(1, 3).capitalize()} ===")
                out.append(self.paragraph())
            if r.random() < 0.15:
                out.append(self.table())
            if r.random() < 0.15:
                out.append("\n".join(f"* [[{self.title()}]] {self.words(0, 5)}" for _ in range(r.randint(2, 8))))
        for sec in r.sample(_TAIL_SECTIONS, r.randint(1, 4)):
            body = "{{Reflist}}" if sec == "References" else \
                "\n".join(f"* [[{self.title()}]]" for _ in range(r.randint(1, 6)))
            out.append(f"\n== {sec} ==\n{body}")
        out.append("{{Authority control}}")
        out += [f"[[Category:{self.title()}]]" for _ in range(r.randint(1, 8))]
        return "\n".join(out) + "\n"

    def disambiguation(self, title: str) -> str:
        items = "\n".join(f"* [[{title} ({self.words(1, 2)})]], a {self.words(2, 6)}"
                          for _ in range(self.rng.randint(2, 12)))
        return (f"'''{title}''' may refer to:\n{items}\n\n== See also ==\n* [[{self.title()}]]\n\n"
                f"{self.rng.choice(_DISAMBIG_TEMPLATES)}\n")


_HEADER = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:schemaLocation="http://www.mediawiki.org/xml/export-0.11/ http://www.mediawiki.org/xml/export-0.11.xsd" version="0.11" xml:lang="en">
  <siteinfo>
    <sitename>Wikipedia</sitename>
    <dbname>enwiki</dbname>
    <base>https://en.wikipedia.org/wiki/Main_Page</base>
    <generator>MediaWiki 1.42.0-wmf.5</generator>
    <case>first-letter</case>
    <namespaces>
      <namespace key="-2" case="first-letter">Media</namespace>
      <namespace key="-1" case="first-letter">Special</namespace>
      <namespace key="0" case="first-letter" />
      <namespace key="1" case="first-letter">Talk</namespace>
      <namespace key="2" case="first-letter">User</namespace>
      <namespace key="3" case="first-letter">User talk</namespace>
      <namespace key="4" case="first-letter">Wikipedia</namespace>
      <namespace key="6" case="first-letter">File</namespace>
      <namespace key="10" case="first-letter">Template</namespace>
      <namespace key="14" case="first-letter">Category</namespace>
      <namespace key="828" case="first-letter">Module</namespace>
    </namespaces>
  </siteinfo>
"""


def _page_xml(rng: random.Random, pid: int, title: str, ns: int, text: str, redirect: str | None) -> str:
    rev = 1_000_000_000 + pid * 37 + rng.randint(0, 36)  # 10-digit, as enwiki's are
    ts = (f"{rng.randint(2002, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
          f"T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z")
    if rng.random() < 0.8:
        contributor = (f"<username>{escape(rng.choice(_WORDS).capitalize())}{rng.randint(1, 99999)}</username>"
                       f"\n        <id>{rng.randint(1, 4 * 10**7)}</id>")
    else:
        ip = ".".join(str(rng.randint(lo, hi)) for lo, hi in ((1, 223), (0, 255), (0, 255), (1, 254)))
        contributor = f"<ip>{ip}</ip>"
    red = f"    <redirect title={quoteattr(redirect)} />\n" if redirect else ""
    sha1 = "".join(rng.choices("0123456789abcdefghijklmnopqrstuvwxyz", k=31))
    return (
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{pid}</id>\n{red}"
        f"    <revision>\n      <id>{rev}</id>\n      <parentid>{rev - rng.randint(1, 5000)}</parentid>\n"
        f"      <timestamp>{ts}</timestamp>\n      <contributor>\n        {contributor}\n      </contributor>\n"
        f"      <comment>{escape(rng.choice(_WORDS))} {escape(rng.choice(_WORDS))}</comment>\n"
        f"      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
        f'      <text bytes="{len(text.encode())}" xml:space="preserve">{escape(text)}</text>\n'
        f"      <sha1>{sha1}</sha1>\n    </revision>\n  </page>\n"
    )


def generate(path: Path, gb: float, seed: int) -> dict:
    """Write pages until the file holds `gb` GB of XML (uncompressed); returns the manifest."""
    rng = random.Random(seed)
    gen = _Text(rng)
    target = int(gb * 1e9)
    counts = {"article": 0, "redirect": 0, "disambiguation": 0, "other_ns": 0}
    opener = (lambda p: bz2.open(p, "wt", encoding="utf-8", compresslevel=9)) if path.suffix == ".bz2" \
        else (lambda p: open(p, "w", encoding="utf-8", buffering=1 << 20))
    written, pid, t0 = len(_HEADER.encode()), 0, time.perf_counter()
    with opener(path) as f:
        f.write(_HEADER)
        while written < target:
            pid += 1
            k = rng.random()
            title = gen.title()
            # Mix loosely after enwiki pages-articles: about as many redirects as articles.
            if k < 0.42:
                kind, ns, redirect = "redirect", 0, gen.title()
                text = f"#REDIRECT [[{redirect}]]"
                if rng.random() < 0.6:
                    text += f"\n\n{{{{R from {rng.choice(['alternative name', 'move', 'misspelling'])}}}}}"
            elif k < 0.46:
                kind, ns, redirect = "disambiguation", 0, None
                if rng.random() < 0.5:
                    title += " (disambiguation)"
                text = gen.disambiguation(title)
            elif k < 0.54:
                kind, redirect = "other_ns", None
                ns, prefix = rng.choice(_NON_ARTICLE_NS)
                title = f"{prefix}:{title}"
                text = gen.paragraph() + "\n\n== " + gen.words(1, 4) + " ==\n" + gen.paragraph()
            else:
                kind, ns, redirect = "article", 0, None
                text = gen.article(title)
            counts[kind] += 1
            xml = _page_xml(rng, pid, title, ns, text, redirect)
            f.write(xml)
            written += len(xml.encode())
            if pid % 50_000 == 0:
                print(f"  {pid:,} pages, {written / 1e9:.2f} GB, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        f.write("</mediawiki>\n")
    manifest = {"path": str(path), "pages": pid, **counts, "xml_bytes": written + len("</mediawiki>\n"),
                "file_bytes": path.stat().st_size, "seed": seed, "generate_s": round(time.perf_counter() - t0, 1)}
    Path(str(path) + ".manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


# ---------------------------------------------------------------------------------------- read
def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _load_reader(file: str | None):
    if file is None:
        from targ_mlx.index.corpus import read_xml_dump

        return read_xml_dump, "targ_mlx.index.corpus"
    spec = importlib.util.spec_from_file_location("_bench_corpus", file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # @dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod.read_xml_dump, file


def read(path: Path, every: int, reader: str | None, clean: bool = True) -> dict:
    import mwparserfromhell  # noqa: F401  (loaded before the baseline, so it isn't counted as growth)

    import targ_mlx.index.wikitext as wikitext

    if not clean:  # the reader imports clean_wikitext when called, so this reaches either copy
        wikitext.clean_wikitext = lambda text: text
    read_xml_dump, label = _load_reader(reader)
    mpath = Path(str(path) + ".manifest.json")
    manifest = json.loads(mpath.read_text()) if mpath.exists() else {}
    pages = manifest.get("pages")
    marks = {f: int(pages * f / 100) for f in (10, 50)} if pages else {}
    at: dict[int, float] = {}
    samples: list[tuple[int, int, float]] = []  # (articles, page id, VmRSS MB)
    start_rss = _rss_mb()
    n = chars = 0
    t0 = time.perf_counter()
    for a in read_xml_dump(path):
        n += 1
        chars += len(a.text)
        if n % every == 0:
            samples.append((n, int(a.id) if a.id.isdigit() else 0, _rss_mb()))
        if marks:
            pid = int(a.id)
            for f, m in marks.items():
                if f not in at and pid >= m:
                    at[f] = _rss_mb()
    wall = time.perf_counter() - t0
    at[100] = _rss_mb()
    size = path.stat().st_size
    xml_bytes = manifest.get("xml_bytes", size)
    return {"reader": label, "clean": clean, "dump": str(path), "file_mb": round(size / 1e6, 1),
            "xml_mb": round(xml_bytes / 1e6, 1),
            "pages": pages, "articles": n, "chars": chars, "wall_s": round(wall, 1),
            "articles_per_s": round(n / wall, 1), "file_mb_per_s": round(size / 1e6 / wall, 2),
            "xml_mb_per_s": round(xml_bytes / 1e6 / wall, 2), "start_rss_mb": round(start_rss, 1),
            "rss_mb_at_pct": {k: round(v, 1) for k, v in sorted(at.items())}, "peak_rss_mb": round(_peak_mb(), 1),
            "samples": samples, "python": sys.version.split()[0]}


def table(r: dict) -> str:
    at = r["rss_mb_at_pct"]
    head = ["reader", "clean", "dump", "pages", "articles", "chars", "wall s", "articles/s", "MB/s (file)",
            "MB/s (XML)",
            "RSS start", "RSS 10%", "RSS 50%", "RSS 100%", "peak RSS"]
    row = [r["reader"], "yes" if r["clean"] else "no", f"{Path(r['dump']).name} ({r['file_mb']:,} MB)",
           f"{r['pages']:,}" if r["pages"] else "?", f"{r['articles']:,}", f"{r['chars']:,}", r["wall_s"],
           r["articles_per_s"], r["file_mb_per_s"], r["xml_mb_per_s"],
           f"{r['start_rss_mb']} MB", *(f"{at[k]} MB" if k in at else "-" for k in (10, 50, 100)),
           f"{r['peak_rss_mb']} MB"]
    return "| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n| " + " | ".join(map(str, row)) + " |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write a synthetic dump (.xml or .xml.bz2)")
    g.add_argument("path", type=Path)
    g.add_argument("--gb", type=float, default=2.0, help="uncompressed XML size to write, in GB (1e9 bytes)")
    g.add_argument("--seed", type=int, default=1234)
    r = sub.add_parser("read", help="stream a dump through read_xml_dump, recording RSS")
    r.add_argument("path", type=Path)
    r.add_argument("--every", type=int, default=1000, help="sample VmRSS every N articles")
    r.add_argument("--reader", help="a corpus.py file to take read_xml_dump from (default: the installed one)")
    r.add_argument("--no-clean", action="store_true",
                   help="skip clean_wikitext (mwparserfromhell), to time the XML streaming alone")
    r.add_argument("--json", type=Path, help="also write the result (with all RSS samples) here")
    args = ap.parse_args(argv)
    if args.cmd == "generate":
        print(json.dumps(generate(args.path, args.gb, args.seed), indent=1))
        return 0
    res = read(args.path, args.every, args.reader, clean=not args.no_clean)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(table(res))
    s = res["samples"]
    if s:
        step = max(1, len(s) // 10)
        print("\n| articles | page id | VmRSS MB |\n|---|---|---|")
        for a, pid, mb in s[step - 1::step]:
            print(f"| {a:,} | {pid:,} | {mb:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
