"""Local full-text search over a corpus: BM25 over titles and texts, in tantivy.

Deviation from DR-Venus: the paper's `search` calls a web search API. Here the default
backend is a local index over the world's pages, so training and evaluation run offline,
reproducibly and fast (~100 µs per query at 50k pages on one core);
`RetrievalServerBackend` and web backends plug in behind the same `SearchBackend` protocol.

Why tantivy: chosen by measurement against bm25s and rank-bm25 (benchmarks/index_choice.py,
results in docs/benchmarks.md). It builds 2-3x faster than bm25s (3.6 s for 50k pages on
2 cores), matches it on plain BM25 queries, and its inverted index makes selective
queries cheap, which common-word pruning (below) turns into 2.5x more queries per second
than bm25s and ~400x more than rank-bm25; its HotpotQA recall is as good or better.

Design notes:
- Queries are never parsed with tantivy's query language. LLM output is full of quotes,
  colons, parentheses and AND/OR; instead the query is tokenised with the very analyzer the
  index uses and turned into a flat OR of term queries over the title and text fields,
  plus one boosted term for "the whole query is this page's title"; any string is a valid
  query and operators are just words.
- Hits map back to `Page` objects through a Python list, not tantivy's stored fields, so
  nothing is stored in the index and a hit costs one list lookup.
- Common-word pruning (in the spirit of Elasticsearch's former `cutoff_frequency`): a
  top-10 OR query over a word that is in a large share of page texts ("river", "born",
  "university" in a templated world) scores every one of those pages, because too few
  pages match the query's distinctive words to raise tantivy's pruning threshold. When the
  query has a distinctive word that occurs in the corpus, its common words are matched
  against titles only (short postings; they still separate "Grikra River" from "Grikrae
  University") and not against texts, where they carry little BM25 weight anyway. On the
  embedded world this is 2.6x (50k pages) to 5.7x (100k) faster with the same top hit for
  99.9% of agent queries; HotpotQA recall is unchanged (docs/benchmarks.md). A query made
  only of common words is searched in full.
- Ranking is deterministic, ties broken by corpus (insertion) order. One writer thread adds
  the pages in order, so in the usual single-segment index tantivy's own tie-break (lowest
  doc id) is corpus order. A corpus too big for the writer heap ends up in several segments,
  whose order tantivy does not keep; then ties at the cut-off are resolved explicitly.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

import tantivy

from venus_gym.corpus import Page

from .base import SearchHit, default_snippet

_TOKENIZER = "venus_en"
_EXACT_TOKENIZER = "venus_exact"
# Longer queries are never a page title; skipping them keeps the exact term small.
_MAX_EXACT_CHARS = 300
# Bump when the schema or analyzer changes, so stale on-disk indexes are rebuilt.
_FORMAT_VERSION = 1
_MARKER = "venus_index.json"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Common-word pruning never applies to words in at most this many pages: their postings
# cost microseconds, so ignoring them would change rankings for no speed gain.
_MIN_COMMON_DF = 1000


def _analyzer(stem: bool, stopwords: bool) -> tantivy.TextAnalyzer:
    # tantivy's "en_stem" chain: split on non-alphanumerics, drop tokens over 40 bytes
    # (hashes, base64 junk), lowercase, optionally drop Lucene's 33 English stopwords (they
    # only add noise and cost: every page has "the") and Porter-stem ("films" -> "film").
    builder = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
               .filter(tantivy.Filter.remove_long(40))
               .filter(tantivy.Filter.lowercase()))
    if stopwords:
        builder = builder.filter(tantivy.Filter.stopword("english"))
    if stem:
        builder = builder.filter(tantivy.Filter.stemmer("english"))
    return builder.build()


def _exact_analyzer() -> tantivy.TextAnalyzer:
    # The whole (whitespace-normalised) title as one lowercase term.
    return (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.raw())
            .filter(tantivy.Filter.lowercase()).build())


def _fingerprint(pages: list[Page], analysis: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"v{_FORMAT_VERSION} {analysis} n={len(pages)}\0".encode())
    for p in pages:
        h.update(f"{p.url}\0{p.title}\0{p.text}\0".encode())
    return h.hexdigest()


class LocalSearchIndex:
    """BM25 over pages' titles and texts, exact titles boosted. Implements `SearchBackend`.

    corpus:       a `Corpus` or any iterable of `Page`s; hits refer to these objects.
    path:         None (default) keeps the index in memory. A directory stores it on disk
                  and reopens it on the next construction if the pages are unchanged
                  (content fingerprint); a stale index we wrote there is rebuilt. A
                  non-empty directory that is not ours is never overwritten.
    title_boost:  weight of the title field relative to the text field. Title words are
                  already scored twice (title field + text); a further boost hurt
                  question-style queries on HotpotQA (docs/benchmarks.md), hence 1.
    exact_title_boost: extra weight when the whole query equals a page's title (case and
                  spacing aside), so "Ed Wood" finds "Ed Wood" before "Ed Wood (film)" and
                  a stopword-only title ("It") is still found.
    stem:         English Porter stemming at index and query time.
    stopwords:    drop English stopwords at index and query time.
    snippet_chars: length of the text excerpt shown for pages without a snippet.
    common_term_ratio: common-word pruning (see module doc). A query word in more than
                  this fraction of the pages (and in more than 1,000) is matched against
                  titles only when the query also has rarer words that occur somewhere.
                  None searches every word in both fields (plain BM25).
    max_query_terms: distinct terms kept from one query; bounds the cost of a runaway
                  LLM query (thousands of words) without affecting normal ones.
    heap_bytes:   tantivy writer memory budget. Memory is taken as needed, so a large
                  budget costs nothing on small corpora and keeps big ones in one segment.
    """

    def __init__(self, corpus: Iterable[Page], path: str | Path | None = None, *,
                 title_boost: float = 1.0, exact_title_boost: float = 4.0, stem: bool = True,
                 stopwords: bool = True, common_term_ratio: float | None = 0.05,
                 snippet_chars: int = 200, max_query_terms: int = 64,
                 heap_bytes: int = 1_000_000_000):
        if title_boost <= 0 or exact_title_boost < 0:
            raise ValueError("title_boost must be > 0 and exact_title_boost >= 0")
        self.pages: list[Page] = list(corpus)
        self.title_boost = float(title_boost)
        self.exact_title_boost = float(exact_title_boost)
        self.snippet_chars = snippet_chars
        self.max_query_terms = max_query_terms
        self.common_term_ratio = common_term_ratio  # read per query, so it may be changed
        self._snippets: list[str | None] = [None] * len(self.pages)
        self._analyzer = _analyzer(stem, stopwords)
        self._analysis = f"stem={stem} stopwords={stopwords}"
        self._exact = _exact_analyzer()
        self.reopened = False  # True when an on-disk index was reused instead of built

        builder = tantivy.SchemaBuilder()
        # Term frequencies are all BM25 needs; positions would only slow indexing down.
        builder.add_text_field("title", tokenizer_name=_TOKENIZER, index_option="freq")
        builder.add_text_field("text", tokenizer_name=_TOKENIZER, index_option="freq")
        builder.add_text_field("title_exact", tokenizer_name=_EXACT_TOKENIZER,
                               index_option="basic")
        # The page's position in self.pages; read only when the index has several segments.
        builder.add_integer_field("pid", indexed=False, fast=True)
        self._schema = builder.build()

        if path is None:
            self._index = self._build(tantivy.Index(self._schema), heap_bytes)
        else:
            self._index = self._open_or_build(Path(path), heap_bytes)
        self._searcher = self._index.searcher()
        if self._searcher.num_docs != len(self.pages):
            raise RuntimeError(f"search index holds {self._searcher.num_docs} documents "
                               f"for {len(self.pages)} pages")
        # With one segment written in corpus order, doc id == page position (see module doc).
        self._single_segment = self._searcher.num_segments <= 1

    def __len__(self) -> int:
        return len(self.pages)

    @property
    def num_segments(self) -> int:
        return self._searcher.num_segments

    # --- building -------------------------------------------------------------------------

    def _register(self, index: tantivy.Index) -> None:
        index.register_tokenizer(_TOKENIZER, self._analyzer)
        index.register_tokenizer(_EXACT_TOKENIZER, self._exact)

    def _build(self, index: tantivy.Index, heap_bytes: int) -> tantivy.Index:
        self._register(index)
        # One indexing thread: doc ids follow insertion order (deterministic ties); the
        # Python loop feeding it keeps a second core busy anyway.
        writer = index.writer(heap_bytes, 1)
        for pid, page in enumerate(self.pages):
            writer.add_document(tantivy.Document(
                title=page.title, text=page.text, title_exact=" ".join(page.title.split()),
                pid=pid))
        writer.commit()
        writer.wait_merging_threads()
        index.reload()
        return index

    def _open_or_build(self, path: Path, heap_bytes: int) -> tantivy.Index:
        fingerprint = _fingerprint(self.pages, self._analysis)
        marker = path / _MARKER
        if marker.is_file():
            try:
                meta = json.loads(marker.read_text(encoding="utf-8"))
            except ValueError:
                meta = {}
            if meta.get("fingerprint") == fingerprint and meta.get("complete"):
                index = tantivy.Index.open(str(path))
                self._register(index)
                index.reload()
                self.reopened = True
                return index
            shutil.rmtree(path)  # ours (it has our marker) but stale or half-written
        elif path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise FileExistsError(f"{path} exists and is not a venus-gym search index "
                                  f"(no {_MARKER}); refusing to overwrite it")
        path.mkdir(parents=True, exist_ok=True)
        # Written first with complete=false so an interrupted build is recognised as ours.
        meta = {"format": _FORMAT_VERSION, "fingerprint": fingerprint,
                "n_pages": len(self.pages), "complete": False}
        marker.write_text(json.dumps(meta), encoding="utf-8")
        index = self._build(tantivy.Index(self._schema, path=str(path), reuse=False),
                            heap_bytes)
        marker.write_text(json.dumps({**meta, "complete": True}), encoding="utf-8")
        return index

    # --- searching ------------------------------------------------------------------------

    def _query(self, query: str) -> tantivy.Query | None:
        schema = self._schema
        if not query.isascii():  # a lone surrogate cannot cross into tantivy (UTF-8)
            query = _LONE_SURROGATE.sub("\ufffd", query)
        clauses = []
        terms = list(dict.fromkeys(self._analyzer.analyze(query)))[: self.max_query_terms]
        text_terms = terms
        if self.common_term_ratio is not None and len(terms) > 1:
            common_df = max(int(self.common_term_ratio * len(self.pages)), _MIN_COMMON_DF)
            distinctive = [t for t in terms if 0 < self._doc_freq(t) <= common_df]
            if distinctive:
                text_terms = distinctive  # common words still count in titles
        # One flat OR over (field, term) pairs: BM25 per field, summed per page.
        for term in terms:
            title = tantivy.Query.term_query(schema, "title", term, index_option="freq")
            if self.title_boost != 1.0:
                title = tantivy.Query.boost_query(title, self.title_boost)
            clauses.append((tantivy.Occur.Should, title))
        for term in text_terms:
            clauses.append((tantivy.Occur.Should,
                            tantivy.Query.term_query(schema, "text", term, index_option="freq")))
        if self.exact_title_boost and len(query) <= _MAX_EXACT_CHARS:
            exact = self._exact.analyze(" ".join(query.split()))
            if exact and exact[0]:
                clauses.append((tantivy.Occur.Should, tantivy.Query.boost_query(
                    tantivy.Query.term_query(schema, "title_exact", exact[0],
                                             index_option="basic"),
                    self.exact_title_boost)))
        return tantivy.Query.boolean_query(clauses) if clauses else None

    def _doc_freq(self, term: str) -> int:
        # The text normally contains the title; a title-only word still counts as present.
        return (self._searcher.doc_freq("text", term)
                or self._searcher.doc_freq("title", term))

    def _top(self, query: str, k: int) -> list[tuple[int, float]]:
        """(page position, score) of the top `k` pages, best first, ties in corpus order."""
        if k <= 0:
            return []
        q = self._query(query)
        if q is None:
            return []
        if self._single_segment:
            return [(addr.doc, score)
                    for score, addr in self._searcher.search(q, k, count=False).hits]
        # Segment order is arbitrary here, so tantivy may cut a run of equal scores at the
        # wrong place. Fetch past the k-th hit until the run of its score is complete.
        limit = k + 1
        while True:
            hits = self._searcher.search(q, limit, count=False).hits
            if len(hits) < limit or hits[-1][0] < hits[k - 1][0]:
                break
            limit *= 4
        pids = self._searcher.fast_field_values("pid", [addr for _, addr in hits])
        ranked = sorted(zip(pids, (score for score, _ in hits)), key=lambda h: (-h[1], h[0]))
        return ranked[:k]

    def search_pages(self, query: str, k: int = 10) -> list[tuple[Page, float]]:
        """The top `k` (page, score) pairs for `query`, best first, ties in corpus order.

        Any string is accepted; one without a searchable word (empty, punctuation,
        only stopwords and no such title) gives [].
        """
        pages = self.pages
        return [(pages[pid], score) for pid, score in self._top(query, k)]

    def snippet(self, pid: int) -> str:
        """What a hit on page `pid` shows: its snippet or the start of its text (cached)."""
        snippet = self._snippets[pid]
        if snippet is None:
            snippet = self._snippets[pid] = default_snippet(self.pages[pid], self.snippet_chars)
        return snippet

    def search(self, query: str, k: int = 10) -> list[SearchHit]:
        """The top `k` hits for `query` (see `search_pages`), as `SearchHit`s."""
        pages = self.pages
        return [SearchHit(pages[pid].title, pages[pid].url, self.snippet(pid), score)
                for pid, score in self._top(query, k)]
