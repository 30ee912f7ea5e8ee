"""Web tools against a fake web on 127.0.0.1: search providers (Serper, SearXNG, /retrieve)
with retries and rate limits, the guarded fetcher (addresses, redirects, limits, content
types, charsets), long-page chunking and the record/replay cache."""

from __future__ import annotations

import sqlite3
import ssl

import pytest

from tests.web_fixtures import FakeWeb
from venus_gym.corpus import Corpus, Page
from venus_gym.tools import CacheMissError, LocalSearchIndex, ToolBackendError, serve_index
from venus_gym.tools.cache import CachedPageStore, CachedSearch, CostMeter, ToolCache
from venus_gym.tools.fetch import FetchFailed, FetchRefused, GuardedFetcher, address_refusal
from venus_gym.tools.summarize import ChunkedSummarizer, ExtractiveSummarizer, chunk_text
from venus_gym.tools.web_search import (
    JsonClient,
    RetrieveSearch,
    SearxngSearch,
    SerperSearch,
    make_search_provider,
)


@pytest.fixture(scope="module")
def web():
    w = FakeWeb()
    yield w
    w.close()


class Sleeps:
    def __init__(self):
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def fetcher(web, **kwargs):
    kwargs.setdefault("allow_hosts", [f"127.0.0.1:{web.port}"])
    kwargs.setdefault("sleep", Sleeps())
    return GuardedFetcher(**kwargs)


# --- search providers ------------------------------------------------------------------------

def test_serper_reads_key_from_env_and_parses_organic(web, monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", "test-serper-key")
    search = SerperSearch(JsonClient("serper"), web.url + "/serper")
    hits = search.search("capital of Country 7", 2)
    assert [h.title for h in hits] == ["Country 7", "Country 0"]
    assert hits[0].url == f"{web.url}/page/7" and hits[0].snippet == "About Country 7."
    method, path, headers = web.requests[-1]
    assert (method, path, headers["x-api-key"]) == ("POST", "/serper/search", "test-serper-key")
    assert "test-serper-key" not in repr(search)


def test_serper_without_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    with pytest.raises(ValueError, match="SERPER_API_KEY"):
        make_search_provider("serper", None, JsonClient("serper"))


def test_key_echoed_by_server_is_scrubbed(web, monkeypatch):
    monkeypatch.setenv("MY_SEARCH_KEY", "sekret-123-xyz")
    search = SerperSearch(JsonClient("serper", retries=0), web.url + "/serper",
                          api_key_env="MY_SEARCH_KEY")
    with pytest.raises(ToolBackendError) as e:
        search.search("q", 3)
    assert "HTTP 403" in str(e.value) and "sekret-123-xyz" not in str(e.value)
    assert "***" in str(e.value)


def test_searxng_parses_results(web):
    search = SearxngSearch(JsonClient("searxng"), web.url + "/searxng")
    hits = search.search("Country 3 capital", 3)
    assert [h.url for h in hits][0] == f"{web.url}/page/3"
    assert len(hits) == 3 and hits[0].score == 1.0
    assert web.requests[-1][1].startswith("/searxng/search?q=Country+3+capital&format=json")


def test_retrieve_provider_speaks_search_r1():
    corpus = Corpus([Page("doc://a", "Alpha", "Alpha is the first letter."),
                     Page("doc://b", "Beta", "Beta is the second letter.")])
    server, _, url = serve_index(LocalSearchIndex(corpus))
    try:
        search = make_search_provider("retrieve", url, JsonClient("retrieve"))
        assert isinstance(search, RetrieveSearch)
        hits = search.search("second letter", 1)
        assert [h.url for h in hits] == ["doc://b"]
        assert search.fetch("doc://b").text == "Beta is the second letter."
    finally:
        server.shutdown()
        server.server_close()


def test_429_is_retried_with_exponential_backoff_and_retry_after(web, monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", "k")
    sleeps = Sleeps()
    web.flaky_left = 2
    client = JsonClient("flaky", retries=3, backoff_s=1.0, max_backoff_s=10.0, sleep=sleeps)
    assert SerperSearch(client, web.url + "/flaky").search("q", 3) == []
    # Retry-After: 3 raises the first wait to 3 s; the second is the doubled backoff, 2 s,
    # again raised to Retry-After.
    assert sleeps.calls == [3.0, 3.0]
    web.flaky_left = 5
    with pytest.raises(ToolBackendError, match="HTTP 429.*after 3 attempts"):
        SerperSearch(JsonClient("flaky", retries=2, sleep=sleeps, max_backoff_s=1.0),
                     web.url + "/flaky").search("q", 3)
    web.flaky_left = 0


def test_4xx_is_not_retried(web):
    sleeps = Sleeps()
    client = JsonClient("searxng", retries=3, sleep=sleeps)
    with pytest.raises(ToolBackendError, match="HTTP 404"):
        client.request("GET", web.url + "/nothing-here")
    assert sleeps.calls == []


def test_unreachable_is_retried_then_reported():
    sleeps = Sleeps()
    client = JsonClient("searxng", retries=2, backoff_s=0.5, sleep=sleeps, timeout_s=2)
    with pytest.raises(ToolBackendError, match="unreachable.*after 3 attempts"):
        client.request("GET", "http://127.0.0.1:9/search")  # discard port: refused
    assert sleeps.calls == [0.5, 1.0]


def test_rate_limit_waits_the_min_interval():
    sleeps = Sleeps()
    now = [100.0]
    client = JsonClient("x", min_interval_s=1.5, sleep=sleeps, clock=lambda: now[0])
    client._pace()
    client._pace()  # no time passed: waits the whole interval
    now[0] += 1.0
    client._pace()  # at 101.0, the last start was (virtually) 101.5: waits until 103.0
    assert sleeps.calls == [1.5, 2.0]


# --- the guard ---------------------------------------------------------------------------------

@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.0.0.1", "192.168.1.1", "172.16.0.5", "169.254.169.254", "0.0.0.0",
    "224.0.0.1", "240.0.0.1", "100.64.0.1", "::1", "::", "fe80::1", "fc00::1", "ff02::1",
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "2002:7f00:1::1"])
def test_non_global_addresses_are_refused(address):
    assert address_refusal(address) is not None


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111"])
def test_global_addresses_pass(address):
    assert address_refusal(address) is None


