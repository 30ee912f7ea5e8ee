"""The `search` and `visit` tools as the environment calls them: one object, text out.

`Toolbox` combines a SearchBackend, a PageStore and a Summarizer (see base.py), renders
their answers in DR-Venus's formats (design.md "Turn format") and never raises for a backend
failure: exceptions and timeouts are retried with exponential backoff, then shown to the
agent as an error text (`ToolOutcome.ok` False, `.error` saying what went wrong). A policy
in RL training meets broken tools as observations, like any other, instead of crashing a
rollout worker. The one exception is `CacheError` (a replay cache lacks a request, or a
cache file, table or row cannot be read), which is raised: replay must reproduce recorded
observations, not invent new ones.

Deviation from DR-Venus: the public code lets a search call carry any number of queries and
a visit any number of urls; we cap both (`max_queries`, `max_urls`), run the first ones and
say so in the observation, so one turn cannot stall a batched rollout.

Queries, urls and goals are passed through `venus_gym.protocol.clean_text` before any
backend sees them: a query holding a lone surrogate (a `"\\ud800"` JSON escape) or a
control character is searched with U+FFFD in its place, not refused by an encoder deep in
a backend and reported to the agent as a tool failure.

A backend with `search_many(queries, k)` (the retrieval-server client) gets all queries of
a call in one request; should that fail, each query is run on its own as usual, so the
observation does not depend on it.

Cost: with the local backends and `timeout_s=None` a call is plain function calls; a
worker thread per backend call is only started when a timeout is set (remote backends).

Plug-in tools (venus_gym.tools.plugin: the calculator, MCP servers' tools) are called
through `call_plugin`, the same machinery: the timeout (a tool that enforces its own,
`tool.timeout_s`, as MCP tools do, gets no second one), retries of transient failures, the
record/replay cache for tools that name themselves for it (`tool.cache_identity`: MCP
tools), and the cost meter's `plugin_calls` for those tools' live calls. An exception
raised by the tool is the observation `"<name> failed: <type>: <message>"`; a transient
one (ToolBackendError, TimeoutError, OSError) is retried first, any other is the tool's
answer and is not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from venus_gym.protocol import clean_text

from .base import (
    CacheError,
    PageStore,
    PageSummary,
    SearchBackend,
    SearchHit,
    Summarizer,
    ToolBackendError,
)

T = TypeVar("T")

SEPARATOR = "\n=======\n"
#: Failures worth retrying: the backend may answer next time.
TRANSIENT_ERRORS = (ToolBackendError, TimeoutError, OSError)
VISIT_TEMPLATE = ("The useful information in {url} for user goal {goal} as follows: \n\n"
                  "Evidence in page: \n{evidence}\n\nSummary: \n{summary}\n")
VISIT_FAILED_EVIDENCE = ("The provided webpage content could not be accessed. "
                         "Please check the URL or file format.")
VISIT_FAILED_SUMMARY = ("The webpage content could not be processed, and therefore, "
                        "no information is available.")


@dataclass(frozen=True)
class ToolOutcome:
    """The result of one tool call.

    text:  what the agent sees (the environment wraps it in <tool_response>).
    ok:    False when any part failed: a backend error or timeout, an unknown url, invalid
           arguments, an unknown tool. Queries with no hits are not failures.
    error: what went wrong, for logs and `info` (None when ok).
    hits:  search: every hit shown, in order (all queries together).
    urls:  search: the urls of those hits; visit: the urls that were read successfully.
    """

    text: str
    ok: bool
    error: str | None = None
    hits: tuple[SearchHit, ...] = ()
    urls: tuple[str, ...] = ()


def render_hits(query: str, hits: list[SearchHit]) -> str:
    """One query's results: a header line, then `{i}. [{title}]({url})\\n{snippet}` blocks."""
    if not hits:
        return f"No results found for '{query}'. Try a shorter or different query."
    blocks = [f"{i}. [{h.title}]({h.url})" + (f"\n{h.snippet}" if h.snippet else "")
              for i, h in enumerate(hits, start=1)]
    return f"A search for '{query}' found {len(hits)} results:\n\n" + "\n\n".join(blocks)


def render_visit(url: str, goal: str, summary: PageSummary | None) -> str:
    """One page's visit text; `None` renders DR-Venus's fixed could-not-access text."""
    if summary is None:
        return VISIT_TEMPLATE.format(url=url, goal=goal, evidence=VISIT_FAILED_EVIDENCE,
                                     summary=VISIT_FAILED_SUMMARY)
    return VISIT_TEMPLATE.format(url=url, goal=goal, evidence=summary.evidence,
                                 summary=summary.summary)


def _invalid(tool: str, problem: str) -> ToolOutcome:
    text = f"Invalid arguments for {tool}: {problem}"
    return ToolOutcome(text=text, ok=False, error=text)


def _string_list(value: Any) -> list[str] | None:
    # Models often send a bare string where the schema asks for an array; accept it.
    if isinstance(value, str):
        return [clean_text(value)]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return [clean_text(v) for v in value]
    return None


