"""MCP servers as plug-in tools: every tool of a Model Context Protocol server, offered to
the agent next to search and visit.

    env = gym.make("DeepResearch-v0", extra_tools=[
        {"mcp": {"url": "http://127.0.0.1:8000/mcp"}},                       # streamable HTTP
        {"mcp": {"command": "python", "args": ["tools_server.py"]}},        # stdio
        {"mcp": "npx -y @modelcontextprotocol/server-everything"},          # stdio, one string
    ])

An `extra_tools` entry `{"mcp": ...}` names one server: a URL (streamable HTTP), a command
line (stdio: the server runs as a child process speaking MCP on stdin/stdout) or a mapping
with the fields of `MCPServer` (url or command/args, env, cwd, headers_env, tools, prefix,
timeout_s, connect_timeout_s). The server's tools are listed once (`tools/list`); each
becomes a plug-in tool (`MCPTool`) whose schema is the tool's JSON input schema, so it
appears in the system prompt and the parser checks calls to it like any plug-in.

Calls go through the environment's toolbox like search and visit
(`venus_gym.tools.toolbox.Toolbox.call_plugin`): retries of transient failures, the
record/replay cache (the tool listing and every call), cost accounting, and the
environment's sanitising and cutting of the observation. Failures are observations, never
exceptions: a server that hangs (`timeout_s`: the call is abandoned and cancelled), one that
dies mid-call (the next call starts it again, or reconnects), an error result (the tool's
isError text), a reply that is not valid MCP (malformed content), an error answer of the
protocol. Only a server that cannot be reached when the environment is built (its tools
must be listed) raises.

One connection per server and process, shared by every environment of the process (a
group of G environments starts one stdio server, not G); requests from several threads run
concurrently on it. The MCP client runs on one background event loop thread; stdio servers
are stopped when the process exits.

Needs the `mcp` package (the official MCP Python SDK, 2.x): `pip install -e .[mcp]`. Nothing
here imports it until a server is used, and nothing here needs torch.

Deviation from DR-Venus: its agent has exactly search and visit. Tool servers people
already run speak MCP (verifiers, AgentCPM- and MiroThinker-style agents use them); this
module lets the environment offer theirs.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import os
import shlex
import sys
import threading
from dataclasses import dataclass, field, fields
from typing import Any

from .base import ToolBackendError

MCP_INSTALL_HINT = "pip install -e .[mcp]"
DEFAULT_TIMEOUT_S = 30.0


class MCPToolError(RuntimeError):
    """The server answered the call with an error: an isError result (the tool failed) or
    a JSON-RPC error (e.g. invalid arguments). A deterministic answer: not retried."""


class MCPProtocolError(RuntimeError):
    """The server's reply is not a valid MCP result (malformed content). Not retried."""


