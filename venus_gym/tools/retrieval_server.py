"""Search-R1's retrieval-server protocol: a `SearchBackend` client and a server for our index.

Protocol (what Search-R1's `retrieval_server.py` and compatible retrievers speak):

    POST /retrieve  {"queries": ["..."], "topk": 3, "return_scores": true}
    ->  {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext..."},
                      "score": 12.3}, ...]]}          one list per query

With "return_scores": false the inner items are the documents themselves. Documents carry
the title as the quoted first line of "contents"; some retrievers send "title"/"text"
fields instead, and ours adds "url" and "snippet". The client reads all of these.

Deviation from Search-R1: there a retrieved passage is the whole "page" the model sees.
Our agent also visits pages, so the client remembers the documents it returned and serves
them back through `fetch` (it is a `PageStore` too). That lets a world run entirely off a
remote retriever: `Toolbox(backend, backend, summarizer)`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from venus_gym.corpus import Page

from .base import SearchHit, ToolBackendError, default_snippet
from .http import post_json
from .index import LocalSearchIndex


def _document_page(doc: Any, url_prefix: str) -> Page:
    if isinstance(doc, str):
        doc = {"contents": doc}
    if not isinstance(doc, dict):
        raise ToolBackendError(f"retrieval server sent a document that is neither an object "
                               f"nor a string: {doc!r:.200}")
    title = doc.get("title") if isinstance(doc.get("title"), str) else ""
    text = doc.get("text")
    if not isinstance(text, str):
        contents = str(doc.get("contents") or doc.get("content") or "")
        head, newline, text = contents.partition("\n")
        if not newline:  # no title line
            head, text = "", contents
        head = head.strip()
        if len(head) >= 2 and head[0] == head[-1] == '"':
            head = head[1:-1]
        title = title or head
    url = doc.get("url")
    if not isinstance(url, str) or not url:
        key = doc.get("id")
        if key is None:  # no id at all: a stable name derived from the content
            key = hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]
        url = f"{url_prefix}{key}"
    snippet = doc.get("snippet") if isinstance(doc.get("snippet"), str) else ""
    return Page(url=url, title=title or url, text=text, snippet=snippet)


class RetrievalServerBackend:
    """Client for a Search-R1-compatible retrieval server. A `SearchBackend` and `PageStore`.

    url:           base url ("http://host:8000") or the full ".../retrieve" endpoint.
    timeout_s:     per-request timeout.
    snippet_chars: snippet length for documents that bring none (most retrievers).
    url_prefix:    documents without a url are named `{url_prefix}{id}`.
    cache_pages:   how many returned documents `fetch` remembers (least recent dropped).
    """

    def __init__(self, url: str, timeout_s: float = 30.0, snippet_chars: int = 200,
                 url_prefix: str = "retrieval://doc/", cache_pages: int = 100_000):
        base = url.rstrip("/")
        self.url = base if base.endswith("/retrieve") else base + "/retrieve"
        self.timeout_s = timeout_s
        self.snippet_chars = snippet_chars
        self.url_prefix = url_prefix
        self.cache_pages = cache_pages
        self._pages: OrderedDict[str, Page] = OrderedDict()
        self._lock = threading.Lock()  # the toolbox may call from timeout worker threads

    def _post(self, payload: dict[str, Any]) -> Any:
        return post_json(self.url, payload, timeout_s=self.timeout_s, what="retrieval server")

    def search(self, query: str, k: int) -> list[SearchHit]:
        reply = self._post({"queries": [query], "topk": k, "return_scores": True})
        result = reply.get("result") if isinstance(reply, dict) else None
        if not isinstance(result, list):
            raise ToolBackendError(f"retrieval server reply has no 'result' list: "
                                   f"{str(reply)[:200]}")
        # Batch servers send one list per query; single-query variants a flat list.
        items = result[0] if result and isinstance(result[0], list) else result
        hits = []
        for item in items[:k]:
            doc, score = item, 0.0
            if isinstance(item, dict) and "document" in item:
                doc = item["document"]
                score = item.get("score", 0.0)
            page = _document_page(doc, self.url_prefix)
            snippet = default_snippet(page, self.snippet_chars)
            hits.append(SearchHit(page.title, page.url, snippet,
                                  float(score) if isinstance(score, int | float) else 0.0))
            self._remember(page)
        return hits

    def _remember(self, page: Page) -> None:
        with self._lock:
            self._pages[page.url] = page
            self._pages.move_to_end(page.url)
            while len(self._pages) > self.cache_pages:
                self._pages.popitem(last=False)

    def fetch(self, url: str) -> Page | None:
        """A document this client returned earlier (retrievers have no fetch endpoint)."""
        with self._lock:
            return self._pages.get(url)


def _request_topk(value: Any, default: int, max_topk: int) -> int:
    """Search-R1's rule: topk missing, null or 0 means the server's default; otherwise a
    positive integer (or its decimal string), capped at max_topk."""
    if value is None or value == 0 and not isinstance(value, bool):
        return default
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"'topk' must be a positive integer, null or 0 (the default "
                         f"{default}), got {json.dumps(value)}")
    return default if value == 0 else min(value, max_topk)


def _request_flag(value: Any, name: str) -> bool:
    """A boolean request field: true/false, or the strings "true"/"false"; null means false."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{name!r} must be true or false, got {json.dumps(value)}")


