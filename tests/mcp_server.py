"""A small MCP server for tests/test_mcp_tools.py, run as its own process.

    python tests/mcp_server.py stdio            # fastmcp over stdin/stdout
    python tests/mcp_server.py http             # fastmcp over streamable HTTP on 127.0.0.1,
                                                #   any free port; prints "serving URL" first
    python tests/mcp_server.py raw-malformed    # hand-written JSON-RPC over stdio whose
                                                #   tools/call replies break the protocol

Tools (fastmcp modes): `add`, `echo`, `weather` (an optional argument), `sleep` (hangs
past any test timeout), `crash` (the process exits mid-call), `fail` (the tool raises:
an isError result), `noisy` (control characters and chat tags in its text), `counter`
(a new number per call: shows whether a call ran live or was replayed), `pid` (the
server's process id), `picture` (image content only).
"""

import json
import os
import socket
import sys
import time


def build_server():
    from fastmcp import FastMCP
    from fastmcp.tools.base import ToolResult
    from mcp_types import ImageContent

    server = FastMCP("venus-test-tools")
    calls = {"counter": 0}

    @server.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool
    def echo(text: str) -> str:
        """Repeat the text."""
        return text

    @server.tool
    def weather(city: str, units: str | None = None) -> str:
        """The weather in a city."""
        return f"{city}: 21 degrees {units or 'celsius'}"

    @server.tool
    def sleep(seconds: float) -> str:
        """Sleep, then answer."""
        time.sleep(seconds)
        return "woke up"

    @server.tool
    def crash() -> str:
        """Exit the server process mid-call."""
        sys.stdout.flush()
        os._exit(3)

    @server.tool
    def fail(message: str) -> str:
        """Raise an error."""
        raise ValueError(message)

    @server.tool
    def noisy() -> str:
        """Text with a control character and chat tags."""
        return "bell\x07 then <|im_end|> and </tool_response> done"

    @server.tool
    def counter() -> str:
        """A new number on every call."""
        calls["counter"] += 1
        return f"call {calls['counter']}"

    @server.tool
    def pid() -> str:
        """The server's process id."""
        return str(os.getpid())

    @server.tool
    def picture() -> ToolResult:
        """An image and no text."""
        return ToolResult(content=[ImageContent(type="image", data="aGVsbG8=",
                                                mime_type="image/png")])

    return server


def run_raw_malformed() -> None:
    """JSON-RPC by hand: the handshake and tools/list are right; tools/call answers break
    the protocol (content that is not a list for `broken`, a non-JSON line for `garbage`)."""
    tools = [{"name": name, "description": f"The {name} tool.",
              "inputSchema": {"type": "object", "properties": {}}}
             for name in ("broken", "garbage")]
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if "id" not in message:
            continue  # a notification
        method, request_id = message.get("method"), message["id"]
        if method == "initialize":
            result = {"protocolVersion": message["params"]["protocolVersion"],
                      "capabilities": {"tools": {}},
                      "serverInfo": {"name": "raw-malformed", "version": "0"}}
        elif method == "tools/list":
            result = {"tools": tools}
        elif method == "tools/call" and message["params"]["name"] == "garbage":
            sys.stdout.write("this is not JSON-RPC\n")
            sys.stdout.flush()
            continue
        elif method == "tools/call":
            result = {"content": 42}
        else:
            reply = {"jsonrpc": "2.0", "id": request_id,
                     "error": {"code": -32601, "message": f"no method {method}"}}
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
            continue
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
        sys.stdout.flush()


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "raw-malformed":
        run_raw_malformed()
        return
    server = build_server()
    if mode == "stdio":
        server.run(transport="stdio", show_banner=False)
        return
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections made before uvicorn starts wait in the backlog
    port = sock.getsockname()[1]
    print(f"serving http://127.0.0.1:{port}/mcp", flush=True)
    server.run(transport="http", host="127.0.0.1", port=port, sockets=[sock],
               show_banner=False, log_level="warning")


if __name__ == "__main__":
    main()
