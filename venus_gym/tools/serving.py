"""What venus-gym's servers share: a listen backlog for bursts, one quiet line per client
that goes away.

`serve-retrieval` (`venus_gym.tools.serve_index`) and `serve-env` (the OpenEnv server)
listen with a backlog of at least DEFAULT_BACKLOG connections: with the standard library's
default of 5, a burst of clients connecting at once (32 keep-alive clients in a rollout)
overflowed the accept queue and some first requests were reset. A client that disconnects
before its reply is written (a killed worker, a timeout on its side) is the client's
business: it is logged as one line, not as a traceback.
"""

from __future__ import annotations

import logging
import sys
from http.server import ThreadingHTTPServer
from typing import Any

#: Connections the kernel queues before the server accepts them.
DEFAULT_BACKLOG = 128

log = logging.getLogger("venus_gym.serving")

# What a socket raises when its peer has gone: a reset, a closed pipe, an aborted
# connection, or a read that timed out on an idle client.
CLIENT_GONE = (ConnectionError, TimeoutError)


def check_backlog(backlog: int) -> int:
    if not isinstance(backlog, int) or isinstance(backlog, bool) or backlog < 1:
        raise ValueError(f"backlog must be an integer >= 1, got {backlog!r}")
    return backlog


def client_gone(what: str, client: Any, error: BaseException) -> None:
    """Log one line for a client that went away mid-exchange."""
    where = (f"{client[0]}:{client[1]}" if isinstance(client, tuple) and len(client) >= 2
             else str(client))
    log.warning("%s: client %s went away (%s: %s)", what, where, type(error).__name__,
                error)


class BurstHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer (one daemon thread per connection) listening with `backlog`;
    a client that disconnects is one log line (`client_gone`), other errors keep the
    standard library's traceback."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any, backlog: int = DEFAULT_BACKLOG,
                 name: str = "server"):
        self.request_queue_size = check_backlog(backlog)  # read by server_activate (listen)
        self.name = name
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, CLIENT_GONE):
            client_gone(self.name, client_address, error)
            return
        super().handle_error(request, client_address)