@pytest.mark.parametrize("url", [
    "file:///etc/passwd", "ftp://example.org/x", "gopher://x/", "data:text/html,hi",
    "http://user:pw@example.org/", "http:///nohost", "http://[::1]/",
    "http://0.0.0.0/", "http://169.254.169.254/latest/meta-data/"])
def test_guard_refuses_schemes_credentials_and_literal_addresses(url):
    f = GuardedFetcher(resolver=lambda h, p: ["93.184.216.34"])
    with pytest.raises(FetchRefused):
        f.fetch(url)


def test_loopback_is_refused_unless_allow_listed(web):
    with pytest.raises(FetchRefused, match="loopback"):
        GuardedFetcher().fetch(f"{web.url}/page/1")
    page = fetcher(web).fetch(f"{web.url}/page/1")
    assert "The capital of Country 1 is City1ville." in page.text
    assert page.title == "Country 1" and "Home | About" not in page.text  # main text only


def test_allow_list_names_host_and_port(web):
    other_port = GuardedFetcher(allow_hosts=[f"127.0.0.1:{web.port + 1}"])
    with pytest.raises(FetchRefused):
        other_port.fetch(f"{web.url}/page/1")
    assert "City1ville" in GuardedFetcher(allow_hosts=["127.0.0.1"]).fetch(
        f"{web.url}/page/1").text


@pytest.mark.parametrize("answer", [["10.0.0.1"], ["169.254.169.254"], ["::ffff:127.0.0.1"],
                                    ["93.184.216.34", "10.0.0.1"]])
def test_dns_answers_are_checked(answer):
    f = GuardedFetcher(resolver=lambda host, port: answer)
    with pytest.raises(FetchRefused, match="public.example"):
        f.fetch("http://public.example/")


