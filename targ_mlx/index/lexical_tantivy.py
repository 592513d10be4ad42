"""The BM25 part on Tantivy: built in bounded memory, resumable, memory-mapped.

Why Tantivy (BENCHMARKS.md, row "lexical engines"): bm25s builds one sparse matrix from every
token of the corpus held in memory (4.47 GB peak at a million chunks, growing with the corpus);
Tantivy's writer flushes a segment whenever its fixed heap fills and merges segments on disk, so
20 million chunks build in the memory one million took. Analysis as before: words lower-cased,
Lucene's English stopwords (bm25s's "en" list is the same 33 words) and Snowball's English stemmer
(PyStemmer's "english"). BM25 is Tantivy's (Lucene's k1=1.2, b=0.75).

Resume: the writer commits every COMMIT_EVERY passages (a commit's segments are durable), and
rows arrive in ascending key order, so a build killed at any point goes on after the largest key
the index holds. `source.json` names what is being indexed (each passages.db's count and last
key); a partial folder of anything else is started afresh.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from targ_mlx.index.errors import IndexCorruptError
from targ_mlx.index.lexical_files import META, RowSource, passage_text, publish
from targ_mlx.index.store import write_json_atomic

FORMAT = 2
KEY, BODY = "key", "body"
ANALYZER = "targ_en"
SOURCE = "source.json"
LOCKS = (".tantivy-writer.lock", ".tantivy-meta.lock")  # Tantivy's own, not part of the index
# The writer's heap, split between its threads: the build's memory bound (Tantivy flushes a
# segment when it fills). 256 MB keeps segments large enough that merging stays cheap.
HEAP = 256_000_000
THREADS = 2
TIE_SLACK = 10  # hits fetched past k, so equal scores at the cut are ordered by key, not by segment
COMMIT_EVERY = 200_000  # passages a kill can lose (about 10 s of indexing on 2 cores)


def analyzer():
    import tantivy as t

    return (t.TextAnalyzerBuilder(t.Tokenizer.simple()).filter(t.Filter.remove_long(40))
            .filter(t.Filter.lowercase()).filter(t.Filter.stopword("english"))
            .filter(t.Filter.stemmer("english")).build())


def _schema():
    import tantivy as t

    sb = t.SchemaBuilder()
    sb.add_unsigned_field(KEY, indexed=True, fast=True)  # indexed: score_keys filters on it
    sb.add_text_field(BODY, tokenizer_name=ANALYZER, index_option="freq")  # BM25 needs no positions
    return sb.build()


def _open(folder: Path, create: bool = False):
    import tantivy as t

    index = t.Index(_schema(), path=str(folder)) if create else t.Index.open(str(folder))
    index.register_tokenizer(ANALYZER, analyzer())
    return index


def _last_key(index) -> tuple[int, int | None]:
    """(passages committed, the largest key among them) of a partial build."""
    import tantivy as t

    index.reload()
    s = index.searcher()
    if not s.num_docs:
        return 0, None
    hits = s.search(t.Query.all_query(), 1, count=False, order_by_field=KEY, order=t.Order.Desc).hits
    return s.num_docs, s.fast_field_values(KEY, [hits[0][1]])[0]


def _resume(tmp: Path, source: dict):
    """The partial index in `tmp` when it holds the same `source`, else a new one there."""
    try:
        if json.loads((tmp / SOURCE).read_text()) == source and (tmp / "meta.json").is_file():
            return _open(tmp)
    except (OSError, ValueError):
        pass  # unreadable or a Tantivy error: what it held is started again
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_json_atomic(tmp / SOURCE, source)
    return _open(tmp, create=True)


def build(rows: RowSource, out: Path, source: dict, progress: Callable[[int], None] | None = None) -> dict:
    import tantivy as t

    t0 = time.perf_counter()
    tmp = out.with_name(out.name + ".tmp")
    index = _resume(tmp, source)
    done, last = _last_key(index)
    resumed = done
    writer = index.writer(heap_size=HEAP, num_threads=THREADS)
    if progress:
        progress(done)
    for key, title, text in rows(last):
        if last is not None and key <= last:
            raise ValueError("build_lexical needs the rows in ascending key order")
        doc = t.Document()
        doc.add_unsigned(KEY, key)
        doc.add_text(BODY, passage_text(title, text))
        writer.add_document(doc)
        last, done = key, done + 1
        if done % COMMIT_EVERY == 0:
            writer.commit()
            if progress:
                progress(done)
    writer.commit()
    writer.wait_merging_threads()
    if not done:
        raise ValueError("no passages to index")
    if progress:
        progress(done)
    return publish(tmp, out, {
        "format": FORMAT, "kind": "tantivy", "tantivy": getattr(t, "__version__", None),
        "analysis": "simple tokenizer, lower case, English stopwords, Snowball English stemmer",
        "passages": done, "resumed_at": resumed, "build_s": round(time.perf_counter() - t0, 2),
    }, skip=LOCKS)


@dataclass
class TantivyIndex:
    """A memory-mapped Tantivy index of (key, passage) documents."""

    path: Path
    meta: dict
    index: object  # tantivy.Index
    searcher: object  # one consistent set of segments (the index does not change once built)
    terms: object  # the analyzer, to turn a query into the index's terms

    @classmethod
    def open(cls, folder: Path, meta: dict, fix: str) -> "TantivyIndex":
        try:
            index = _open(folder)
            searcher = index.searcher()
        except ValueError as e:  # Tantivy's own word on a damaged segment, kept to one line
            raise IndexCorruptError(f"{folder} cannot be opened ({str(e).splitlines()[0][:200]}); {fix}") from None
        if searcher.num_docs != meta["passages"]:
            raise IndexCorruptError(f"{folder} holds {searcher.num_docs} passages but {META} says "
                                    f"{meta['passages']}; {fix}")
        return cls(folder, meta, index, searcher, analyzer())

    def __len__(self) -> int:
        return self.searcher.num_docs

    def _query(self, text: str):
        import tantivy as t

        schema = self.index.schema
        terms = list(dict.fromkeys(self.terms.analyze(text)))
        if not terms:
            return None
        return t.Query.boolean_query([(t.Occur.Should, t.Query.term_query(schema, BODY, w, index_option="freq"))
                                      for w in terms])

    def _hits(self, query, k: int) -> list[tuple[int, float]]:
        """The top `k`, ties broken by key: Tantivy breaks them by where a passage landed, which
        differs between two builds of the same passages (its threads split them into segments)."""
        hits = self.searcher.search(query, k + TIE_SLACK, count=False).hits
        keys = self.searcher.fast_field_values(KEY, [a for _, a in hits]) if hits else []
        ranked = sorted(((int(key), float(score)) for key, (score, _) in zip(keys, hits) if score > 0),
                        key=lambda h: (-h[1], h[0]))
        return ranked[:k]

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        out = []
        for text in queries:
            q = self._query(text)
            out.append(self._hits(q, k) if q is not None else [])
        return out

    def score_keys(self, query: str, keys: Sequence[int]) -> list[float]:
        import tantivy as t

        q = self._query(query)
        if q is None or not keys:
            return [0.0] * len(keys)
        only = t.Query.const_score_query(t.Query.term_set_query(self.index.schema, KEY, [int(k) for k in keys]), 0.0)
        found = dict(self._hits(t.Query.boolean_query([(t.Occur.Must, q), (t.Occur.Must, only)]), len(keys)))
        return [found.get(int(k), 0.0) for k in keys]
