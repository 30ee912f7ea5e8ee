"""Deadlines, not timeouts (venus_gym.tools.deadline): a request ends by its deadline
however a server spreads its bytes over time, redirects included; retries wait only while
the deadline leaves time. Every HTTP client of the project goes through it; each one is
tried against a trickling server in tests/test_reliability_reproducers.py (section 2)."""

from __future__ import annotations

import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.trickle_server import TrickleServer
from venus_gym.tools.deadline import (
    Deadline,
    DeadlineExceeded,
    DeadlineHTTPConnection,
    open_url,
    read_error_body,
)
from venus_gym.tools.fetch import FetchFailed, GuardedFetcher

SLACK = 3.0  # generous: the machine is loaded; the servers below would hold 10 s or more


class SlowRedirects:
    """Every request waits `pause_s`, then redirects to the next hop (a page after `hops`)."""

    def __init__(self, pause_s: float, hops: int = 8):
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802 (http.server's name)
                outer.requests += 1
                time.sleep(pause_s)
                hop = int(self.path.strip("/") or 0)
                if hop < hops:
                    self.send_response(302)
                    self.send_header("Location", f"/{hop + 1}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b"<html><title>end</title><body>the end</body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_deadline_needs_time_and_says_when_it_passed():
    with pytest.raises(ValueError):
        Deadline(0)
    now = [0.0]
    deadline = Deadline(2.0, clock=lambda: now[0])
    assert deadline.remaining() == 2.0
    now[0] = 2.5
    assert deadline.left() == 0.0
    with pytest.raises(DeadlineExceeded, match="longer than 2.0 s"):
        deadline.remaining()
    assert issubclass(DeadlineExceeded, TimeoutError)


@pytest.mark.parametrize("mode", ["headers", "body"])
def test_http_client_and_urllib_end_at_the_deadline(mode):
    with TrickleServer(mode, total_s=10) as server:
        for call in ("http.client", "urllib"):
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                deadline = Deadline(0.5)
                if call == "urllib":
                    open_url(urllib.request.Request(server.url), deadline).read()
                else:
                    conn = DeadlineHTTPConnection("127.0.0.1", server.port, deadline=deadline)
                    conn.request("GET", "/")
                    conn.getresponse().read()
            assert time.monotonic() - started < SLACK * 0.5, call


def test_a_deadline_spans_redirects():
    web = SlowRedirects(pause_s=0.3, hops=5)  # 1.8 s in all, 0.3 s per hop
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):  # each hop is quick enough; the chain is not
            open_url(urllib.request.Request(web.url + "/0"), Deadline(1.0)).read()
        assert time.monotonic() - started < SLACK
        fetcher = GuardedFetcher(allow_hosts=[web.url.split("//")[1]], timeout_s=1.0,
                                 max_redirects=10, retries=0)
        started = time.monotonic()
        with pytest.raises(FetchFailed, match="longer than 1.0 s|did not answer within"):
            fetcher.fetch(web.url + "/0")
        assert time.monotonic() - started < SLACK
        # With time enough, the same chain is followed to its page.
        assert "the end" in GuardedFetcher(allow_hosts=[web.url.split("//")[1]],
                                           timeout_s=30, max_redirects=10).fetch(
            web.url + "/0").text
    finally:
        web.close()


def test_a_fetch_does_not_retry_once_its_deadline_leaves_no_time():
    sleeps = []
    with TrickleServer("body", total_s=10) as server:
        fetcher = GuardedFetcher(allow_hosts=[f"127.0.0.1:{server.port}"], timeout_s=0.5,
                                 retries=3, sleep=sleeps.append)
        started = time.monotonic()
        with pytest.raises(FetchFailed):
            fetcher.fetch(server.url)
        assert time.monotonic() - started < SLACK * 0.5
    assert sleeps == [] and server.connections == 1


def test_an_error_body_that_cannot_be_read_in_time_is_left_out():
    class Unreadable:
        def read(self, limit):
            raise DeadlineExceeded("took longer than 1 s in all")

    assert read_error_body(Unreadable(), 300) == ""

    class Readable:
        def read(self, limit):
            return b"quota exceeded \xff"[:limit]

    assert read_error_body(Readable(), 5) == "quota"
