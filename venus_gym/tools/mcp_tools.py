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
timeout_s, connect_timeout_s, max_result_bytes). The server's tools are listed once
(`tools/list`); each becomes a plug-in tool (`MCPTool`) whose schema is the tool's JSON
input schema, sanitised and bounded (venus_gym.tools.mcp_listing), so it appears in the
system prompt and the parser checks calls to it like any plug-in.

Calls go through the environment's toolbox like search and visit
(`venus_gym.tools.toolbox.Toolbox.call_plugin`): retries of transient failures, the
record/replay cache (the tool listing and every call), cost accounting, and the
environment's sanitising and cutting of the observation. Failures are observations, never
exceptions: a server that hangs, one that dies mid-call (the next call starts it again, or
reconnects), one whose restart never answers, an error result (the tool's isError text), a
reply that is not valid MCP (malformed content), an answer over `max_result_bytes`, an
error answer of the protocol. Only a server that cannot be reached when the environment is
built (its tools must be listed, within connect_timeout_s) raises.

Deadlines. One attempt of a call, reconnecting included, ends within `timeout_s`: a call
waits for a reconnect only as long as its own time allows (the reconnect goes on in the
background, bounded by connect_timeout_s, and later calls wait for the same one), and a
lost session is shut down in the background. A step with retries therefore ends within
(retries + 1) * timeout_s plus the toolbox's backoff. Building an environment ends within
connect_timeout_s (start, handshake and listing together).

Lifetime. One connection per server and process, shared by every environment of the
process that offers it (a group of G environments starts one stdio server, not G);
requests from several threads run concurrently on it. Each environment holds it through
its tools: `env.close()` lets go, and the last environment to let go stops the server
(a stdio child process) or closes the HTTP session; a build that fails lets go of what it
started. `close_mcp_connections()` (also run at exit) closes every connection at once.
The MCP client runs on one background event loop thread.

Needs the `mcp` package (the official MCP Python SDK, 2.x): `pip install -e .[mcp]`. Nothing
here imports it until a server is used, and nothing here needs torch.

Deviation from DR-Venus: its agent has exactly search and visit. Tool servers people
already run speak MCP (verifiers, AgentCPM- and MiroThinker-style agents use them); this
module lets the environment offer theirs.
"""

from __future__ import annotations

import json
import shlex
import warnings
from dataclasses import dataclass, field, fields
from typing import Any

from .mcp_connection import (
    MCP_INSTALL_HINT,
    MCPConnection,
    MCPProtocolError,
    MCPResultTooLarge,
    MCPToolError,
    _import_client,
    acquire_connection,
    close_mcp_connections,
    release_connection,
)
from .mcp_listing import MCPToolWarning, ToolSection, offered_schema

__all__ = ["MCP_INSTALL_HINT", "MCPConnection", "MCPProtocolError", "MCPResultTooLarge",
           "MCPServer", "MCPTool", "MCPToolError", "MCPToolWarning", "ToolSection",
           "close_mcp_connections", "is_mcp_spec", "mcp_tools", "parse_mcp_spec",
           "result_text"]

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_RESULT_BYTES = 8 * 2**20


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
    connect_timeout_s: seconds to start / reach the server and list its tools (a
                  reconnect after the session was lost is bounded by it too).
    max_result_bytes: the largest answer taken; a larger one is refused (an error
                  observation). Over stdio it is skipped as it arrives and the session
                  stays open; over HTTP it is refused once received.
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
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES

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
        if isinstance(self.max_result_bytes, bool) or not isinstance(self.max_result_bytes, int) \
                or self.max_result_bytes < 1024:
            raise ValueError(f"mcp max_result_bytes must be an integer >= 1024, got "
                             f"{self.max_result_bytes!r}")

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
                   connect_timeout_s=float(spec.get("connect_timeout_s", 60.0)),
                   max_result_bytes=spec.get("max_result_bytes", DEFAULT_MAX_RESULT_BYTES))

    @property
    def identity(self) -> str:
        """What the record/replay cache keys this server by: its URL or command line
        (environment variables and headers, which may hold secrets, are left out)."""
        return f"url:{self.url}" if self.url else f"stdio:{shlex.join(self.command)}"

    def connection_key(self) -> tuple:
        return (self.url, self.command, self.env, self.cwd, self.headers_env,
                self.max_result_bytes)


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


@dataclass
class MCPTool:
    """One tool of an MCP server as a plug-in tool (venus_gym.tools.plugin.Tool).

    `timeout_s` is enforced here, reconnecting included (the waiting request is
    cancelled), so the toolbox adds no timeout thread of its own; `cache_identity` keys
    its calls in the record/replay cache. Each tool holds its connection until `close`.
    """

    connection: MCPConnection
    remote_name: str
    name: str
    schema: dict[str, Any]
    timeout_s: float
    cache_identity: str = field(default="")
    remote: bool = True
    closed: bool = False

    def call(self, arguments: dict[str, Any]) -> str:
        result = self.connection.call_tool(self.remote_name, arguments, self.timeout_s)
        text = result_text(result)
        # Over stdio an oversized answer never gets here; over HTTP it arrived whole.
        limit = self.connection.server.max_result_bytes
        if len(text) > limit:
            raise MCPResultTooLarge(f"{self.connection.label}: the answer to tool "
                                    f"{self.remote_name!r} is {len(text):,} characters, over "
                                    f"max_result_bytes ({limit:,}); refused")
        if getattr(result, "is_error", False):
            raise MCPToolError(text)
        return text

    def close(self, wait: bool = True) -> None:
        """Let go of the connection (the last tool to let go stops the server)."""
        if not self.closed:
            self.closed = True
            release_connection(self.connection, wait=wait)


def mcp_tools(spec: Any, *, cache: Any = None, timeout_s: float | None = None,
              section: ToolSection | None = None) -> list[MCPTool]:
    """The tools of the MCP server an `extra_tools` entry names, each holding the
    connection (close them to let go; a failure here lets go of what it took).

    cache:     a venus_gym.tools.cache.ToolCache: the tool listing is recorded / replayed
               through it (in replay mode the server is not contacted at all).
    timeout_s: per call, when the server's own timeout_s is not set (else 30 s).
    section:   the share of the system prompt left for MCP tools (tools that do not fit
               are left out, with an MCPToolWarning).
    """
    server = parse_mcp_spec(spec)
    _import_client()  # say which extra is missing before anything else
    connection = acquire_connection(server)  # held while listing
    tools: list[MCPTool] = []
    try:
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
        for remote_name in chosen:
            name = server.prefix + remote_name
            schema = offered_schema(by_name[remote_name], name, connection.label)
            if schema is None or (section is not None
                                  and not section.admit(schema, connection.label)):
                continue
            tools.append(MCPTool(acquire_connection(server), remote_name, name, schema,
                                 timeout, cache_identity=f"{server.identity}#{remote_name}"))
    except BaseException:
        for tool in tools:
            tool.close(wait=False)
        raise
    finally:
        # Not waiting: a failed build must not outlast connect_timeout_s; the server
        # stops in the background.
        release_connection(connection, wait=False)
    if not tools:
        warnings.warn(f"{connection.label} offers no tool (all were left out)",
                      MCPToolWarning, stacklevel=2)
    return tools
