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

A cache problem is never an observation. The file is checked when the cache opens: in
replay mode it must be an SQLite file with the `entries` table; in record mode `path` must
be such a file or not exist yet, and be writable. Anything else raises `CacheError`
naming the file. A stored row that cannot be read (corrupt page, not JSON, not an answer
of its kind) raises `CacheError` naming the file and the key, in both modes. In record
mode a failed write (a full disk, a file made read-only, a lock held too long) does not
lose the live answer: it is returned, and a RuntimeWarning names the file and the key
(a replay would miss that entry).

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
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from venus_gym.corpus import Page

from .base import (
    CacheError,
    CacheMissError,
    PageStore,
    PageSummary,
    SearchBackend,
    SearchHit,
    Summarizer,
    ToolBackendError,
)

CACHE_MODES = ("live", "record", "replay")
T = TypeVar("T")
_COLUMNS = ("key", "kind", "request", "response")
_SCHEMA = ("CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, kind TEXT NOT NULL, "
           "request TEXT NOT NULL, response TEXT NOT NULL)")


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
        self._db = self._open_replay() if mode == "replay" else self._open_record()

    def _unusable(self, why: str) -> CacheError:
        return CacheError(f"tool cache {self.path} cannot be used for {self.mode}: {why}")

    def _open_replay(self) -> sqlite3.Connection:
        assert self.path is not None
        if not self.path.is_file():
            raise FileNotFoundError(f"replay cache {self.path} does not exist; record one "
                                    f"first with cache_mode='record'")
        db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                             check_same_thread=False)
        self._check_schema(db, required=True)
        return db

    def _open_record(self) -> sqlite3.Connection:
        assert self.path is not None
        if self.path.exists() and not self.path.is_file():
            raise self._unusable("it is not a file (cache_path names an SQLite file)")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(str(self.path), check_same_thread=False)
        except (OSError, sqlite3.Error) as e:
            raise self._unusable(str(e)) from e
        self._check_schema(db, required=False)
        try:
            db.execute(_SCHEMA)
            db.commit()
            # Ask for the write lock once, so a file that cannot be written fails here.
            db.execute("BEGIN IMMEDIATE")
            db.rollback()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e):  # another writer: fine
                db.close()
                raise self._unusable(f"it cannot be written ({e})") from e
        except sqlite3.Error as e:
            db.close()
            raise self._unusable(str(e)) from e
        return db

    def _check_schema(self, db: sqlite3.Connection, required: bool) -> None:
        """An SQLite file whose `entries` table (required, or absent in a new file) has
        the cache's columns; else CacheError naming the file."""
        try:
            columns = tuple(row[1] for row in db.execute("PRAGMA table_info(entries)"))
        except sqlite3.Error as e:  # not a database: a text file, a Git LFS pointer, ...
            db.close()
            raise self._unusable(f"not an SQLite database ({e})") from e
        if not columns and not required:
            return
        if not columns:
            db.close()
            raise self._unusable("it has no 'entries' table (an empty or foreign SQLite "
                                 "file; record one with cache_mode='record')")
        if columns != _COLUMNS:
            db.close()
            raise self._unusable(f"its 'entries' table has the columns {list(columns)}, "
                                 f"not {list(_COLUMNS)}")

    def __len__(self) -> int:
        if self._db is None:
            return 0
        with self._lock:
            try:
                return self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
            except sqlite3.Error as e:
                raise CacheError(f"tool cache {self.path} cannot be read: {e}") from e

    def _get(self, key: str, kind: str) -> dict[str, Any] | None:
        """The stored answer under `key`, None if there is none; CacheError for a row
        that cannot be read or is not an answer ({"ok": ...} or {"error": str})."""
        assert self._db is not None
        with self._lock:
            try:
                row = self._db.execute("SELECT response FROM entries WHERE key = ?",
                                       (key,)).fetchone()
            except sqlite3.Error as e:  # a corrupt page, a file cut short
                raise CacheError(f"tool cache {self.path} cannot be read at the {kind} "
                                 f"entry {key}: {e}") from e
        if row is None:
            return None
        try:
            stored = json.loads(row[0])
        except (TypeError, ValueError) as e:
            raise CacheError(f"tool cache {self.path}: the {kind} entry {key} is not "
                             f"JSON ({e})") from None
        if not (isinstance(stored, dict) and len(stored) == 1
                and ("ok" in stored or isinstance(stored.get("error"), str))):
            raise CacheError(f"tool cache {self.path}: the {kind} entry {key} is not a "
                             f"stored answer ({{'ok': ...}} or {{'error': str}}): "
                             f"{str(row[0])[:200]}")
        return stored

    def _put(self, key: str, kind: str, request: dict[str, Any], response: dict) -> None:
        """Store an answer; in record mode a failed write warns and is otherwise ignored:
        the caller keeps its live answer (module docstring)."""
        assert self._db is not None
        # ASCII JSON: a lone surrogate (a JSON API may send one) cannot fail the encoding.
        values = (key, kind, json.dumps(request, sort_keys=True),
                  json.dumps(response, sort_keys=True))
        with self._lock:
            try:
                self._db.execute("INSERT OR REPLACE INTO entries (key, kind, request, "
                                 "response) VALUES (?, ?, ?, ?)", values)
                self._db.commit()
            except sqlite3.Error as e:
                try:
                    self._db.rollback()
                except sqlite3.Error:
                    pass
                warnings.warn(f"tool cache {self.path}: could not store the {kind} entry "
                              f"{key} ({e}); the live answer is used, but a replay of this "
                              f"recording will miss it", RuntimeWarning, stacklevel=4)

    def lookup(self, kind: str, request: dict[str, Any], compute: Callable[[], Any],
               decode: Callable[[Any], T] = lambda value: value) -> T:
        """The answer to `request` (a JSON value) by the cache mode; `compute` runs it live.

        `decode` turns the JSON value into what the caller returns; a stored value it
        rejects (TypeError, ValueError, KeyError) is a CacheError naming file and key.
        """
        if self.mode == "live":
            return decode(compute())
        key = request_key(kind, request)
        stored = self._get(key, kind)
        if stored is not None and (self.mode == "replay" or "error" not in stored):
            if self.meter is not None:
                self.meter.add(cache_hits=1)
            if "error" in stored:
                raise ToolBackendError(stored["error"])
            try:
                return decode(stored["ok"])
            except (TypeError, ValueError, KeyError, AttributeError) as e:
                raise CacheError(f"tool cache {self.path}: the {kind} entry {key} does not "
                                 f"hold a {kind} answer ({type(e).__name__}: {e})") from None
        if self.mode == "replay":
            raise CacheMissError(
                f"replay cache {self.path} has no entry for {kind} "
                f"{json.dumps(request, ensure_ascii=False, sort_keys=True)[:300]} "
                f"(key {key}); record it with cache_mode='record' first")
        try:
            value = compute()
        except CacheError:
            raise
        except Exception as e:  # stored, then raised in the form replay will raise it
            message = f"{type(e).__name__}: {e}"
            self._put(key, kind, request, {"error": message})
            raise ToolBackendError(message) from e
        self._put(key, kind, request, {"ok": value})
        return decode(value)

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

        return self.cache.lookup("search", request, live, _decode_hits)


