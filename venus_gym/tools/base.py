"""Types shared by every tool backend: search hits, page summaries and the backend protocols.

The agent sees two tools (design.md "Turn format"): `search(query: list[str])` and
`visit(url: list[str], goal: str)`. Behind them sit three small, swappable parts:

    SearchBackend  query -> ranked hits      (local index, Search-R1 retrieval server, web API)
    PageStore      url -> Page or None       (a world's corpus, a fetcher)
    Summarizer     page + goal -> summary    (extractive, or an LLM as in DR-Venus)

`venus_gym.tools.toolbox.Toolbox` combines them, renders the text the agent reads and turns
every backend failure into an observation, so backends may simply raise `ToolBackendError`.

Deviation from DR-Venus: its tools are wired to one web search API, one page fetcher and
one summarizer LLM. Splitting them behind protocols lets the same agent-facing tools run
on a local corpus (offline training), a Search-R1 retriever or the web, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from venus_gym.corpus import Corpus, Page
from venus_gym.protocol import clean_text


@dataclass(frozen=True)
class SearchHit:
    """One search result as the agent sees it: `{i}. [{title}]({url})\\n{snippet}`."""

    title: str
    url: str
    snippet: str
    score: float


@dataclass(frozen=True)
class PageSummary:
    """What a visit returns for one page; field names follow DR-Venus's summarizer JSON
    (including its spelling of `rational`)."""

    rational: str
    evidence: str
    summary: str


class ToolBackendError(RuntimeError):
    """A backend could not answer (HTTP error, timeout, unparseable reply).

    The toolbox catches it (and any other exception), retries if configured, and finally
    shows the agent an error text instead of raising.
    """


class CacheError(LookupError):
    """A tool cache cannot be used: a file that is not a usable cache, a table or row that
    cannot be read, a stored answer of the wrong shape. The message names the file (and
    the request's key when one is concerned).

    Raised rather than shown to the agent, like CacheMissError (its subclass): a replay
    that made up observations for what it cannot read would silently differ from its
    recording.
    """


class CacheMissError(CacheError):
    """A replay cache has no entry for a tool request.

    The one tool failure that is raised rather than shown to the agent: a replayed run must
    reproduce the recorded observations byte for byte, and an observation made up for a
    missing entry would silently change the episode. The message names the request, its
    key and the cache file.
    """


@runtime_checkable
class SearchBackend(Protocol):
    def search(self, query: str, k: int) -> list[SearchHit]:
        """The top `k` hits for one query, best first. Any string is a valid query."""
        ...


@runtime_checkable
class PageStore(Protocol):
    def fetch(self, url: str) -> Page | None:
        """The page at `url`, or None when there is none."""
        ...


@runtime_checkable
class Summarizer(Protocol):
    def summarize(self, page: Page, goal: str) -> PageSummary:
        """Goal-focused evidence and summary of one page."""
        ...


class CorpusPageStore:
    """A PageStore over an in-memory Corpus (the usual store for a local world).

    A url holding control characters is shown to the agent, and handed back by the
    toolbox, in its cleaned form (`venus_gym.protocol.clean_text`); such pages are found
    under that form too.
    """

    def __init__(self, corpus: Corpus):
        self.corpus = corpus
        self._by_clean_url: dict[str, Page] | None = None

    def fetch(self, url: str) -> Page | None:
        page = self.corpus.get(url)
        if page is None and ("\ufffd" in url or "\n" in url):
            if self._by_clean_url is None:  # built once, from the few unclean urls only
                self._by_clean_url = {}
                for candidate in self.corpus:
                    cleaned = clean_text(candidate.url)
                    if cleaned != candidate.url:
                        self._by_clean_url.setdefault(cleaned, candidate)
            page = self._by_clean_url.get(url)
        return page


class ChainedPageStore:
    """Asks each store in turn; the first page found wins (e.g. a retrieval server's own
    documents first, then the local corpus)."""

    def __init__(self, *stores: PageStore):
        self.stores = stores

    def fetch(self, url: str) -> Page | None:
        for store in self.stores:
            page = store.fetch(url)
            if page is not None:
                return page
        return None


def default_snippet(page: Page, max_chars: int = 200) -> str:
    """The page's own snippet, else the start of its text cut at a word boundary.

    Used when a page comes without a snippet (real QA paragraphs, retrieval servers); the
    embedded world writes snippets that deliberately avoid the answer.
    """
    if page.snippet:
        return page.snippet
    text = page.text
    if len(text) <= max_chars:
        return " ".join(text.split())
    cut = text.rfind(" ", 0, max_chars)
    # Cut mid-word only when the text has no space in its second half (e.g. a long URL).
    head = text[: cut if cut > max_chars // 2 else max_chars]
    return " ".join(head.split()) + " ..."