def serve_index(index: LocalSearchIndex, host: str = "127.0.0.1", port: int = 0,
                max_topk: int = 100, default_topk: int = 3
                ) -> tuple[ThreadingHTTPServer, threading.Thread, str]:
    """Serve `index` over the retrieval-server protocol from a background thread.

    Returns (server, thread, base_url); port 0 picks a free port. Stop with
    `server.shutdown(); server.server_close()`. Documents carry "url" and "snippet", so a
    `RetrievalServerBackend` pointed at it returns exactly the hits of `index.search`.

    Requests are checked before any search: "queries" a string or a list of strings;
    "topk" missing, null or 0 gives `default_topk` (as Search-R1's server does), else a
    positive integer capped at `max_topk`; "return_scores" true/false or "true"/"false"
    (null: false). Anything else is answered HTTP 400 with the reason. A query holding a
    lone surrogate (a `"\\ud800"` escape) is searched with U+FFFD in its place.
    """
    if not 1 <= default_topk <= max_topk:
        raise ValueError(f"default_topk must be in [1, max_topk={max_topk}], got {default_topk}")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def _send(self, status: int, payload: Any) -> None:
            text = json.dumps(payload, ensure_ascii=False)
            try:
                body = text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: send it as its JSON escape
                body = json.dumps(payload).encode("ascii")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/retrieve":
                self._send(404, {"error": f"unknown path {self.path}; use POST /retrieve"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"null")
                if not isinstance(request, dict):
                    raise ValueError("the body must be a JSON object")
                queries = request.get("queries", request.get("query"))
                if isinstance(queries, str):
                    queries = [queries]
                if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
                    raise ValueError("'queries' must be a list of strings")
                topk = _request_topk(request.get("topk"), default_topk, max_topk)
                with_scores = _request_flag(request.get("return_scores"), "return_scores")
            except (ValueError, TypeError, RecursionError) as e:
                self._send(400, {"error": f"bad request: {e}"})
                return
            result = []
            for q in queries:
                items = []
                for page, score in index.search_pages(q, topk):
                    doc = {"id": page.url, "url": page.url, "title": page.title,
                           "contents": f'"{page.title}"\n{page.text}',
                           "snippet": default_snippet(page, index.snippet_chars)}
                    items.append({"document": doc, "score": score} if with_scores else doc)
                result.append(items)
            self._send(200, {"result": result})

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    # A short poll interval so that shutdown() returns quickly (tests start many servers).
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="venus-retrieval-server", daemon=True)
    thread.start()
    return server, thread, f"http://{host}:{server.server_address[1]}"
