"""Total deadlines for HTTP requests: a time limit that holds for the whole exchange.

A socket timeout bounds one read. A server that sends a byte now and then (a header line
that never ends, a body that trickles) resets it with every byte and can hold a request for
as long as it likes. Every network read of venus-gym (page fetches, search providers, the
retrieval-server client, the LLM summariser, the judge, the OpenAI-compatible engine) runs
through this module instead, so its time limit is a deadline:

    deadline = Deadline(20.0)
    response = open_url(urllib.request.Request(url), deadline)   # urllib: proxies, redirects
    body = response.read()                                        # both bounded by `deadline`

    conn = DeadlineHTTPConnection(host, port, deadline=deadline)  # http.client, same rule

Before each connect, send and receive the socket's timeout is set to the time left, and a
read that starts after the deadline raises `DeadlineExceeded` (a TimeoutError), so the
whole request (connect, TLS handshake, request, headers, body, redirects) ends at most
one system call after the deadline. Standard library only.
"""

from __future__ import annotations

import functools
import http.client
import io
import socket
import time
import urllib.request
from collections.abc import Callable
from typing import Any


class DeadlineExceeded(TimeoutError):
    """The request's deadline passed (a TimeoutError, so callers treat it as a timeout)."""


class Deadline:
    """A point in time `seconds` from now (by `clock`) by which a request must be over."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        if seconds <= 0:
            raise ValueError(f"a deadline needs seconds > 0, got {seconds}")
        self.seconds = seconds
        self._clock = clock
        self._ends = clock() + seconds

    def remaining(self) -> float:
        """Seconds left; raises DeadlineExceeded once none are."""
        left = self._ends - self._clock()
        if left <= 0:
            raise DeadlineExceeded(f"took longer than {self.seconds} s in all")
        return left

    def left(self) -> float:
        """Seconds left, 0.0 once the deadline passed (never raises)."""
        return max(0.0, self._ends - self._clock())


class _DeadlineReader(io.RawIOBase):
    """The socket's raw reader, each read given only the time left."""

    def __init__(self, sock: socket.socket, deadline: Deadline):
        super().__init__()
        self._sock = sock
        # The socket's own reader keeps the socket open until this file is closed, as
        # http.client expects (urllib closes the connection's socket before the body is read).
        self._raw = sock.makefile("rb", buffering=0)
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.settimeout(self._deadline.remaining())
        return self._raw.readinto(buffer)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _DeadlineSocket:
    """A connected socket whose reads and writes wait only until the deadline.

    Everything but `makefile` (for reading) and `sendall` is the socket's own.
    """

    def __init__(self, sock: socket.socket, deadline: Deadline):
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if mode != "rb":
            return self._sock.makefile(mode, *args, **kwargs)
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def sendall(self, data: Any, *flags: Any) -> None:
        # sendall's timeout holds for the whole call (Python >= 3.5).
        self._sock.settimeout(self._deadline.remaining())
        self._sock.sendall(data, *flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def bind_to_deadline(sock: socket.socket, deadline: Deadline) -> Any:
    """`sock` (connected, TLS already wrapped) with every later read and write under
    `deadline`; for connection classes that make their own sockets."""
    return _DeadlineSocket(sock, deadline)


class DeadlineHTTPConnection(http.client.HTTPConnection):
    """An HTTPConnection whose connect, request and response all end by `deadline`."""

    def __init__(self, host: str, port: int | None = None, *, deadline: Deadline,
                 **kwargs: Any):
        kwargs.pop("timeout", None)  # the deadline decides (urllib passes its timeout)
        super().__init__(host, port, timeout=deadline.remaining(), **kwargs)
        self.deadline = deadline

    def connect(self) -> None:
        self.timeout = self.deadline.remaining()
        super().connect()
        self.sock = bind_to_deadline(self.sock, self.deadline)


class DeadlineHTTPSConnection(http.client.HTTPSConnection):
    """DeadlineHTTPConnection over TLS; the handshake is bounded by the time left too."""

    def __init__(self, host: str, port: int | None = None, *, deadline: Deadline,
                 **kwargs: Any):
        kwargs.pop("timeout", None)
        super().__init__(host, port, timeout=deadline.remaining(), **kwargs)
        self.deadline = deadline

    def connect(self) -> None:
        self.timeout = self.deadline.remaining()
        super().connect()  # TCP connect and handshake, each under the time left
        self.sock = bind_to_deadline(self.sock, self.deadline)


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline):
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(DeadlineHTTPConnection, deadline=self.deadline),
                            req)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline):
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(DeadlineHTTPSConnection, deadline=self.deadline),
                            req, context=self._context)


def open_url(request: urllib.request.Request, deadline: Deadline) -> Any:
    """`urllib.request.urlopen(request)` with everything under `deadline`: connects,
    redirects, headers, and reads of the returned response (and of an HTTPError's body).

    Raises what urlopen raises; a passed deadline is a TimeoutError (DeadlineExceeded, or
    the socket's own timeout when the time left ran out inside one read).
    """
    opener = urllib.request.build_opener(_DeadlineHTTPHandler(deadline),
                                         _DeadlineHTTPSHandler(deadline))
    return opener.open(request, timeout=deadline.remaining())


def read_error_body(error: Any, limit: int) -> str:
    """Up to `limit` bytes of an HTTPError's body as text; "" when it cannot be read in
    the time left (the status is what matters then)."""
    try:
        return error.read(limit).decode("utf-8", "replace")
    except (OSError, ValueError, http.client.HTTPException):
        return ""
