"""Connections to MCP servers (venus_gym.tools.mcp_tools): the event loop the MCP client
runs on, one session per server and process, reopened when lost, calls with deadlines, and
the count of environments holding each connection.

A session is owned by one task on the loop (`_Session`): it opens the client within
connect_timeout_s, then holds it until stopped or lost; leaving the client's context stops
a stdio server (the SDK's shutdown: stdin closed, then SIGTERM, then SIGKILL). A lost
session is replaced by a new one and shut down in the background, so a call never waits
for a dead server to stop; only closing waits (SHUTDOWN_WAIT_S at most), so that a closed
environment has stopped its servers when `close` returns.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import shlex
import sys
import threading
import time
from typing import Any

from .base import ToolBackendError
from .mcp_stdio import RESULT_TOO_LARGE, bounded_stdio_client

MCP_INSTALL_HINT = "pip install -e .[mcp]"
SHUTDOWN_WAIT_S = 10.0  # how long closing waits for a session (and its server) to end


class MCPToolError(RuntimeError):
    """The server answered the call with an error: an isError result (the tool failed) or
    a JSON-RPC error (e.g. invalid arguments). A deterministic answer: not retried."""


class MCPProtocolError(RuntimeError):
    """The server's reply is not a valid MCP result (malformed content). Not retried."""


class MCPResultTooLarge(MCPToolError):
    """The answer is over the server's max_result_bytes. Refused, not retried."""


# --- the event loop the MCP client runs on ---------------------------------------------------
_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None
_connections: dict[tuple, MCPConnection] = {}


