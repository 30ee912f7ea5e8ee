"""The record/replay cache is strict (venus_gym.tools.cache): a file, table or row it cannot
use is a CacheError naming the file (and the key), never an observation; record mode checks
`cache_path` when it opens and keeps a live answer it could not store."""

from __future__ import annotations

import json
import sqlite3
import warnings

import pytest

from venus_gym.corpus import Corpus, Page
from venus_gym.tools import CacheError, CacheMissError, Toolbox
from venus_gym.tools.base import PageSummary, SearchHit
from venus_gym.tools.cache import (
    CachedPageStore,
    CachedSearch,
    CachedSummarizer,
    ToolCache,
    request_key,
)

HIT = SearchHit(title="T", url="https://x/1", snippet="s", score=1.5)


class Backend:
    def __init__(self):
        self.calls = 0

    def search(self, query, k):
        self.calls += 1
        return [HIT, SearchHit(title="lone \ud800", url="https://x/2", snippet="", score=0)]

    def fetch(self, url):
        return Page(url, "Title", "text")


class Summarizer:
    def summarize(self, page, goal):
        return PageSummary(rational="r", evidence="e", summary="s")


def recorded(path):
    """A cache file holding one search, one fetch and one summary."""
    cache = ToolCache(path, "record")
    CachedSearch(Backend(), cache, "p").search("q", 3)
    CachedPageStore(Backend(), cache).fetch("https://x/1")
    CachedSummarizer(Summarizer(), cache, "llm").summarize(Page("https://x/1", "T", "t"), "g")
    cache.close()


@pytest.mark.parametrize("content", [b"", b"version https://git-lfs.github.com/spec/v1\n",
                                     b"not sqlite at all\n" * 500])
def test_a_file_that_is_no_database_is_refused_in_both_modes(tmp_path, content):
    path = tmp_path / "c.sqlite"
    path.write_bytes(content)
    with pytest.raises(CacheError, match=f"{path}.*cannot be used for replay"):
        ToolCache(path, "replay")
    if content:  # an empty file is a new, empty database to SQLite: fine for recording
        with pytest.raises(CacheError, match=f"{path}.*cannot be used for record"):
            ToolCache(path, "record")


@pytest.mark.parametrize("schema", ["CREATE TABLE other (x)",
                                    "CREATE TABLE entries (key, answer)"])
def test_a_database_without_the_cache_table_is_refused(tmp_path, schema):
    path = tmp_path / "c.sqlite"
    db = sqlite3.connect(path)
    db.execute(schema)
    db.close()
    with pytest.raises(CacheError, match=str(path)):
        ToolCache(path, "replay")
    if "entries" in schema:
        with pytest.raises(CacheError, match="columns"):
            ToolCache(path, "record")
    else:
        ToolCache(path, "record").close()  # recording adds its table beside the other


def test_record_mode_refuses_a_directory_by_name(tmp_path):
    with pytest.raises(CacheError, match=f"{tmp_path}.*not a file"):
        ToolCache(tmp_path, "record")


@pytest.mark.parametrize("path", ["/proc/venus-gym-cache.sqlite",
                                  "/proc/venus-gym-no-such-dir/cache.sqlite"])
def test_record_mode_refuses_a_path_it_cannot_create_by_name(path):
    # /proc takes no new files, even from root (file modes would not stop root).
    with pytest.raises(CacheError, match=f"{path} cannot be used for record"):
        ToolCache(path, "record")


@pytest.mark.parametrize("response,kind", [
    ("not json", "search"), ('{"ok": [1, 2]}', "search"), ('{"ok": [], "extra": 1}', "search"),
    ('{"error": 5}', "search"), ('{"ok": {"url": "u"}}', "fetch"),
    ('{"ok": {"rational": "r"}}', "summary"),
])
@pytest.mark.parametrize("mode", ["replay", "record"])
def test_a_bad_row_stops_the_call_naming_file_and_key(tmp_path, response, kind, mode):
    path = tmp_path / "c.sqlite"
    recorded(path)
    db = sqlite3.connect(path)
    (key,) = db.execute("SELECT key FROM entries WHERE kind = ?", (kind,)).fetchone()
    db.execute("UPDATE entries SET response = ? WHERE key = ?", (response, key))
    db.commit()
    db.close()
    cache = ToolCache(path, mode)
    backend = Backend()
    calls = {"search": lambda: CachedSearch(backend, cache, "p").search("q", 3),
             "fetch": lambda: CachedPageStore(backend, cache).fetch("https://x/1"),
             "summary": lambda: CachedSummarizer(Summarizer(), cache, "llm").summarize(
                 Page("https://x/1", "T", "t"), "g")}
    with pytest.raises(CacheError) as raised:
        calls[kind]()
    assert str(path) in str(raised.value) and key in str(raised.value)
    assert backend.calls == 0  # nothing was made up live either


def test_the_toolbox_raises_a_cache_error_instead_of_showing_it(tmp_path):
    path = tmp_path / "c.sqlite"
    recorded(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE entries SET response = 'garbage'")
    db.commit()
    db.close()
    cache = ToolCache(path, "replay")
    toolbox = Toolbox(CachedSearch(Backend(), cache, "p"),
                      CachedPageStore(Backend(), cache), Summarizer(), top_k=3, timeout_s=5)
    with pytest.raises(CacheError, match=str(path)):
        toolbox.search(["q"])
    with pytest.raises(CacheError, match=str(path)):
        toolbox.visit(["https://x/1"], "g")
    with pytest.raises(CacheMissError):  # still a CacheError subclass, still raised
        Toolbox(CachedSearch(Backend(), cache, "p"), Corpus([]), Summarizer()).search(
            ["never recorded"])


def test_record_mode_keeps_the_live_answer_when_a_write_fails(tmp_path):
    path = tmp_path / "c.sqlite"
    cache = ToolCache(path, "record")
    cache._db.execute("PRAGMA busy_timeout = 0")  # fail at once rather than after 5 s
    holder = sqlite3.connect(path, timeout=0)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    backend = Backend()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hits = CachedSearch(backend, cache, "p").search("q", 3)
    finally:
        holder.rollback()
        holder.close()
    assert hits[0] == HIT and backend.calls == 1
    key = request_key("search", {"provider": "p", "endpoint": "", "query": "q", "k": 3})
    assert len(caught) == 1 and str(path) in str(caught[0].message)
    assert key in str(caught[0].message) and "replay" in str(caught[0].message)
    assert len(cache) == 0


def test_answers_with_a_lone_surrogate_are_recorded_and_replayed_equal(tmp_path):
    path = tmp_path / "c.sqlite"
    recorded(path)
    replayed = CachedSearch(Backend(), ToolCache(path, "replay"), "p").search("q", 3)
    assert replayed == Backend().search("q", 3)
    stored = sqlite3.connect(path).execute("SELECT response FROM entries WHERE kind = "
                                           "'search'").fetchone()[0]
    assert json.loads(stored)["ok"][1]["title"] == "lone \ud800"