def test_connects_to_the_checked_address_with_the_name_as_host(web):
    # DNS rebinding: a second resolution would answer differently; there is none.
    answers = iter([["127.0.0.1"], ["10.9.9.9"]])
    calls = []

    def resolver(host, port):
        calls.append(host)
        return next(answers)

    f = GuardedFetcher(allow_hosts=["public.example"], resolver=resolver)
    page = f.fetch(f"http://public.example:{web.port}/echo-host")
    assert calls == ["public.example"]
    assert f"Host header was public.example:{web.port}." in page.text


def test_https_connects_to_the_address_and_checks_the_name(web):
    class RecordingContext:  # stands in for ssl: records what the handshake would verify
        verify_mode = ssl.CERT_REQUIRED
        check_hostname = True
        post_handshake_auth = None

        def __init__(self):
            self.server_hostname = None
            self.peer = None

        def wrap_socket(self, sock, server_hostname=None):
            self.server_hostname, self.peer = server_hostname, sock.getpeername()
            return sock

    context = RecordingContext()
    f = GuardedFetcher(allow_hosts=["secure.example"], resolver=lambda h, p: ["127.0.0.1"],
                       context=context)
    page = f.fetch(f"https://secure.example:{web.port}/echo-host")
    assert context.server_hostname == "secure.example"
    assert context.peer == ("127.0.0.1", web.port)
    assert f"Host header was secure.example:{web.port}." in page.text


def test_redirects_are_followed_and_rechecked(web):
    f = fetcher(web)
    assert "City2ville" in f.fetch(f"{web.url}/redirect?to=/page/2").text
    for target in ("http://localhost:{port}/page/1", "http://127.0.0.1:{other}/page/1",
                   "file:///etc/passwd", "http://169.254.169.254/latest/meta-data/",
                   "http://10.0.0.1/"):
        url = f"{web.url}/redirect?to=" + target.format(port=web.port, other=web.port + 1)
        with pytest.raises(FetchRefused):
            f.fetch(url)
    with pytest.raises(FetchRefused, match="redirects"):
        f.fetch(f"{web.url}/loop")


def test_redirect_to_a_name_resolving_privately_is_refused(web):
    def resolver(host, port):
        return ["169.254.169.254"] if host == "metadata.example" else ["127.0.0.1"]

    f = fetcher(web, resolver=resolver)
    with pytest.raises(FetchRefused, match="link-local"):
        f.fetch(f"{web.url}/redirect?to=http://metadata.example/")


def test_huge_body_stops_at_max_bytes(web):
    page = fetcher(web, max_bytes=100_000).fetch(f"{web.url}/huge")
    assert page.text.endswith("[... page cut at 100000 bytes ...]")
    assert len(page.text) < 100_100
    assert web.sent_huge < 100 * 1_000_000  # the server was stopped long before the end


def test_slow_response_times_out(web):
    f = fetcher(web, timeout_s=0.3, retries=0)
    with pytest.raises(FetchFailed, match="did not answer"):
        f.fetch(f"{web.url}/slow")


def test_total_time_limit_uses_the_clock(web):
    ticks = iter(range(0, 1000, 10))  # every clock reading is 10 s later
    f = fetcher(web, timeout_s=15, retries=0, clock=lambda: next(ticks))
    with pytest.raises(FetchFailed, match="longer than 15"):
        f.fetch(f"{web.url}/page/1")


def test_content_types(web):
    f = fetcher(web)
    with pytest.raises(FetchRefused, match="application/octet-stream"):
        f.fetch(f"{web.url}/binary")
    with pytest.raises(FetchRefused, match="application/pdf"):
        f.fetch(f"{web.url}/pdf")
    assert f.fetch(f"{web.url}/text").text == "Plain text page. The answer is 42."


def test_http_errors_retry_5xx_only(web):
    sleeps = Sleeps()
    f = fetcher(web, retries=2, sleep=sleeps)
    with pytest.raises(FetchFailed, match="HTTP 404"):
        f.fetch(f"{web.url}/missing")
    assert sleeps.calls == []
    with pytest.raises(FetchFailed, match="HTTP 500"):
        f.fetch(f"{web.url}/status500")
    assert sleeps.calls == [1.0, 2.0]