def _event_loop() -> asyncio.AbstractEventLoop:
    """The process's MCP event loop, running in a daemon thread (a fresh one after fork)."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid() or _loop.is_closed():
            _connections.clear()  # a forked child does not own its parent's connections
            _loop = asyncio.new_event_loop()
            _loop_pid = os.getpid()
            threading.Thread(target=_loop.run_forever, name="venus-gym-mcp",
                             daemon=True).start()
        return _loop


def _leaf(error: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _describe(error: BaseException) -> str:
    error = _leaf(error)
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _import_client() -> Any:
    try:
        from mcp import Client
    except ImportError as error:
        raise ImportError(f"MCP servers in extra_tools need the MCP Python SDK (the `mcp` "
                          f"package, 2.x): {MCP_INSTALL_HINT} ({error})") from error
    return Client


class _Session:
    """One attempt at a session with the server: its owner task on the event loop, whether
    it is up, and how it ended. A lost session is replaced by a new one, never reused."""

    def __init__(self) -> None:
        self.ready: concurrent.futures.Future = concurrent.futures.Future()
        self.finished = threading.Event()  # set once the owner ended (the server stopped)
        self.stop: asyncio.Event | None = None  # made on the loop
        self.task: asyncio.Task | None = None
        self.client: Any = None
        self.halted = False
        self.lost: str | None = None
        self.calls: set[asyncio.Task] = set()
        self.pid = os.getpid()  # a forked child must not wait for its parent's sessions

    def usable(self) -> bool:
        """Up, or still connecting: worth waiting for rather than replacing."""
        if self.lost is not None or self.halted:
            return False
        return not self.ready.done() or self.ready.exception() is None


class MCPConnection:
    """The process's connection to one server: a session, re-opened when it is lost (a
    stdio server that exited, an HTTP server that went away). Thread-safe; calls run
    concurrently. `users` counts the environments' tools holding it (acquire_connection)."""

    def __init__(self, server: Any):  # an MCPServer
        self.server = server
        self.label = f"MCP server {server.url or shlex.join(server.command)}"
        self.users = 0
        self.closed = False
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self._listing: list[dict[str, Any]] | None = None

    # -- connecting ----------------------------------------------------------------------
    def _transport(self) -> Any:
        server = self.server
        if server.url:
            headers = {}
            for header, variable in server.headers_env:
                value = os.environ.get(variable, "")
                if not value:
                    raise ValueError(f"{self.label}: headers_env names {variable} for "
                                     f"{header}, which is not set in the environment")
                headers[header] = value
            from mcp.client.streamable_http import streamable_http_client

            if not headers:
                return streamable_http_client(server.url)
            import httpx2

            return streamable_http_client(server.url, http_client=httpx2.AsyncClient(
                headers=headers, follow_redirects=True,
                timeout=httpx2.Timeout(30.0, read=300.0)))
        from mcp.client.stdio import StdioServerParameters

        params = StdioServerParameters(command=server.command[0], args=list(server.command[1:]),
                                       env=dict(server.env) or None, cwd=server.cwd)
        try:
            sys.stderr.fileno()
            errlog = sys.stderr
        except (AttributeError, OSError, ValueError):  # no real stderr (e.g. a notebook)
            errlog = sys.__stderr__
        return bounded_stdio_client(params, errlog=errlog,
                                    max_message_bytes=server.max_result_bytes)

    async def _run(self, session: _Session) -> None:
        """Owns one session: open it (within connect_timeout_s), report ready, hold it
        until stopped or lost; leaving the client's context stops a stdio server."""
        session.task = asyncio.current_task()
        session.stop = asyncio.Event()
        try:
            if session.halted:  # closed before this coroutine got to run
                raise ToolBackendError("closed before it was connected")
            client_class = _import_client()
            async with contextlib.AsyncExitStack() as stack:
                async with asyncio.timeout(self.server.connect_timeout_s):
                    client = await stack.enter_async_context(client_class(self._transport()))
                session.client = client
                session.ready.set_result(None)
                await session.stop.wait()
        except BaseException as error:  # noqa: BLE001 (a lost connection, also a cancel)
            if isinstance(error, TimeoutError) and not session.ready.done():
                error = ToolBackendError(f"no session within {self.server.connect_timeout_s} s")
            if not session.ready.done():
                session.ready.set_exception(error if isinstance(error, Exception)
                                            else ToolBackendError(_describe(error)))
            session.lost = session.lost or _describe(error)
        finally:
            session.client = None
            session.lost = session.lost or "the connection was closed"
            for task in list(session.calls):
                task.cancel()
            session.finished.set()

    @staticmethod
    def _halt(session: _Session) -> None:
        """End a session (on the loop): a clean close when up, a cancel while connecting."""
        session.halted = True
        if session.client is not None and session.stop is not None:
            session.stop.set()
        elif session.task is not None and not session.task.done():
            session.task.cancel()
        elif session.task is None and not session.ready.done():
            session.finished.set()  # _run has not started: it will stop at once

    def _end(self, session: _Session | None, wait: bool) -> None:
        if session is None or session.finished.is_set() or session.pid != os.getpid():
            return
        _event_loop().call_soon_threadsafe(self._halt, session)
        if wait:
            session.finished.wait(SHUTDOWN_WAIT_S)

    def ensure_open(self, wait_s: float | None = None, what: str = "the connection"
                    ) -> _Session:
        """The open session, connecting (again) if needed and waiting at most `wait_s`
        (None: connect_timeout_s).
        A connect still under way when the wait runs out goes on in the background
        (within connect_timeout_s), so the next call finds it rather than a new one."""
        with self._lock:
            if self.closed:
                raise ToolBackendError(f"{self.label}: the connection was closed (its "
                                       f"environments were closed)")
            session = self._session
            if session is None or not session.usable():
                self._end(session, wait=False)  # the lost one stops in the background
                session = self._session = _Session()
                asyncio.run_coroutine_threadsafe(self._run(session), _event_loop())
        wait_s = self.server.connect_timeout_s if wait_s is None else wait_s
        try:
            session.ready.result(timeout=max(wait_s, 0.0))
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{self.label}: no session within {wait_s} s for {what} "
                               f"(still connecting)") from None
        except ImportError:
            raise
        except Exception as error:
            raise ToolBackendError(f"{self.label}: cannot connect ({_describe(error)})") \
                from None
        return session

    def close(self, wait: bool = True) -> None:
        """Close for good; `wait`: until the session ended (a stdio server stopped), at
        most SHUTDOWN_WAIT_S."""
        with self._lock:
            self.closed = True
            session, self._session = self._session, None
        self._end(session, wait)

    # -- requests ------------------------------------------------------------------------
    def _run_request(self, session: _Session, send: Any, timeout_s: float, what: str,
                     shown_s: float) -> Any:
        """`send(client)` on the loop within `timeout_s`; messages name `shown_s`, the
        timeout the caller set (timeout_s is what is left of it)."""
        coroutine = self._request(session, send, timeout_s, what, shown_s)
        future = asyncio.run_coroutine_threadsafe(coroutine, _event_loop())
        try:
            return future.result(timeout_s + 0.5)  # the coroutine enforces timeout_s itself
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"{self.label}: no answer to {what} within {shown_s} s") \
                from None
        except concurrent.futures.CancelledError:
            raise ToolBackendError(f"{self.label}: the connection was lost during {what} "
                                   f"({session.lost or 'cancelled'})") from None

    async def _request(self, session: _Session, send: Any, timeout_s: float, what: str,
                       shown_s: float) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
        from pydantic import ValidationError

        client = session.client
        if client is None:
            raise ToolBackendError(f"{self.label}: not connected ({session.lost})")
        task = asyncio.current_task()
        if task is not None:
            session.calls.add(task)
        try:
            async with asyncio.timeout(timeout_s):
                return await send(client)
        except TimeoutError:
            raise TimeoutError(f"{self.label}: no answer to {what} within {shown_s} s") \
                from None
        except MCPError as error:
            if error.code == REQUEST_TIMEOUT:
                raise TimeoutError(f"{self.label}: no answer to {what} within "
                                   f"{shown_s} s") from None
            if error.code == CONNECTION_CLOSED:
                self._mark_lost(session, f"{error.message} during {what}")
                raise ToolBackendError(f"{self.label} closed the connection during {what} "
                                       f"(it will be reopened)") from None
            if error.code == RESULT_TOO_LARGE:
                raise MCPResultTooLarge(f"{self.label}: the answer to {what} is over "
                                        f"{self.server.max_result_bytes:,} bytes "
                                        f"(max_result_bytes); refused") from None
            raise MCPToolError(f"the server answered {what} with error {error.code}: "
                               f"{error.message}") from None
        except ValidationError as error:
            first = str(error).splitlines()
            detail = "; ".join(line.strip() for line in first[:3])
            raise MCPProtocolError(f"the server's reply to {what} is not valid MCP: "
                                   f"{detail}") from None
        except asyncio.CancelledError:
            raise
        except Exception as error:  # transport failures: the session is gone
            self._mark_lost(session, _describe(error))
            raise ToolBackendError(f"{self.label}: {what} failed ({_describe(error)})") \
                from None
        finally:
            if task is not None:
                session.calls.discard(task)

    @staticmethod
    def _mark_lost(session: _Session, reason: str) -> None:
        session.lost = session.lost or reason
        if session.stop is not None:
            session.stop.set()  # called on the loop thread

    def list_tools(self) -> list[dict[str, Any]]:
        """[{"name", "description", "input_schema"}] of every tool the server lists (kept
        after the first listing). Connecting and listing together take at most
        connect_timeout_s."""
        if self._listing is not None:
            return self._listing
        timeout = self.server.connect_timeout_s
        deadline = time.monotonic() + timeout
        try:
            session = self.ensure_open(timeout, "tools/list")
        except TimeoutError:  # building an environment: the server is not usable
            raise ToolBackendError(f"{self.label}: no session within {timeout} s "
                                   f"(connect_timeout_s)") from None

        async def send(client: Any) -> list[Any]:
            tools, cursor = [], None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = getattr(page, "next_cursor", None)
                if not cursor:
                    return tools

        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{self.label}: no tool listing within {timeout} s")
        tools = self._run_request(session, send, left, "tools/list", timeout)
        self._listing = [{"name": tool.name,
                          "description": tool.description or getattr(tool, "title", None) or "",
                          "input_schema": dict(tool.input_schema or {})} for tool in tools]
        return self._listing

    def call_tool(self, name: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        """The server's CallToolResult, within `timeout_s` in all (a reconnect included).
        Raises TimeoutError / ToolBackendError (transient), MCPToolError or
        MCPProtocolError (answers: not worth retrying)."""
        what = f"tool {name!r}"
        deadline = time.monotonic() + timeout_s
        session = self.ensure_open(timeout_s, what)
        left = deadline - time.monotonic()
        if left <= 0.05:
            raise TimeoutError(f"{self.label}: no answer to {what} within {timeout_s} s "
                               f"(reconnecting took it all)")

        async def send(client: Any) -> Any:
            return await client.call_tool(name, arguments, read_timeout_seconds=left)

        return self._run_request(session, send, left, what, timeout_s)


def acquire_connection(server: Any) -> MCPConnection:
    """The process's connection to `server` (created, not yet opened, on first use), with
    one more user; give it back with `release_connection`."""
    _event_loop()  # resets the registry in a forked child
    with _loop_lock:
        key = server.connection_key()
        connection = _connections.get(key)
        if connection is None:
            connection = _connections[key] = MCPConnection(server)
        connection.users += 1
        return connection


def release_connection(connection: MCPConnection, wait: bool = True) -> None:
    """One user fewer; the last one closes the connection (stopping a stdio server;
    `wait`: until it stopped, at most SHUTDOWN_WAIT_S)."""
    with _loop_lock:
        connection.users -= 1
        if connection.users > 0:
            return
        key = connection.server.connection_key()
        if _connections.get(key) is connection:
            del _connections[key]
    connection.close(wait=wait)


def close_mcp_connections() -> None:
    """Close every MCP session of this process (stdio servers are stopped)."""
    with _loop_lock:
        connections = list(_connections.values()) if _loop_pid == os.getpid() else []
        _connections.clear()
    for connection in connections:
        try:
            connection.close()
        except Exception:  # noqa: BLE001 (best effort at exit)
            pass


atexit.register(close_mcp_connections)