def _pairs(value: Any, what: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise ValueError(f"mcp {what} must be a mapping of strings, got {value!r}")
    return tuple(sorted(value.items()))


@dataclass(frozen=True)
class MCPServer:
    """One MCP server: `url` (streamable HTTP) or `command` (stdio), and how to offer it.

    url:          the server's streamable HTTP endpoint, e.g. http://127.0.0.1:8000/mcp.
    command:      stdio: the executable and its arguments (the child process is started
                  with the SDK's safe environment variables, HOME, PATH, ..., plus `env`).
    env:          stdio: extra environment variables for the server.
    cwd:          stdio: its working directory.
    headers_env:  HTTP: request headers whose values are read from environment variables,
                  {"Authorization": "MY_MCP_TOKEN"} (secrets are never config values).
    tools:        offer only these tools (None: all the server lists).
    prefix:       put before every tool name the agent sees (two servers with the same
                  tool names, or a tool called "search"); the server gets its own name.
    timeout_s:    seconds one call may take before it is abandoned (None: the
                  environment's tool_timeout_s, else 30).
    connect_timeout_s: seconds to start / reach the server and list its tools.
    """

    url: str | None = None
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    headers_env: tuple[tuple[str, str], ...] = ()
    tools: tuple[str, ...] | None = None
    prefix: str = ""
    timeout_s: float | None = None
    connect_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if bool(self.url) == bool(self.command):
            raise ValueError("an MCP server needs exactly one of 'url' (streamable HTTP) or "
                             "'command' (stdio)")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"mcp url must start with http:// or https://, got {self.url!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"mcp timeout_s must be > 0, got {self.timeout_s!r}")
        if not self.connect_timeout_s > 0:
            raise ValueError(f"mcp connect_timeout_s must be > 0, got {self.connect_timeout_s!r}")

    @classmethod
    def from_spec(cls, spec: Any) -> MCPServer:
        """From an `extra_tools` entry's value: a URL, a command line (str or list) or a
        mapping of this class's fields (`command` a str or list, `args` appended to it)."""
        if isinstance(spec, MCPServer):
            return spec
        if isinstance(spec, str):
            if spec.startswith(("http://", "https://")):
                return cls(url=spec)
            return cls(command=tuple(shlex.split(spec)))
        if isinstance(spec, list | tuple):
            return cls(command=tuple(str(part) for part in spec))
        if not isinstance(spec, dict):
            raise ValueError(f"an mcp server is a URL, a command line or a mapping, got "
                             f"{spec!r}")
        known = {f.name for f in fields(cls)} | {"args"}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"unknown mcp server key(s) {unknown}; known: {sorted(known)}")
        command = spec.get("command") or ()
        command = shlex.split(command) if isinstance(command, str) else list(command)
        args = spec.get("args") or []
        if not isinstance(args, list | tuple):
            raise ValueError(f"mcp args must be a list, got {args!r}")
        tools = spec.get("tools")
        if tools is not None and (not isinstance(tools, list | tuple)
                                  or not all(isinstance(t, str) for t in tools)):
            raise ValueError(f"mcp tools must be a list of tool names, got {tools!r}")
        timeout = spec.get("timeout_s")
        return cls(url=spec.get("url"), command=tuple(str(p) for p in [*command, *args]),
                   env=_pairs(spec.get("env"), "env"), cwd=spec.get("cwd"),
                   headers_env=_pairs(spec.get("headers_env"), "headers_env"),
                   tools=None if tools is None else tuple(tools),
                   prefix=str(spec.get("prefix") or ""),
                   timeout_s=None if timeout is None else float(timeout),
                   connect_timeout_s=float(spec.get("connect_timeout_s", 60.0)))

    @property
    def identity(self) -> str:
        """What the record/replay cache keys this server by: its URL or command line
        (environment variables and headers, which may hold secrets, are left out)."""
        return f"url:{self.url}" if self.url else f"stdio:{shlex.join(self.command)}"

    def connection_key(self) -> tuple:
        return (self.url, self.command, self.env, self.cwd, self.headers_env)


def is_mcp_spec(spec: Any) -> bool:
    """Whether an `extra_tools` entry names an MCP server."""
    return isinstance(spec, MCPServer) or (isinstance(spec, dict) and set(spec) == {"mcp"})


def parse_mcp_spec(spec: Any) -> MCPServer:
    """The MCPServer an `extra_tools` entry names (ValueError saying what is wrong)."""
    if isinstance(spec, MCPServer):
        return spec
    if not is_mcp_spec(spec):
        raise ValueError(f"expected {{'mcp': URL, command line or mapping}}, got {spec!r}")
    return MCPServer.from_spec(spec["mcp"])


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


