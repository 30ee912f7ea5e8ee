"""A page fetcher that is safe by default: `GuardedFetcher`, a `PageStore` over the web.

The agent chooses the urls, so a fetch is a request on behalf of an untrusted party
(server-side request forgery). The guard:

- allows http and https only (file:, ftp:, data:, ... are refused), and no credentials in
  the url;
- resolves the host once and checks every address it resolves to: loopback, private,
  link-local (169.254.169.254, the cloud metadata service), multicast, reserved,
  unspecified and other non-global addresses are refused, IPv4-mapped IPv6
  (::ffff:127.0.0.1) and 6to4/Teredo addresses by the IPv4 address they carry;
- connects to the checked address itself (the Host header, and for https the SNI and the
  certificate check, use the name), so a second DNS answer cannot swap in another address
  between check and connect (DNS rebinding);
- re-checks every redirect the same way (at most `max_redirects`);
- stops reading at `max_bytes` (the page is cut there) and gives up after `timeout_s` in
  all, redirects and retries included: a deadline, not a per-read timeout, so a server
  trickling its headers or body cannot hold the fetch longer;
- accepts HTML, XHTML and plain text, and PDF only with `allow_pdf` (needs pypdf).

`allow_hosts` opens specific hosts past the address check ("intranet.example",
"127.0.0.1:8080"; a bare host allows every port): for tests and intranet users. The scheme
and size/time limits still apply. The resolver is injectable (tests make a public-looking
name resolve to 10.0.0.1).

Page text comes from trafilatura (main-content extraction; its plain-text conversion when
no main content is found), decoded by the charset of the Content-Type header, else the
document's <meta charset>, else UTF-8, else Windows-1252.
"""

from __future__ import annotations

import codecs
import http.client
import ipaddress
import re
import socket
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

from venus_gym.corpus import Page

from .base import ToolBackendError
from .cache import CostMeter
from .deadline import Deadline, DeadlineExceeded, DeadlineHTTPConnection, bind_to_deadline

Resolver = Callable[[str, int], list[str]]
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
HTML_TYPES = ("text/html", "application/xhtml+xml")
TEXT_TYPES = ("text/plain",)
PDF_TYPES = ("application/pdf",)
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)
_CHUNK = 65536


class FetchRefused(ToolBackendError):
    """The guard refused the request (scheme, address, content type, redirects); a retry
    would be refused again."""


class FetchFailed(ToolBackendError):
    """The request was made and failed (HTTP error status, timeout, connection error)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (getaddrinfo), in the resolver's order."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise FetchFailed(f"cannot resolve {host}: {e}") from None
    out: list[str] = []
    for info in infos:
        ip = str(info[4][0])
        if ip not in out:
            out.append(ip)
    return out


def address_refusal(address: str) -> str | None:
    """Why `address` must not be fetched from, or None for a global unicast address."""
    try:
        ip: Any = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{address!r} is not an IP address"
    carried = ""
    if ip.version == 6:
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is not None:
            carried = f" (carrying {inner})"
            ip = inner
    for prop, label in (("is_unspecified", "unspecified"), ("is_loopback", "loopback"),
                        ("is_link_local", "link-local"), ("is_multicast", "multicast"),
                        ("is_private", "private"), ("is_reserved", "reserved")):
        if getattr(ip, prop):
            return f"{address}{carried} is a {label} address"
    if not ip.is_global:  # shared address space (100.64/10) and the like
        return f"{address}{carried} is not a global address"
    return None


def _host_entry(host: str, port: int | None = None) -> str:
    host = host.lower().rstrip(".")
    if ":" in host:
        host = f"[{host}]"
    return host if port is None else f"{host}:{port}"


@dataclass(frozen=True)
class FetchedDocument:
    url: str             # the final url, after redirects
    content_type: str    # media type, lower case, without parameters
    charset: str | None  # from the Content-Type header
    body: bytes
    truncated: bool      # cut at max_bytes


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to a fixed, already checked address; SNI and certificate use `server_name`.
    Connect, handshake, request and response all end by `deadline`."""

    def __init__(self, address: str, port: int, server_name: str, deadline: Deadline,
                 context: ssl.SSLContext):
        super().__init__(address, port, timeout=deadline.remaining(), context=context)
        self.server_name = server_name
        self.deadline = deadline

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.deadline.remaining())
        try:
            sock.settimeout(self.deadline.remaining())  # the handshake gets the time left
            wrapped = self._context.wrap_socket(sock, server_hostname=self.server_name)
        except BaseException:
            sock.close()
            raise
        self.sock = bind_to_deadline(wrapped, self.deadline)


