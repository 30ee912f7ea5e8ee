"""Web search providers behind `SearchBackend`: Serper, SearXNG and Search-R1's `/retrieve`.

    SerperSearch      POST {url}/search, header X-API-KEY, body {"q", "num"}
                      -> {"organic": [{"title", "link", "snippet", "position"}]}
                      (google.serper.dev and API-compatible services)
    SearxngSearch     GET {url}/search?q=...&format=json
                      -> {"results": [{"title", "url", "content", "score"}]}
                      (the instance must enable the json format in its settings.yml)
    RetrieveSearch    Search-R1's POST /retrieve (`RetrievalServerBackend`), through the
                      same retrying client; its documents are served back by `fetch`.

All three share `JsonClient`: a minimum interval between requests (rate limit), retries
with exponential backoff on HTTP 429, 5xx, timeouts and connection failures (a Retry-After
header is honoured up to the backoff cap), a deadline per request attempt (the whole reply
must arrive within `timeout_s`, however slowly the server sends it), and counts in a
`CostMeter`. The sleep and clock are injectable, so tests neither wait nor time anything.

API keys come from environment variables only (`api_key_env` names the variable), never
from a config file; the key is held privately, left out of `repr`, and scrubbed from any
error message (a server may echo request headers), so it cannot reach an observation, the
step `info`, a log or a cache file.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from .base import SearchHit, ToolBackendError
from .cache import CostMeter
from .deadline import Deadline, open_url, read_error_body
from .http import HTTPStatusError
from .retrieval_server import RetrievalServerBackend

SEARCH_PROVIDERS = ("serper", "searxng", "retrieve")
#: Default environment variable holding each provider's key (None: no key needed).
DEFAULT_KEY_ENV = {"serper": "SERPER_API_KEY", "searxng": None, "retrieve": None}
_MAX_REPLY_BYTES = 20_000_000


def _is_retryable(error: Exception) -> bool:
    if isinstance(error, HTTPStatusError):
        return error.status == 429 or error.status >= 500
    return isinstance(error, TimeoutError | ConnectionError | _Unreachable)


class _Unreachable(ToolBackendError):
    pass


class JsonClient:
    """JSON requests to one service with rate limiting, retries, timeouts and accounting.

    what:            the service's name in error messages.
    timeout_s:       deadline of one request attempt, reply included (not per read).
    retries:         further attempts after a retryable failure (429, 5xx, timeout,
                     connection error); waits backoff_s, 2*backoff_s, ... capped at
                     max_backoff_s (or the server's Retry-After, under the same cap).
    min_interval_s:  least time between the starts of two requests (0 = no limit).
    secrets:         strings scrubbed from every error message (API keys).
    sleep / clock:   injectable for tests (time.sleep, time.monotonic).
    """

    def __init__(self, what: str, *, timeout_s: float = 30.0, retries: int = 2,
                 backoff_s: float = 1.0, max_backoff_s: float = 30.0,
                 min_interval_s: float = 0.0, meter: CostMeter | None = None,
                 secrets: tuple[str, ...] = (),
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic):
        if timeout_s <= 0 or retries < 0 or backoff_s < 0 or min_interval_s < 0:
            raise ValueError("timeout_s must be > 0; retries, backoff_s and min_interval_s "
                             ">= 0")
        self.what, self.timeout_s, self.retries = what, timeout_s, retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.min_interval_s = min_interval_s
        self.meter = meter
        self._secrets = tuple(s for s in secrets if s)
        self.sleep, self.clock = sleep, clock
        self._last_start: float | None = None
        self._rate_lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"JsonClient({self.what!r}, timeout_s={self.timeout_s}, retries={self.retries}, "
                f"min_interval_s={self.min_interval_s})")

    def add_secret(self, secret: str | None) -> None:
        if secret:
            self._secrets = (*self._secrets, secret)

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def request(self, method: str, url: str, *, payload: Any = None,
                params: Mapping[str, Any] | None = None,
                headers: Mapping[str, str] | None = None) -> Any:
        """The decoded JSON reply; raises ToolBackendError once every attempt failed."""
        if params:
            url = url + ("&" if "?" in url else "?") + urllib.parse.urlencode(params)
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return self._once(method, url, payload, headers or {})
            except ToolBackendError as e:
                if attempt == self.retries or not _is_retryable(e):
                    suffix = f" (after {attempt + 1} attempts)" if attempt else ""
                    raise ToolBackendError(self.scrub(str(e)) + suffix) from None
                wait = min(delay, self.max_backoff_s)
                retry_after = getattr(e, "retry_after", None)
                if retry_after is not None:
                    wait = min(max(wait, retry_after), self.max_backoff_s)
                self.sleep(wait)
                delay *= 2
        raise AssertionError("unreachable")

    def _pace(self) -> None:
        with self._rate_lock:
            now = self.clock()
            if self._last_start is not None and self.min_interval_s > 0:
                wait = self._last_start + self.min_interval_s - now
                if wait > 0:
                    self.sleep(wait)
                    now += wait
            self._last_start = now

    def _once(self, method: str, url: str, payload: Any, headers: Mapping[str, str]) -> Any:
        self._pace()
        data = None
        all_headers = {"Accept": "application/json", "User-Agent": "venus-gym", **headers}
        if payload is not None:
            data = json.dumps(payload).encode("utf-8")
            all_headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=all_headers, method=method)
        if self.meter is not None:
            self.meter.add(search_calls=1)
        try:
            with open_url(request, Deadline(self.timeout_s)) as response:
                raw = response.read(_MAX_REPLY_BYTES + 1)
        except urllib.error.HTTPError as e:
            detail = read_error_body(e, 300)
            error = HTTPStatusError(f"{self.what} {url} answered HTTP {e.code}: {detail}",
                                    e.code)
            retry_after = e.headers.get("Retry-After") if e.headers else None
            if retry_after is not None and retry_after.strip().isdigit():
                error.retry_after = float(retry_after)  # type: ignore[attr-defined]
            raise error from None
        except TimeoutError as e:
            raise _Timeout(f"{self.what} {url} did not answer within {self.timeout_s} s") from e
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise _Timeout(f"{self.what} {url} did not answer within "
                               f"{self.timeout_s} s") from e
            raise _Unreachable(f"{self.what} {url} unreachable: {e.reason}") from e
        except (ConnectionError, OSError) as e:  # reset mid-reply, refused
            raise _Unreachable(f"{self.what} {url} unreachable: {e}") from e
        if self.meter is not None:
            self.meter.add(bytes_received=len(raw))
        if len(raw) > _MAX_REPLY_BYTES:
            raise ToolBackendError(f"{self.what} {url} sent over {_MAX_REPLY_BYTES} bytes")
        try:
            return json.loads(raw)
        except ValueError:
            raise ToolBackendError(f"{self.what} {url} sent invalid JSON: "
                                   f"{raw[:200]!r}") from None


class _Timeout(_Unreachable):
    pass


def api_key_from_env(variable: str | None, provider: str, required: bool) -> str | None:
    """The key in environment variable `variable`; a clear error when required and unset."""
    if not variable:
        if required:
            raise ValueError(f"search provider {provider!r} needs an API key: name the "
                             f"environment variable holding it")
        return None
    key = os.environ.get(variable, "").strip()
    if required and not key:
        raise ValueError(f"search provider {provider!r} needs an API key in the environment "
                         f"variable {variable} (export {variable}=...); keys are never read "
                         f"from config files")
    return key or None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


class SerperSearch:
    """Serper-compatible search (`url` default https://google.serper.dev)."""

    def __init__(self, client: JsonClient, url: str = "https://google.serper.dev",
                 api_key_env: str | None = "SERPER_API_KEY"):
        self.url = url.rstrip("/")
        self.endpoint = self.url if self.url.endswith("/search") else self.url + "/search"
        self._api_key = api_key_from_env(api_key_env, "serper", required=True)
        self.api_key_env = api_key_env
        self.client = client
        client.add_secret(self._api_key)

    def __repr__(self) -> str:
        return f"SerperSearch(url={self.url!r}, api_key_env={self.api_key_env!r})"

    def search(self, query: str, k: int) -> list[SearchHit]:
        reply = self.client.request("POST", self.endpoint, payload={"q": query, "num": k},
                                    headers={"X-API-KEY": self._api_key or ""})
        organic = reply.get("organic") if isinstance(reply, dict) else None
        if not isinstance(organic, list):
            raise ToolBackendError(f"serper {self.endpoint} reply has no 'organic' list: "
                                   f"{self.client.scrub(str(reply))[:200]}")
        hits = []
        for i, item in enumerate(organic):
            if not isinstance(item, dict) or not _text(item.get("link")):
                continue
            hits.append(SearchHit(_text(item.get("title")) or item["link"], item["link"],
                                  _text(item.get("snippet")), float(-i)))
        return hits[:k]


class SearxngSearch:
    """A SearXNG instance's JSON API (`url` is the instance root)."""

    def __init__(self, client: JsonClient, url: str, api_key_env: str | None = None):
        self.url = url.rstrip("/")
        self.endpoint = self.url if self.url.endswith("/search") else self.url + "/search"
        # Instances behind a token proxy take it as a bearer token; most need none.
        self._api_key = api_key_from_env(api_key_env, "searxng", required=False)
        self.api_key_env = api_key_env
        self.client = client
        client.add_secret(self._api_key)

    def __repr__(self) -> str:
        return f"SearxngSearch(url={self.url!r}, api_key_env={self.api_key_env!r})"

    def search(self, query: str, k: int) -> list[SearchHit]:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        reply = self.client.request("GET", self.endpoint,
                                    params={"q": query, "format": "json"}, headers=headers)
        results = reply.get("results") if isinstance(reply, dict) else None
        if not isinstance(results, list):
            raise ToolBackendError(f"searxng {self.endpoint} reply has no 'results' list: "
                                   f"{self.client.scrub(str(reply))[:200]}")
        hits = []
        for item in results:
            if not isinstance(item, dict) or not _text(item.get("url")):
                continue
            score = item.get("score")
            score = float(score) if isinstance(score, int | float) else 0.0
            hits.append(SearchHit(_text(item.get("title")) or item["url"], item["url"],
                                  _text(item.get("content")), score))
        return hits[:k]


class RetrieveSearch(RetrievalServerBackend):
    """Search-R1's `/retrieve` protocol through a `JsonClient` (rate limit, retries)."""

    def __init__(self, client: JsonClient, url: str, **kwargs: Any):
        super().__init__(url, timeout_s=client.timeout_s, **kwargs)
        self.client = client

    def __repr__(self) -> str:
        return f"RetrieveSearch(url={self.url!r})"

    def _post(self, payload: dict[str, Any]) -> Any:
        return self.client.request("POST", self.url, payload=payload)


def make_search_provider(provider: str, url: str | None, client: JsonClient,
                         api_key_env: str | None = None) -> Any:
    """The SearchBackend for `provider` ('serper', 'searxng' or 'retrieve')."""
    if provider not in SEARCH_PROVIDERS:
        raise ValueError(f"search_provider must be one of {SEARCH_PROVIDERS}, got {provider!r}")
    key_env = api_key_env if api_key_env is not None else DEFAULT_KEY_ENV[provider]
    if provider == "serper":
        return SerperSearch(client, url or "https://google.serper.dev", api_key_env=key_env)
    if not url:
        raise ValueError(f"search_provider={provider!r} needs search_url (the instance or "
                         f"retrieval server's base url)")
    if provider == "searxng":
        return SearxngSearch(client, url, api_key_env=key_env)
    return RetrieveSearch(client, url)
