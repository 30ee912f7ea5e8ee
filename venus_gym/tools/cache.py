"""Record and replay of tool calls (SQLite), and what a run spent.

Every search, page fetch and LLM summary of a web environment goes through one of the
`Cached*` wrappers below. Each request has a key, the SHA-256 of its kind and its
normalised request as canonical JSON (provider and endpoint included, credentials never),
and the answer is stored under it in one SQLite file:

    live     the cache is not used at all.
    record   read-through: a stored answer is reused, anything else runs live and is stored
             (answers and final failures both; a stored failure is retried live, so a
             transient error does not stick).
    replay   only stored answers; no network. A request without an entry raises
             `CacheMissError` naming the request, its key and the file.

Failures are stored as their message and raised again as `ToolBackendError` in both record
and replay mode, so the observation the agent sees is the same byte for byte (information
gain is computed from observations). A cache file is plain SQLite, so it can ship with a
dataset and be opened read-only (replay never writes).

`CostMeter` counts what a run spent: search API calls, page fetches, bytes received, LLM
summariser calls and tokens, live calls of MCP servers' tools (`plugin_calls`), cache hits.
Replayed answers cost nothing but a hit. MCP tool listings and calls are recorded here too
(kinds "mcp_tools" and "plugin", keyed by the server's URL or command line, the tool and
its arguments; venus_gym.tools.mcp_tools).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from venus_gym.corpus import Page

from .base import (
    CacheMissError,
    PageStore,
    PageSummary,
    SearchBackend,
    SearchHit,
    Summarizer,
    ToolBackendError,
)

CACHE_MODES = ("live", "record", "replay")


@dataclass
class CostMeter:
    """Running totals of what tools spent (thread-safe; shared by a group of environments)."""

    search_calls: int = 0
    fetch_calls: int = 0
    bytes_received: int = 0
    summarizer_calls: int = 0
    summarizer_prompt_tokens: int = 0
    summarizer_completion_tokens: int = 0
    cache_hits: int = 0
    plugin_calls: int = 0  # live calls of remote plug-in tools (MCP servers)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self)
                    if not f.name.startswith("_")}


def normalize_url(url: str) -> str:
    """Cache form of a url: scheme and host lower-cased, default port and fragment dropped."""
    try:
        parts = urlsplit(url.strip())
        host = (parts.hostname or "").lower()
        port = parts.port
    except ValueError:
        return url.strip()
    scheme = parts.scheme.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is not None and (scheme, port) not in (("http", 80), ("https", 443)):
        host = f"{host}:{port}"
    return urlunsplit((scheme, host, parts.path or ("/" if host else ""), parts.query, ""))


def request_key(kind: str, request: dict[str, Any]) -> str:
    canonical = json.dumps({"kind": kind, **request}, sort_keys=True, ensure_ascii=False,
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class ToolCache:
    """One SQLite file of recorded tool answers (see the module docstring for the modes)."""

    def __init__(self, path: str | Path | None, mode: str = "record",
                 meter: CostMeter | None = None):
        if mode not in CACHE_MODES:
            raise ValueError(f"cache mode must be one of {CACHE_MODES}, got {mode!r}")
        self.mode = mode
        self.meter = meter
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if mode == "live":
            return
        if self.path is None:
            raise ValueError(f"cache_mode={mode!r} needs cache_path (an SQLite file)")
        if mode == "replay":
            if not self.path.is_file():
                raise FileNotFoundError(f"replay cache {self.path} does not exist; record one "
                                        f"first with cache_mode='record'")
            self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                       check_same_thread=False)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), check_same_thread=False)
            self._db.execute("CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, "
                             "kind TEXT NOT NULL, request TEXT NOT NULL, "
                             "response TEXT NOT NULL)")
            self._db.commit()

    def __len__(self) -> int:
        if self._db is None:
            return 0
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]

    def _get(self, key: str) -> dict[str, Any] | None:
        assert self._db is not None
        with self._lock:
            try:
                row = self._db.execute("SELECT response FROM entries WHERE key = ?",
                                       (key,)).fetchone()
            except sqlite3.DatabaseError as e:
                raise ToolBackendError(f"tool cache {self.path} unreadable: {e}") from e
        return None if row is None else json.loads(row[0])

    def _put(self, key: str, kind: str, request: dict[str, Any], response: dict) -> None:
        assert self._db is not None
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO entries (key, kind, request, response) "
                "VALUES (?, ?, ?, ?)",
                (key, kind, json.dumps(request, sort_keys=True, ensure_ascii=False),
                 json.dumps(response, sort_keys=True, ensure_ascii=False)))
            self._db.commit()

    def lookup(self, kind: str, request: dict[str, Any], compute: Callable[[], Any]) -> Any:
        """The answer to `request` (a JSON value) by the cache mode; `compute` runs it live."""
        if self.mode == "live":
            return compute()
        key = request_key(kind, request)
        stored = self._get(key)
        if stored is not None and (self.mode == "replay" or "error" not in stored):
            if self.meter is not None:
                self.meter.add(cache_hits=1)
            if "error" in stored:
                raise ToolBackendError(stored["error"])
            return stored["ok"]
        if self.mode == "replay":
            raise CacheMissError(
                f"replay cache {self.path} has no entry for {kind} "
                f"{json.dumps(request, ensure_ascii=False, sort_keys=True)[:300]} "
                f"(key {key}); record it with cache_mode='record' first")
        try:
            value = compute()
        except CacheMissError:
            raise
        except Exception as e:  # stored, then raised in the form replay will raise it
            message = f"{type(e).__name__}: {e}"
            self._put(key, kind, request, {"error": message})
            raise ToolBackendError(message) from e
        self._put(key, kind, request, {"ok": value})
        return value

    def close(self) -> None:
        if self._db is not None:
            with self._lock:
                self._db.close()
            self._db = None


class CachedSearch:
    """A SearchBackend whose answers go through a ToolCache, keyed by provider, endpoint,
    the query with its whitespace collapsed, and k."""

    def __init__(self, backend: SearchBackend, cache: ToolCache, provider: str,
                 endpoint: str = ""):
        self.backend, self.cache = backend, cache
        self.provider, self.endpoint = provider, endpoint

    def search(self, query: str, k: int) -> list[SearchHit]:
        request = {"provider": self.provider, "endpoint": self.endpoint,
                   "query": " ".join(query.split()), "k": k}

        def live() -> list[dict[str, Any]]:
            return [asdict(h) for h in self.backend.search(query, k)]

        return [SearchHit(**h) for h in self.cache.lookup("search", request, live)]


class CachedPageStore:
    """A PageStore whose pages go through a ToolCache, keyed by the normalised url."""

    def __init__(self, store: PageStore, cache: ToolCache):
        self.store, self.cache = store, cache

    def fetch(self, url: str) -> Page | None:
        def live() -> dict[str, Any] | None:
            page = self.store.fetch(url)
            return None if page is None else page.to_json()

        stored = self.cache.lookup("fetch", {"url": normalize_url(url)}, live)
        return None if stored is None else Page(**stored)


class CachedSummarizer:
    """A Summarizer (an LLM, which need not answer the same twice) behind a ToolCache, keyed
    by `identity` (endpoint and model), the page url, a hash of its text, and the goal."""

    def __init__(self, summarizer: Summarizer, cache: ToolCache, identity: str):
        self.summarizer, self.cache, self.identity = summarizer, cache, identity

    def summarize(self, page: Page, goal: str) -> PageSummary:
        request = {"summarizer": self.identity, "url": page.url, "goal": goal,
                   "text_sha256": hashlib.sha256(page.text.encode("utf-8")).hexdigest()}

        def live() -> dict[str, str]:
            return asdict(self.summarizer.summarize(page, goal))

        return PageSummary(**self.cache.lookup("summary", request, live))