class GuardedFetcher:
    """A PageStore fetching from the web, safe by default (module docstring).

    allow_hosts:   hosts ("example.org") or host:port pairs ("127.0.0.1:8080") exempt from
                   the address check.
    max_bytes:     most body bytes read; the rest is not downloaded and the page is cut.
    timeout_s:     deadline of one fetch: connects, redirects, retries and every byte of
                   the body (`venus_gym.tools.deadline`), not a per-read timeout.
    max_redirects: redirects followed, each one checked like the first request.
    allow_pdf:     accept application/pdf (text via pypdf).
    retries:       further attempts after a 429/5xx, timeout or connection failure, waiting
                   backoff_s, 2*backoff_s, ... (`sleep` is injectable), while the
                   deadline leaves time for the wait.
    resolver:      (host, port) -> addresses; default getaddrinfo.
    clock:         monotonic clock for the total time limit (injectable).
    context:       SSL context (default: system trust store, hostname checked).
    """

    def __init__(self, *, allow_hosts: Iterable[str] = (), max_bytes: int = 2_000_000,
                 timeout_s: float = 20.0, max_redirects: int = 5, allow_pdf: bool = False,
                 retries: int = 1, backoff_s: float = 1.0, max_backoff_s: float = 30.0,
                 resolver: Resolver | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 context: ssl.SSLContext | None = None, meter: CostMeter | None = None,
                 user_agent: str = "venus-gym (research agent; +https://github.com)"):
        if max_bytes < 1 or timeout_s <= 0 or max_redirects < 0 or retries < 0:
            raise ValueError("max_bytes >= 1, timeout_s > 0, max_redirects >= 0 and "
                             "retries >= 0 are required")
        self.allow_hosts = frozenset(self._parse_allow(h) for h in allow_hosts)
        self.max_bytes, self.timeout_s = max_bytes, timeout_s
        self.max_redirects, self.allow_pdf = max_redirects, allow_pdf
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self.resolver = resolver or system_resolver
        self.sleep, self.clock = sleep, clock
        self.context = context
        self.meter = meter
        self.user_agent = user_agent

    @staticmethod
    def _parse_allow(entry: str) -> str:
        entry = entry.strip().lower()
        if not entry or "/" in entry:
            raise ValueError(f"allow_hosts entries are 'host' or 'host:port', got {entry!r}")
        try:
            parts = urlsplit(f"//{entry}")
            host, port = parts.hostname, parts.port
        except ValueError as e:
            raise ValueError(f"allow_hosts entry {entry!r} is not 'host' or 'host:port': "
                             f"{e}") from None
        if not host:
            raise ValueError(f"allow_hosts entry {entry!r} names no host")
        return _host_entry(host, port)

    def allowed(self, host: str, port: int) -> bool:
        return (_host_entry(host) in self.allow_hosts
                or _host_entry(host, port) in self.allow_hosts)

    # --- PageStore ----------------------------------------------------------------------

    def fetch(self, url: str) -> Page:
        document = self.fetch_document(url)
        title, text = document_text(document)
        if document.truncated:
            text += f"\n[... page cut at {self.max_bytes} bytes ...]"
        return Page(url=url, title=title or document.url, text=text)

    def fetch_document(self, url: str) -> FetchedDocument:
        """The raw document at `url` (redirects followed), with retries; raises
        FetchRefused or FetchFailed."""
        deadline = Deadline(self.timeout_s, self.clock)
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return self._fetch_once(url, deadline)
            except FetchFailed as e:
                retryable = e.status is None or e.status == 429 or e.status >= 500
                wait = min(delay, self.max_backoff_s)
                if attempt == self.retries or not retryable or wait >= deadline.left():
                    raise
                self.sleep(wait)
                delay *= 2
        raise AssertionError("unreachable")

    # --- machinery ----------------------------------------------------------------------

    def _check(self, url: str) -> tuple[str, str, int, str, str]:
        """(scheme, host, port, checked address, request target) or FetchRefused."""
        try:
            parts = urlsplit(url)
            scheme = parts.scheme.lower()
            host = parts.hostname
            port = parts.port
        except ValueError as e:
            raise FetchRefused(f"refused {url!r}: malformed url ({e})") from None
        if scheme not in ("http", "https"):
            raise FetchRefused(f"refused {url!r}: only http and https urls are fetched")
        if not host:
            raise FetchRefused(f"refused {url!r}: no host")
        if parts.username is not None or parts.password is not None:
            raise FetchRefused(f"refused {url!r}: credentials in urls are not sent")
        port = port or (443 if scheme == "https" else 80)
        try:
            addresses = [str(ipaddress.ip_address(host))]
        except ValueError:
            addresses = list(self.resolver(host, port))
        if not addresses:
            raise FetchFailed(f"cannot resolve {host}: no addresses")
        if not self.allowed(host, port):
            for address in addresses:  # every answer: a mixed answer may be chosen later
                reason = address_refusal(address)
                if reason is not None:
                    raise FetchRefused(f"refused {url!r}: {host} is not fetched by default "
                                       f"({reason}; allow_hosts can open it deliberately)")
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        return scheme, host, port, addresses[0], target

    def _fetch_once(self, url: str, deadline: Deadline) -> FetchedDocument:
        current = url
        for _ in range(self.max_redirects + 1):
            scheme, host, port, address, target = self._check(current)
            default_port = 443 if scheme == "https" else 80
            host_header = _host_entry(host, None if port == default_port else port)
            conn: http.client.HTTPConnection | None = None
            try:
                if scheme == "https":
                    context = self.context or ssl.create_default_context()
                    conn = _PinnedHTTPSConnection(address, port, host, deadline, context)
                else:
                    conn = DeadlineHTTPConnection(address, port, deadline=deadline)
                conn.request("GET", target, headers={
                    "Host": host_header, "User-Agent": self.user_agent,
                    "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9"
                              + (",application/pdf;q=0.8" if self.allow_pdf else ""),
                    "Accept-Encoding": "identity", "Connection": "close"})
                response = conn.getresponse()
                if self.meter is not None:
                    self.meter.add(fetch_calls=1)
                if response.status in REDIRECT_STATUSES:
                    location = response.getheader("Location")
                    if not location:
                        raise FetchFailed(f"{current} redirected without a Location",
                                          response.status)
                    current = urljoin(current, location.strip())
                    continue
                if response.status >= 400:
                    raise FetchFailed(f"{current} answered HTTP {response.status}",
                                      response.status)
                return self._read(response, current)
            except DeadlineExceeded as e:
                raise FetchFailed(f"{current} took longer than {self.timeout_s} s") from e
            except TimeoutError as e:  # the time left ran out inside one read
                raise FetchFailed(f"{current} did not answer within {self.timeout_s} s") from e
            except ssl.SSLError as e:
                raise FetchRefused(f"refused {current!r}: TLS failed ({e})") from None
            except (OSError, http.client.HTTPException) as e:
                raise FetchFailed(f"{current} unreachable: {type(e).__name__}: {e}") from e
            finally:
                if conn is not None:
                    conn.close()
        raise FetchRefused(f"refused {url!r}: more than {self.max_redirects} redirects")

    def _read(self, response: http.client.HTTPResponse, url: str) -> FetchedDocument:
        """The body, up to max_bytes; every read is under the fetch's deadline (its
        connection's), so a trickling body ends the fetch at the deadline."""
        content_type = response.getheader("Content-Type") or ""
        media = content_type.split(";", 1)[0].strip().lower()
        accepted = HTML_TYPES + TEXT_TYPES + (PDF_TYPES if self.allow_pdf else ())
        if media not in accepted:
            raise FetchRefused(f"refused {url!r}: content type {media or 'none'!r} is not "
                               f"one of {', '.join(accepted)}")
        charset = None
        match = re.search(r"charset\s*=\s*[\"']?([A-Za-z0-9_.:-]+)", content_type, re.I)
        if match:
            charset = match.group(1)
        chunks, size, truncated = [], 0, False
        while True:
            chunk = response.read(min(_CHUNK, self.max_bytes - size + 1))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_bytes:  # stop downloading: the rest is never read
                truncated = True
                break
        if self.meter is not None:
            self.meter.add(bytes_received=size)
        body = b"".join(chunks)[: self.max_bytes]
        return FetchedDocument(url, media, charset, body, truncated)


