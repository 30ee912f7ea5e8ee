"""A server on 127.0.0.1 that answers HTTP one byte at a time, for the deadline tests.

`TrickleServer(mode)` accepts connections and, after reading the request head (and the
body its Content-Length announces), sends

    "headers": a status line, then a header line that never ends, one byte per `period_s`;
    "body":    complete headers (Content-Length 1,000,000), then the body one byte per
               `period_s`.

It stops sending after `total_s` or when the client goes away. A client whose time limit
holds per read only (a socket timeout) waits the whole `total_s`; one with a total deadline
gives up after its deadline.
"""

from __future__ import annotations

import socket
import threading
import time


class TrickleServer:
    def __init__(self, mode: str, *, content_type: str = "text/html; charset=utf-8",
                 period_s: float = 0.05, total_s: float = 10.0):
        if mode not in ("headers", "body"):
            raise ValueError(f"mode must be 'headers' or 'body', got {mode!r}")
        self.mode, self.content_type = mode, content_type
        self.period_s, self.total_s = period_s, total_s
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_request(conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return
            body += chunk

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(self.total_s)
                self._read_request(conn)
                if self.mode == "headers":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: "
                                 + self.content_type.encode() + b"\r\n"
                                 b"Content-Length: 1000000\r\n\r\n")
                ends = time.monotonic() + self.total_s
                while time.monotonic() < ends and not self._stop.is_set():
                    conn.sendall(b"a" if self.mode == "headers" else b"{")
                    time.sleep(self.period_s)
            except OSError:
                return  # the client gave up: what a deadline is for

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(2)

    def __enter__(self) -> TrickleServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