class Toolbox:
    """search / visit over pluggable backends, with timeouts, retries and limits.

    top_k:         hits shown per query.
    timeout_s:     per backend call (one query, one page fetch, one summary); None = no
                   timeout and no thread. A call still running after it is abandoned.
    retries:       further attempts after a failure; the waits are backoff_s, 2*backoff_s,
                   4*backoff_s, ... each capped at max_backoff_s.
    max_queries / max_urls: most queries / urls one call runs; the rest are dropped with a
                   note in the observation.
    cost_meter:    optional; what the backends spent (venus_gym.tools.cache.CostMeter),
                   for the environment's cost report. The toolbox adds plug-in calls.
    cache:         optional venus_gym.tools.cache.ToolCache that records / replays the calls
                   of plug-in tools with a `cache_identity` (MCP tools). search and visit
                   bring their own cached backends.
    """

    def __init__(self, search_backend: SearchBackend, page_store: PageStore,
                 summarizer: Summarizer, top_k: int = 10, timeout_s: float | None = None,
                 retries: int = 0, backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 max_queries: int = 5, max_urls: int = 5, cost_meter: Any = None,
                 cache: Any = None):
        if top_k < 1 or max_queries < 1 or max_urls < 1:
            raise ValueError("top_k, max_queries and max_urls must be >= 1")
        if retries < 0 or backoff_s < 0 or max_backoff_s < 0:
            raise ValueError("retries, backoff_s and max_backoff_s must be >= 0")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError("timeout_s must be > 0 or None")
        self.search_backend = search_backend
        self.page_store = page_store
        self.summarizer = summarizer
        self.top_k = top_k
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_queries = max_queries
        self.max_urls = max_urls
        self.cost_meter = cost_meter
        self.cache = cache

    # --- dispatch ---------------------------------------------------------------------------

    def call(self, name: str, arguments: Any) -> ToolOutcome:
        """Run tool `name` with its JSON arguments; never raises."""
        if not isinstance(arguments, dict):
            return _invalid(str(name), "arguments must be a JSON object.")
        if name == "search":
            if "query" not in arguments:
                return _invalid("search", "missing 'query', a list of query strings.")
            return self.search(arguments["query"])
        if name == "visit":
            if "url" not in arguments:
                return _invalid("visit", "missing 'url', a list of urls to read.")
            if "goal" not in arguments:
                return _invalid("visit", "missing 'goal', what to look for in the pages.")
            return self.visit(arguments["url"], arguments["goal"])
        text = f"Unknown tool '{name}'. Available tools: search, visit."
        return ToolOutcome(text=text, ok=False, error=text)

    # --- tools ------------------------------------------------------------------------------

    def search(self, queries: list[str] | str) -> ToolOutcome:
        """Search every query (up to max_queries); sections joined by the separator."""
        checked = _string_list(queries)
        if checked is None:
            return _invalid("search", "'query' must be a non-empty list of strings, e.g. "
                                      '{"query": ["first query", "second query"]}.')
        run, note = self._limit(checked, self.max_queries, "queries")
        batch = None
        if len(run) > 1 and callable(getattr(self.search_backend, "search_many", None)):
            # One request for all queries (a remote retriever); if it fails, each query
            # is tried on its own below, so the observation is the same either way.
            batch, _ = self._attempt(self._search_many, run)
        sections, hits, errors = [], [], []
        for i, q in enumerate(run):
            if batch is not None:
                found, error = batch[i], None
            else:
                found, error = self._attempt(self._search_one, q)
            if error is not None:
                errors.append(f"search {q!r}: {error}")
                sections.append(f"The search for '{q}' failed ({error[:200]}). Try again "
                                f"later or use a different query.")
            else:
                sections.append(render_hits(q, found))
                hits.extend(found)
        text = SEPARATOR.join(sections) + note
        return ToolOutcome(text=text, ok=not errors, error="; ".join(errors) or None,
                           hits=tuple(hits), urls=tuple(h.url for h in hits))

    def visit(self, urls: list[str] | str, goal: str) -> ToolOutcome:
        """Read every url (up to max_urls) with the goal in mind; sections joined."""
        checked = _string_list(urls)
        if checked is None:
            return _invalid("visit", "'url' must be a non-empty list of url strings.")
        if not isinstance(goal, str):
            return _invalid("visit", "'goal' must be a string saying what to look for.")
        goal = clean_text(goal)
        run, note = self._limit(checked, self.max_urls, "urls")
        sections, read, errors = [], [], []
        for url in run:
            page, error = self._attempt(self.page_store.fetch, url)
            summary = None
            if error is None and page is None:
                error = "no such page"
            elif error is None:
                summary, error = self._attempt(self._summarize_one, page, goal)
            if error is not None:
                errors.append(f"visit {url!r}: {error}")
            else:
                read.append(url)
            sections.append(render_visit(url, goal, summary))
        text = SEPARATOR.join(sections) + note
        return ToolOutcome(text=text, ok=not errors, error="; ".join(errors) or None,
                           urls=tuple(read))

    def call_plugin(self, tool: Any, arguments: dict) -> ToolOutcome:
        """Run a plug-in tool (schema-checked arguments) through the toolbox's timeout,
        retries, record/replay cache and cost meter; never raises (CacheError aside)."""
        identity = getattr(tool, "cache_identity", None) or None

        def live(args: dict) -> dict[str, str]:
            if identity is not None and self.cost_meter is not None:
                self.cost_meter.add(plugin_calls=1)
            try:
                text = tool.call(args)
            except (CacheError, *TRANSIENT_ERRORS):
                raise  # retried (and, when recording, stored as a failure)
            except Exception as e:  # the tool's answer: recorded and shown, not retried
                return {"failed": f"{type(e).__name__}: {e}"}
            if not isinstance(text, str):
                return {"invalid": f"{tool.name} returned {type(text).__name__}, not the "
                                   f"observation text (str)"}
            return {"text": text}

        def once(args: dict) -> dict[str, str]:
            if identity is None or self.cache is None:
                return live(args)
            request = {"tool": identity, "arguments": args}
            return self.cache.lookup("plugin", request, lambda: live(args))

        own_timeout = getattr(tool, "timeout_s", None) is not None
        answer, error = self._attempt(once, arguments,
                                      timeout_s=None if own_timeout else self.timeout_s)
        if error is not None or "text" not in answer:
            text = answer.get("invalid") if answer else None
            text = text or f"{tool.name} failed: {error or answer.get('failed')}"
            return ToolOutcome(text=text, ok=False, error=text)
        return ToolOutcome(text=answer["text"], ok=True)

    # --- machinery --------------------------------------------------------------------------

    @staticmethod
    def _limit(items: list[str], limit: int, what: str) -> tuple[list[str], str]:
        if len(items) <= limit:
            return items, ""
        return items[:limit], (f"\n\nNote: only the first {limit} of {len(items)} {what} were "
                               f"run; a call may carry at most {limit} {what}.")

    def _search_one(self, query: str) -> list[SearchHit]:
        hits = list(self.search_backend.search(query, self.top_k))[: self.top_k]
        if not all(isinstance(h, SearchHit) for h in hits):
            raise TypeError("search backend returned something other than SearchHit objects")
        return hits

    def _search_many(self, queries: list[str]) -> list[list[SearchHit]]:
        results = list(self.search_backend.search_many(queries, self.top_k))
        if len(results) != len(queries):
            raise ToolBackendError(f"search backend answered {len(results)} of "
                                   f"{len(queries)} queries")
        batch = [list(found)[: self.top_k] for found in results]
        if not all(isinstance(h, SearchHit) for found in batch for h in found):
            raise TypeError("search backend returned something other than SearchHit objects")
        return batch

    def _summarize_one(self, page: Any, goal: str) -> PageSummary:
        summary = self.summarizer.summarize(page, goal)
        if not isinstance(summary, PageSummary):
            raise TypeError(f"summarizer returned {type(summary).__name__}, not PageSummary")
        return summary

    def _attempt(self, fn: Callable[..., T], *args: Any,
                 timeout_s: float | None | str = "toolbox") -> tuple[T | None, str | None]:
        """(result, None) on success; (None, error text) once every attempt failed.

        Only transient failures (ToolBackendError, timeouts, OSError: network, files) are
        retried; anything else is a deterministic bug or bad input that a retry would only
        repeat after sleeping, stalling a whole rollout group. `timeout_s` replaces the
        toolbox's timeout for this call (None: no timeout thread).
        """
        timeout = self.timeout_s if timeout_s == "toolbox" else timeout_s
        delay = self.backoff_s
        error = ""
        for attempt in range(self.retries + 1):
            try:
                if timeout is None:
                    return fn(*args), None
                return self._with_timeout(fn, args, timeout), None
            except CacheError:  # a replay that cannot answer stops; it never makes one up
                raise
            except TRANSIENT_ERRORS as e:
                error = f"{type(e).__name__}: {e}"
            except Exception as e:  # any other failure becomes an observation, not a crash
                return None, f"{type(e).__name__}: {e}"
            if attempt < self.retries:
                time.sleep(min(delay, self.max_backoff_s))
                delay *= 2
        attempts = self.retries + 1
        return None, error + (f" (after {attempts} attempts)" if attempts > 1 else "")

    def _with_timeout(self, fn: Callable[..., T], args: tuple[Any, ...],
                      timeout_s: float | None = None) -> T:
        # A daemon thread per call rather than a pool: an abandoned, hung call must neither
        # occupy a pool slot nor keep the interpreter from exiting.
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as e:  # handed to the caller's thread below
                box["error"] = e

        timeout = self.timeout_s if timeout_s is None else timeout_s
        worker = threading.Thread(target=work, name="venus-tool-call", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            raise TimeoutError(f"no answer within {timeout} s")
        if "error" in box:
            raise box["error"]
        return box["value"]