def decode_body(body: bytes, header_charset: str | None, html: bool) -> str:
    """Text of a body: header charset, else <meta charset> (HTML), else UTF-8, else cp1252."""
    candidates = [header_charset]
    if html:
        match = _META_CHARSET.search(body[:4096])
        if match:
            candidates.append(match.group(1).decode("ascii", "replace"))
    for name in candidates:
        if not name:
            continue
        try:
            codecs.lookup(name)
        except LookupError:
            continue
        return body.decode(name, errors="replace")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return body.decode("cp1252", errors="replace")


def html_text(html: str) -> tuple[str, str]:
    """(title, main text) of an HTML document, by trafilatura."""
    try:
        import trafilatura
    except ImportError:
        raise ToolBackendError("reading web pages needs trafilatura: pip install "
                               "'venus-gym[web]'") from None
    text = trafilatura.extract(html, include_comments=False, include_tables=True,
                               favor_recall=True) or trafilatura.html2txt(html) or ""
    metadata = trafilatura.extract_metadata(html)
    title = (metadata.title or "") if metadata is not None else ""
    return " ".join(title.split()), text.strip()


def pdf_text(body: bytes) -> str:
    try:
        import io

        import pypdf
    except ImportError:
        raise ToolBackendError("reading PDF pages needs pypdf: pip install pypdf") from None
    try:
        reader = pypdf.PdfReader(io.BytesIO(body))
        return "\n".join((p.extract_text() or "") for p in reader.pages).strip()
    except Exception as e:  # a cut or broken PDF
        raise ToolBackendError(f"unreadable PDF: {type(e).__name__}: {e}") from None


def document_text(document: FetchedDocument) -> tuple[str, str]:
    """(title, text) of a fetched document."""
    if document.content_type in PDF_TYPES:
        return "", pdf_text(document.body)
    is_html = document.content_type in HTML_TYPES
    text = decode_body(document.body, document.charset, is_html)
    if is_html:
        return html_text(text)
    return "", text.strip()
