"""A fake web on 127.0.0.1 for the web tool tests: search APIs in the Serper, SearXNG and
Search-R1 `/retrieve` schemas, an OpenAI-compatible summarizer, and pages that redirect,
never end, answer slowly, are binary or come in several charsets."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

COUNTRIES = 24


def country_page(i: int) -> str:
    return (f"<html><head><title>Country {i}</title></head><body><nav>Home | About</nav>"
            f"<article><h1>Country {i}</h1><p>Country {i} is a small country in the fake "
            f"web used by the tests. The capital of Country {i} is City{i}ville. It lies on "
            f"a river.</p><p>Its flag is green and white.</p></article></body></html>")


class FakeWeb:
    """Start with `FakeWeb()`; `.url` is the base url, `.port` its port; `.close()`."""

    def __init__(self, serper_key: str = "test-serper-key"):
        self.serper_key = serper_key
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, headers)
        self.flaky_left = 0  # /flaky answers 429 this many times, then works
        self.sent_huge = 0
        web = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args):  # keep test output quiet
                pass

            def _send(self, status, body, ctype="text/html; charset=utf-8", headers=None):
                data = body if isinstance(body, bytes) else body.encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _json(self, status, obj, headers=None):
                self._send(status, json.dumps(obj), "application/json", headers)

            def do_GET(self):
                web.requests.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
                parts = urlsplit(self.path)
                q = parse_qs(parts.query)
                path = parts.path
                if path == "/searxng/search":
                    query = q.get("q", [""])[0]
                    self._json(200, {"query": query, "results": web.results(query)})
                elif path.startswith("/page/"):
                    self._send(200, country_page(int(path.rsplit("/", 1)[1])))
                elif path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", q["to"][0])
                    self.end_headers()
                elif path == "/loop":
                    self.send_response(301)
                    self.send_header("Location", "/loop")
                    self.end_headers()
                elif path == "/huge":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.end_headers()
                    try:
                        for _ in range(2000):  # 128 MB if nobody stops reading
                            self.wfile.write(b"word " * 13107)
                            web.sent_huge += 65535
                    except OSError:
                        pass
                elif path == "/slow":
                    time.sleep(2.0)
                    try:
                        self._send(200, country_page(1))
                    except OSError:  # the client gave up, as it should
                        pass
                elif path == "/binary":
                    self._send(200, bytes(range(256)) * 4, "application/octet-stream")
                elif path == "/pdf":
                    self._send(200, b"%PDF-1.4 not really", "application/pdf")
                elif path == "/latin1":
                    self._send(200, "<html><body><p>Caf\u00e9 in Z\u00fcrich serves "
                               "cr\u00e8me br\u00fbl\u00e9e every day of the week.</p>"
                               "</body></html>".encode("latin-1"),
                               "text/html; charset=iso-8859-1")
                elif path == "/utf8meta":
                    self._send(200, "<html><head><meta charset=\"utf-8\"><title>M\u00fcnchen"
                               "</title></head><body><p>M\u00fcnchen liegt an der Isar, "
                               "sagt das \u00c4mt.</p></body></html>".encode(), "text/html")
                elif path == "/latin1meta":
                    self._send(200, "<html><head><meta http-equiv=\"Content-Type\" content="
                               "\"text/html; charset=iso-8859-1\"></head><body><p>Se\u00f1or "
                               "Mu\u00f1oz naci\u00f3 en Espa\u00f1a.</p></body></html>"
                               .encode("latin-1"), "text/html")
                elif path == "/text":
                    self._send(200, "Plain text page. The answer is 42.", "text/plain")
                elif path == "/status500":
                    self._send(500, "oops")
                elif path == "/echo-host":
                    self._send(200, f"<html><body><p>Host header was {self.headers['Host']}."
                               f"</p></body></html>")
                else:
                    self._send(404, "not found")

            def do_POST(self):
                web.requests.append(("POST", self.path, {k.lower(): v for k, v in self.headers.items()}))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/serper/search":
                    if self.headers.get("X-API-KEY") != web.serper_key:
                        # a careless server echoing the key it got
                        self._json(403, {"message": f"bad key {self.headers.get('X-API-KEY')}"})
                        return
                    self._json(200, {"organic": [
                        {"title": r["title"], "link": r["url"], "snippet": r["content"],
                         "position": n + 1}
                        for n, r in enumerate(web.results(body["q"])[: body["num"]])]})
                elif self.path == "/flaky/search":
                    if web.flaky_left > 0:
                        web.flaky_left -= 1
                        self._json(429, {"error": "slow down"}, {"Retry-After": "3"})
                        return
                    self._json(200, {"organic": []})
                elif self.path == "/v1/chat/completions":
                    prompt = body["messages"][0]["content"]
                    sentence = next((s for s in prompt.split(". ") if "capital" in s), "")
                    reply = {"rational": "r", "evidence": sentence + ".",
                             "summary": f"LLM: {sentence}."}
                    self._json(200, {"choices": [{"message": {"content": json.dumps(reply)}}],
                                     "usage": {"prompt_tokens": 100,
                                               "completion_tokens": 10}})
                else:
                    self._json(404, {"error": "no such endpoint"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def results(self, query: str) -> list[dict]:
        """Country i's page first for a query naming "Country i"."""
        words = query.replace("?", " ").split()
        hits = []
        for i in range(COUNTRIES):
            if str(i) in words:
                hits.insert(0, i)
            elif len(hits) < 3:
                hits.append(i)
        return [{"title": f"Country {i}", "url": f"{self.url}/page/{i}",
                 "content": f"About Country {i}.", "score": 1.0 / (n + 1)}
                for n, i in enumerate(hits[:5])]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