@pytest.mark.parametrize("path, expected", [
    ("/latin1", "Caf\u00e9 in Z\u00fcrich serves cr\u00e8me br\u00fbl\u00e9e"),
    ("/utf8meta", "M\u00fcnchen liegt an der Isar, sagt das \u00c4mt."),
    ("/latin1meta", "Se\u00f1or Mu\u00f1oz naci\u00f3 en Espa\u00f1a."),
])
def test_charsets(web, path, expected):
    page = fetcher(web).fetch(web.url + path)
    assert expected in page.text and "\ufffd" not in page.text


def test_meter_counts_fetches_and_bytes(web):
    meter = CostMeter()
    fetcher(web, meter=meter).fetch(f"{web.url}/redirect?to=/page/4")
    snap = meter.snapshot()
    assert snap["fetch_calls"] == 2 and snap["bytes_received"] == len(
        __import__("tests.web_fixtures", fromlist=["x"]).country_page(4))


# --- long pages ----------------------------------------------------------------------------

def test_chunk_text_bounds_and_keeps_everything():
    text = "\n".join(f"Line {i} " + "word " * (i % 50) for i in range(400))
    chunks = chunk_text(text, 1000)
    assert all(len(c) <= 1000 for c in chunks) and len(chunks) > 5
    assert " ".join(" ".join(chunks).split()) == " ".join(text.split())
    assert all(len(c) <= 1000 for c in chunk_text("x" * 5000, 1000))


def test_chunked_summarizer_reads_every_chunk_up_to_the_limit():
    seen = []

    class Recorder:
        def summarize(self, page, goal):
            seen.append(len(page.text))
            return ExtractiveSummarizer().summarize(page, goal)

    text = "\n".join(f"Filler sentence number {i} about nothing." for i in range(300))
    text += "\nThe treasure is buried under the old oak."
    page = Page("u", "T", text)
    whole = ChunkedSummarizer(Recorder(), chunk_chars=2000, max_chunks=100).summarize(
        page, "where is the treasure buried")
    assert len(seen) > 5 and max(seen) <= 2000
    assert "buried under the old oak" in whole.evidence
    seen.clear()
    cut = ChunkedSummarizer(Recorder(), chunk_chars=2000, max_chunks=2).summarize(page, "x")
    assert len(seen) == 2 and "Only the first 2 of" in cut.rational


# --- record / replay ---------------------------------------------------------------------------

def test_record_then_replay_and_miss(web, tmp_path):
    path = tmp_path / "tools.sqlite"
    record = ToolCache(path, "record")
    search = CachedSearch(SearxngSearch(JsonClient("s"), web.url + "/searxng"), record,
                          "searxng", web.url)
    pages = CachedPageStore(fetcher(web), record)
    hits = search.search("Country  5", 3)
    page = pages.fetch(hits[0].url)
    with pytest.raises(ToolBackendError, match="FetchFailed: .*HTTP 404"):
        pages.fetch(f"{web.url}/missing")
    n_requests = len(web.requests)
    record.close()

    meter = CostMeter()
    replay = ToolCache(path, "replay", meter=meter)

    class Dead:
        def search(self, q, k):
            raise AssertionError("network in replay")

        def fetch(self, url):
            raise AssertionError("network in replay")

    search2 = CachedSearch(Dead(), replay, "searxng", web.url)
    pages2 = CachedPageStore(Dead(), replay)
    assert search2.search("Country 5", 3) == hits  # whitespace-normalised key
    assert pages2.fetch(hits[0].url + "#frag") == page
    with pytest.raises(ToolBackendError, match="FetchFailed: .*HTTP 404"):
        pages2.fetch(f"{web.url}/missing")
    with pytest.raises(CacheMissError) as e:
        pages2.fetch(f"{web.url}/page/9")
    assert str(path) in str(e.value) and "page/9" in str(e.value) and "key " in str(e.value)
    assert len(web.requests) == n_requests
    assert meter.snapshot()["cache_hits"] == 3
    with pytest.raises(sqlite3.OperationalError):  # replay opens the file read-only
        replay._db.execute("DELETE FROM entries")


def test_replay_without_a_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="cache_mode='record'"):
        ToolCache(tmp_path / "none.sqlite", "replay")
