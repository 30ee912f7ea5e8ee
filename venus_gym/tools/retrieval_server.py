"""Search-R1's retrieval-server protocol: a `SearchBackend` client and a server for our index.

Protocol (what Search-R1's `retrieval_server.py` and compatible retrievers speak):

    POST /retrieve  {"queries": ["..."], "topk": 3, "return_scores": true}
    ->  {"result": [[{"document": {"id": "...", "contents": "\\"Title\\"\\ntext..."},
                      "score": 12.3}, ...]]}          one list per query

With "return_scores": false the inner items are the documents themselves. Documents carry
the title as the quoted first line of "contents"; some retrievers send "title"/"text"
fields instead, and ours adds "url" and "snippet". The client reads all of these.

A search call with several queries is sent as one request (`search_many`, which the
toolbox uses when a backend has it).

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
from http.server import BaseHTTPRequestHandler
from typing import Any

from venus_gym.corpus import Page

from .base import SearchHit, ToolBackendError, default_snippet
from .http import post_json
from .index import LocalSearchIndex
from .serving import DEFAULT_BACKLOG, BurstHTTPServer, check_backlog


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
    timeout_s:     deadline of one request, the whole reply included (not per read).
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
        return self._hits(items, k)

    def search_many(self, queries: list[str], k: int) -> list[list[SearchHit]]:
        """Every query's hits from one request (Search-R1's batch form), in order."""
        reply = self._post({"queries": list(queries), "topk": k, "return_scores": True})
        result = reply.get("result") if isinstance(reply, dict) else None
        if (not isinstance(result, list) or len(result) != len(queries)
                or not all(isinstance(items, list) for items in result)):
            raise ToolBackendError(f"retrieval server reply has no 'result' list with one "
                                   f"list per query: {str(reply)[:200]}")
        return [self._hits(items, k) for items in result]

    def _hits(self, items: list[Any], k: int) -> list[SearchHit]:
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


# --- the server ------------------------------------------------------------------------------
#
# Deviation from Search-R1's server (FastAPI, one JSON form): one stdlib server speaks the
# dialects the peers' clients actually send, so they work against it unmodified:
#   * Search-R1 / verl:  JSON {"queries": [...], "topk", "return_scores"} -> one list per query;
#   * SkyRL-gym:         JSON {"query": "...", ...}                       -> [[...]] (the same);
#   * GEM:               msgpack {"query": "...", ...} with no content type -> a msgpack reply
#                        whose "result" is the flat list of the one query's documents.
# Bad input of any kind is answered (4xx and a reason in "error"), never a dropped
# connection: a client that gets no reply retries, and SkyRL's retries wait for 45 s.

JSON_TYPES = ("application/json", "text/json")
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
# Sent by clients that post raw bytes (GEM: requests' data=bytes) or by curl -d: the body
# decides (JSON starts with "{" after whitespace, anything else is read as msgpack).
SNIFFED_TYPES = ("", "application/octet-stream", "application/x-www-form-urlencoded",
                 "text/plain")
_DRAIN_LIMIT = 64 << 20  # a larger refused body is not read: the connection is closed


class RequestError(Exception):
    """A request the server refuses: HTTP `status` and the reason sent back."""

    def __init__(self, status: int, reason: str, close: bool = False):
        super().__init__(reason)
        self.status, self.reason, self.close = status, reason, close


def _msgpack() -> Any:
    try:
        import msgpack
    except ImportError:
        raise RequestError(415, "this server cannot read msgpack: install the 'msgpack' "
                                "package (pip install msgpack) or send JSON") from None
    return msgpack


def _decode_request(content_type: str, body: bytes) -> tuple[Any, str]:
    """(decoded body, "json" | "msgpack") or RequestError."""
    media = content_type.split(";")[0].strip().lower()
    if media in JSON_TYPES or media.endswith("+json"):
        kind = "json"
    elif media in MSGPACK_TYPES:
        kind = "msgpack"
    elif media in SNIFFED_TYPES:
        kind = "json" if body.lstrip()[:1] == b"{" or not body.strip() else "msgpack"
    else:
        raise RequestError(415, f"unsupported Content-Type {media!r}: send application/json "
                                f"or application/msgpack")
    if not body.strip():
        raise RequestError(400, "bad request: empty body; send a JSON object such as "
                                '{"queries": ["..."], "topk": 3}')
    try:
        if kind == "json":
            return json.loads(body), kind
        return _msgpack().unpackb(body, raw=False, strict_map_key=False), kind
    except RequestError:
        raise
    except RecursionError:
        raise RequestError(400, f"bad request: the {kind} body is nested too deeply") from None
    except Exception as e:  # any decoder failure (msgpack raises several kinds) is the client's
        raise RequestError(400, f"bad request: the body is not valid {kind}: "
                                f"{type(e).__name__}: {str(e)[:200]}") from None


def _request_queries(request: Any, max_queries: int, max_query_chars: int
                     ) -> tuple[list[str], bool]:
    """(queries, single): `single` when the body held one bare string under "query"."""
    if not isinstance(request, dict):
        raise ValueError("the body must be an object with 'queries' (a list of strings) or "
                         "'query' (a string)")
    if "queries" in request and "query" in request:
        raise ValueError("give 'queries' (a list) or 'query' (a string), not both")
    if "queries" not in request and "query" not in request:
        raise ValueError("missing 'queries' (a list of strings) or 'query' (a string)")
    queries = request.get("queries", request.get("query"))
    single = isinstance(queries, str)
    if single:
        queries = [queries]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError("'queries' must be a list of strings")
    if len(queries) > max_queries:
        raise ValueError(f"{len(queries)} queries in one request, over max_queries="
                         f"{max_queries}; split the batch")
    for i, q in enumerate(queries):
        if len(q) > max_query_chars:
            raise ValueError(f"query {i} is {len(q)} characters, over max_query_chars="
                             f"{max_query_chars}")
    return queries, single


def serve_index(index: LocalSearchIndex, host: str = "127.0.0.1", port: int = 0,
                max_topk: int = 100, default_topk: int = 3, max_queries: int = 1024,
                max_query_chars: int = 10_000, max_body_bytes: int = 8 << 20,
                idle_timeout_s: float = 120.0, backlog: int = DEFAULT_BACKLOG
                ) -> tuple[BurstHTTPServer, threading.Thread, str]:
    """Serve `index` over the retrieval-server protocol from a background thread.

    Returns (server, thread, base_url); port 0 picks a free port. Stop with
    `server.shutdown(); server.server_close()`. Documents carry "url" and "snippet", so a
    `RetrievalServerBackend` pointed at it returns exactly the hits of `index.search`.

    HTTP/1.1 with keep-alive: every reply has a Content-Length and a connection serves any
    number of requests (one idle longer than `idle_timeout_s` is closed). One thread per
    connection; the listen backlog (`backlog`, default 128) holds a burst of clients
    connecting at once, and a client that disconnects early is logged as one line
    (`venus_gym.tools.serving`).

    Requests are checked before any search: "queries" a list of strings or "query" a string
    (at most `max_queries`, each at most `max_query_chars` characters); "topk" missing, null
    or 0 gives `default_topk` (as Search-R1's server does), else a positive integer; one
    above `max_topk` is cut to it and the reply says so ("topk" and "warning" fields next
    to "result"); "return_scores" true/false or "true"/"false" (null: false). The body is
    JSON or msgpack (see JSON_TYPES, MSGPACK_TYPES, SNIFFED_TYPES) and the reply uses the
    request's encoding. Anything else is answered 400 (bad fields or body), 413 (a body
    over `max_body_bytes`), 415 (another content type), 404 (another path) or 405 (another
    method), always with the reason under "error". Lone surrogates and control characters
    in a query are searched with U+FFFD in their place.
    """
    if not 1 <= default_topk <= max_topk:
        raise ValueError(f"default_topk must be in [1, max_topk={max_topk}], got {default_topk}")
    if max_queries < 1 or max_query_chars < 1 or max_body_bytes < 1:
        raise ValueError("max_queries, max_query_chars and max_body_bytes must be >= 1")
    check_backlog(backlog)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection
        timeout = idle_timeout_s  # a silent client releases its thread
        # Headers and body leave in two writes; with Nagle's algorithm the second waits for
        # the client's delayed ACK (~40 ms), which caps a keep-alive connection at ~25 req/s.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def _send(self, status: int, payload: Any, kind: str = "json",
                  close: bool = False) -> None:
            if kind == "msgpack":
                try:
                    body = _msgpack().packb(payload, use_bin_type=True)
                except UnicodeEncodeError:  # a lone surrogate in a document
                    body = _msgpack().packb(payload, use_bin_type=True,
                                            unicode_errors="replace")
                content_type = "application/msgpack"
            else:
                try:
                    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate: send it as its JSON escape
                    body = json.dumps(payload).encode("ascii")
                content_type = "application/json"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding"):
                raise RequestError(411, "chunked bodies are not supported: send a "
                                        "Content-Length", close=True)
            raw = self.headers.get("Content-Length") or "0"
            try:
                length = int(raw)
                if length < 0:
                    raise ValueError
            except ValueError:
                raise RequestError(400, f"bad request: Content-Length {raw[:50]!r} is not a "
                                        f"length", close=True) from None
            if length > max_body_bytes:
                if length > _DRAIN_LIMIT:
                    raise RequestError(413, f"body of {length} bytes, over max_body_bytes="
                                            f"{max_body_bytes}", close=True)
                remaining = length  # read and drop it, so the connection stays usable
                while remaining > 0:
                    chunk = self.rfile.read(min(remaining, 1 << 20))
                    if not chunk:
                        break
                    remaining -= len(chunk)
                raise RequestError(413, f"body of {length} bytes, over max_body_bytes="
                                        f"{max_body_bytes}")
            return self.rfile.read(length)

        def do_POST(self) -> None:
            kind = "json"
            try:
                body = self._read_body()  # read first: an unread body would poison keep-alive
                if self.path.split("?")[0].rstrip("/") != "/retrieve":
                    raise RequestError(404, f"unknown path {self.path[:200]}; use POST /retrieve")
                request, kind = _decode_request(self.headers.get("Content-Type", ""), body)
                try:
                    queries, single = _request_queries(request, max_queries, max_query_chars)
                    asked = request.get("topk")
                    topk = _request_topk(asked, default_topk, 10**9)
                    with_scores = _request_flag(request.get("return_scores"), "return_scores")
                except (ValueError, TypeError, RecursionError) as e:
                    raise RequestError(400, f"bad request: {e}") from None
            except RequestError as e:
                self._send(e.status, {"error": e.reason}, kind, close=e.close)
                return
            reply: dict[str, Any] = {}
            if topk > max_topk:
                reply["warning"] = f"topk {topk} is over this server's max_topk; cut to {max_topk}"
                topk = max_topk
            try:
                result = [self._search(q, topk, with_scores) for q in queries]
            except Exception as e:  # a bug or a broken index: say so, keep serving
                self._send(500, {"error": f"search failed: {type(e).__name__}: {e}"[:1000]}, kind)
                return
            # GEM's msgpack client reads the one query's documents as a flat list.
            reply["result"] = result[0] if single and kind == "msgpack" else result
            reply["topk"] = topk
            self._send(200, dict(sorted(reply.items(), key=lambda kv: kv[0] != "result")), kind)

        def _search(self, query: str, topk: int, with_scores: bool) -> list[Any]:
            items = []
            for page, score in index.search_pages(query, topk):
                doc = {"id": page.url, "url": page.url, "title": page.title,
                       "contents": f'"{page.title}"\n{page.text}',
                       "snippet": default_snippet(page, index.snippet_chars)}
                items.append({"document": doc, "score": score} if with_scores else doc)
            return items

        def _refuse_method(self) -> None:
            try:
                self._read_body()
            except RequestError as e:
                self._send(e.status, {"error": e.reason}, close=e.close)
                return
            self._send(405, {"error": f"{self.command} is not supported; use POST /retrieve"})

        do_GET = do_PUT = do_DELETE = do_PATCH = _refuse_method

    server = BurstHTTPServer((host, port), Handler, backlog=backlog, name="retrieval server")
    # A short poll interval so that shutdown() returns quickly (tests start many servers).
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="venus-retrieval-server", daemon=True)
    thread.start()
    return server, thread, f"http://{host}:{server.server_address[1]}"