class CachedPageStore:
    """A PageStore whose pages go through a ToolCache, keyed by the normalised url."""

    def __init__(self, store: PageStore, cache: ToolCache):
        self.store, self.cache = store, cache

    def fetch(self, url: str) -> Page | None:
        def live() -> dict[str, Any] | None:
            page = self.store.fetch(url)
            return None if page is None else page.to_json()

        return self.cache.lookup("fetch", {"url": normalize_url(url)}, live, _decode_page)


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

        return self.cache.lookup("summary", request, live, _decode_summary)


# Stored JSON back to the tools' types. A value of another shape raises (TypeError,
# ValueError): ToolCache.lookup reports it as a CacheError naming file and key.
def _fields(value: Any, strings: tuple[str, ...], numbers: tuple[str, ...] = ()
            ) -> dict[str, Any]:
    """`value` if it is an object with exactly these string and number fields."""
    if not isinstance(value, dict) or set(value) != {*strings, *numbers}:
        raise ValueError(f"expected an object with {[*strings, *numbers]}, got "
                         f"{str(value)[:120]}")
    if not all(isinstance(value[name], str) for name in strings) or not all(
            isinstance(value[name], int | float) and not isinstance(value[name], bool)
            for name in numbers):
        raise TypeError(f"{list(strings)} must be strings and {list(numbers)} numbers")
    return value


def _decode_hits(value: Any) -> list[SearchHit]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list of hits, got {type(value).__name__}")
    return [SearchHit(**_fields(item, ("title", "url", "snippet"), ("score",)))
            for item in value]


def _decode_page(value: Any) -> Page | None:
    if value is None:  # a url the store does not have
        return None
    return Page(**_fields(value, ("url", "title", "text", "snippet")))


def _decode_summary(value: Any) -> PageSummary:
    return PageSummary(**_fields(value, tuple(f.name for f in fields(PageSummary))))