class MCPConnection:
    """One open session with one server, re-opened when it is lost (a stdio server that
    exited, an HTTP server that went away). Thread-safe; calls run concurrently."""

    def __init__(self, server: MCPServer):
        self.server = server
        self.label = f"MCP server {server.url or shlex.join(server.command)}"
        self._lock = threading.Lock()
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._owner: concurrent.futures.Future | None = None
        self._lost: str | None = None
        self._calls: set[asyncio.Task] = set()
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
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(command=server.command[0], args=list(server.command[1:]),
                                       env=dict(server.env) or None, cwd=server.cwd)
        try:
            sys.stderr.fileno()
            errlog = sys.stderr
        except (AttributeError, OSError, ValueError):  # no real stderr (e.g. a notebook)
            errlog = sys.__stderr__
        return stdio_client(params, errlog=errlog)

    async def _run(self, ready: concurrent.futures.Future) -> None:
        """Owns the session: open it, report ready, hold it until stopped or lost."""
        client_class = _import_client()
        try:
            async with client_class(self._transport()) as client:
                self._stop = asyncio.Event()
                self._client = client
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as error:  # noqa: BLE001 (a lost connection, also a cancel)
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception)
                                    else ToolBackendError(_describe(error)))
            if self._lost is None:
                self._lost = _describe(error)
        finally:
            self._client = None
            if self._lost is None:
                self._lost = "the connection was closed"
            for task in list(self._calls):
                task.cancel()

    def ensure_open(self) -> None:
        """Open the session if it is not open (again, after it was lost)."""
        with self._lock:
            if self._client is not None and self._lost is None:
                return
            self._shut_locked()
            self._lost = None
            ready: concurrent.futures.Future = concurrent.futures.Future()
            self._owner = asyncio.run_coroutine_threadsafe(self._run(ready), _event_loop())
            try:
                ready.result(timeout=self.server.connect_timeout_s)
            except concurrent.futures.TimeoutError:
                self._shut_locked()
                raise ToolBackendError(f"{self.label}: no session within "
                                       f"{self.server.connect_timeout_s} s") from None
            except ImportError:
                raise
            except Exception as error:
                self._shut_locked()
                raise ToolBackendError(f"{self.label}: cannot connect "
                                       f"({_describe(error)})") from None

    def _shut_locked(self) -> None:
        owner, stop = self._owner, self._stop
        self._owner, self._stop = None, None
        if owner is None or owner.done():
            return
        loop = _event_loop()
        if stop is not None:
            loop.call_soon_threadsafe(stop.set)
        try:
            owner.result(timeout=10)
        except BaseException:  # noqa: BLE001 (whatever ended it, it has ended)
            owner.cancel()

    def close(self) -> None:
        with self._lock:
            self._lost = "closed"
            self._shut_locked()

    def _mark_lost(self, reason: str) -> None:
        self._lost = self._lost or reason
        stop = self._stop
        if stop is not None:
            stop.set()  # called on the loop thread

    # -- requests ------------------------------------------------------------------------
    def _run_request(self, coroutine: Any, timeout_s: float, what: str) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, _event_loop())
        try:
            return future.result(timeout_s + 5.0)  # the coroutine enforces timeout_s itself
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"{self.label}: no answer to {what} within {timeout_s} s") \
                from None
        except concurrent.futures.CancelledError:
            raise ToolBackendError(f"{self.label}: the connection was lost during {what} "
                                   f"({self._lost or 'cancelled'})") from None

    async def _request(self, send: Any, timeout_s: float, what: str) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
        from pydantic import ValidationError

        client = self._client
        if client is None:
            raise ToolBackendError(f"{self.label}: not connected ({self._lost})")
        task = asyncio.current_task()
        if task is not None:
            self._calls.add(task)
        try:
            async with asyncio.timeout(timeout_s + 1.0):
                return await send(client)
        except TimeoutError:
            raise TimeoutError(f"{self.label}: no answer to {what} within {timeout_s} s") \
                from None
        except MCPError as error:
            if error.code == REQUEST_TIMEOUT:
                raise TimeoutError(f"{self.label}: no answer to {what} within "
                                   f"{timeout_s} s") from None
            if error.code == CONNECTION_CLOSED:
                self._mark_lost(f"{error.message} during {what}")
                raise ToolBackendError(f"{self.label} closed the connection during {what} "
                                       f"(it will be reopened)") from None
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
            self._mark_lost(_describe(error))
            raise ToolBackendError(f"{self.label}: {what} failed ({_describe(error)})") \
                from None
        finally:
            if task is not None:
                self._calls.discard(task)

    def list_tools(self) -> list[dict[str, Any]]:
        """[{"name", "description", "input_schema"}] of every tool the server lists (kept
        after the first listing)."""
        if self._listing is not None:
            return self._listing
        self.ensure_open()
        timeout = self.server.connect_timeout_s

        async def send(client: Any) -> list[Any]:
            tools, cursor = [], None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = getattr(page, "next_cursor", None)
                if not cursor:
                    return tools

        tools = self._run_request(self._request(send, timeout, "tools/list"), timeout,
                                  "tools/list")
        self._listing = [{"name": tool.name,
                          "description": tool.description or getattr(tool, "title", None) or "",
                          "input_schema": dict(tool.input_schema or {})} for tool in tools]
        return self._listing

    def call_tool(self, name: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        """The server's CallToolResult. Raises TimeoutError / ToolBackendError (transient),
        MCPToolError or MCPProtocolError (answers: not worth retrying)."""
        self.ensure_open()

        async def send(client: Any) -> Any:
            return await client.call_tool(name, arguments, read_timeout_seconds=timeout_s)

        what = f"tool {name!r}"
        return self._run_request(self._request(send, timeout_s, what), timeout_s, what)


def connection_for(server: MCPServer) -> MCPConnection:
    """The process's connection to `server` (created, not yet opened, on first use)."""
    _event_loop()  # resets the registry in a forked child
    with _loop_lock:
        key = server.connection_key()
        if key not in _connections:
            _connections[key] = MCPConnection(server)
        return _connections[key]


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


# --- tools ----------------------------------------------------------------------------------
def result_text(result: Any) -> str:
    """The observation text of a CallToolResult: its text content; other content named by
    kind (an image, audio, a binary resource, a resource link); the structured content as
    JSON when there is no content."""
    parts = []
    for item in getattr(result, "content", None) or []:
        kind = getattr(item, "type", None)
        if kind == "text":
            parts.append(str(item.text))
        elif kind in ("image", "audio"):
            mime = getattr(item, "mime_type", None) or getattr(item, "mimeType", "")
            parts.append(f"[{kind} content: {mime}, {len(getattr(item, 'data', '') or '')} "
                         f"base64 characters]")
        elif kind == "resource":
            resource = item.resource
            text = getattr(resource, "text", None)
            parts.append(str(text) if text is not None
                         else f"[binary resource {getattr(resource, 'uri', '')}]")
        elif kind == "resource_link":
            name = getattr(item, "name", "") or ""
            parts.append(f"[resource link: {getattr(item, 'uri', '')} {name}]".strip())
        else:
            parts.append(f"[{kind} content]")
    if not parts:
        structured = getattr(result, "structured_content", None)
        if structured is not None:
            return json.dumps(structured, ensure_ascii=False)
        return "(the tool returned no content)"
    return "\n".join(parts)


def _parameters(input_schema: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {}, **input_schema}
    parameters.setdefault("required", [])
    return parameters


@dataclass
class MCPTool:
    """One tool of an MCP server as a plug-in tool (venus_gym.tools.plugin.Tool).

    `timeout_s` is enforced here (the waiting request is cancelled), so the toolbox adds
    no timeout thread of its own; `cache_identity` keys its calls in the
    record/replay cache.
    """

    connection: MCPConnection
    remote_name: str
    name: str
    schema: dict[str, Any]
    timeout_s: float
    cache_identity: str = field(default="")
    remote: bool = True

    def call(self, arguments: dict[str, Any]) -> str:
        result = self.connection.call_tool(self.remote_name, arguments, self.timeout_s)
        text = result_text(result)
        if getattr(result, "is_error", False):
            raise MCPToolError(text)
        return text


def mcp_tools(spec: Any, *, cache: Any = None, timeout_s: float | None = None) -> list[MCPTool]:
    """The tools of the MCP server an `extra_tools` entry names.

    cache:     a venus_gym.tools.cache.ToolCache: the tool listing is recorded / replayed
               through it (in replay mode the server is not contacted at all).
    timeout_s: per call, when the server's own timeout_s is not set (else 30 s).
    """
    server = parse_mcp_spec(spec)
    _import_client()  # say which extra is missing before anything else
    connection = connection_for(server)
    if cache is not None:
        listing = cache.lookup("mcp_tools", {"server": server.identity},
                               connection.list_tools)
    else:
        listing = connection.list_tools()
    by_name = {tool["name"]: tool for tool in listing}
    chosen = list(by_name) if server.tools is None else list(server.tools)
    missing = [name for name in chosen if name not in by_name]
    if missing:
        raise ValueError(f"{connection.label} has no tool(s) {missing}; it lists "
                         f"{sorted(by_name)}")
    timeout = server.timeout_s or timeout_s or DEFAULT_TIMEOUT_S
    tools = []
    for remote_name in chosen:
        listed = by_name[remote_name]
        name = server.prefix + remote_name
        schema = {"type": "function", "function": {
            "name": name, "description": listed["description"],
            "parameters": _parameters(listed["input_schema"])}}
        tools.append(MCPTool(connection, remote_name, name, schema, timeout,
                             cache_identity=f"{server.identity}#{remote_name}"))
    return tools
