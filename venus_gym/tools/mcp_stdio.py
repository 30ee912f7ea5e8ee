"""The stdio transport of venus-gym's MCP client: the MCP SDK's `stdio_client` with a line
reader that is linear in the message size and bounded.

The SDK's reader joins its buffer with every 64 KiB chunk (`(buffer + chunk).split("\\n")`),
so one message of N bytes costs N^2 / 128 KiB byte copies: a 50 MB tool result takes
minutes, the call times out, and the server's later answers queue behind the rest of it.
This reader keeps the chunks of the current line in a list and looks for the newline in
each new chunk only. A message over `max_message_bytes` is not kept: its bytes are skipped
up to its newline, and when it is the response to one of our requests (its top-level "id"
and "result" or "error" come in its first bytes, as every JSON-RPC writer puts them) that
request is answered with a JSON-RPC error of code RESULT_TOO_LARGE instead, so the call
fails at once with a message saying why and the session stays usable.

Process start and shutdown are the SDK's own (its helpers are used as they are); with an
SDK that lacks them, `bounded_stdio_client` is the SDK's `stdio_client`, unbounded.
"""

from __future__ import annotations

import json
import logging
import sys
from contextlib import asynccontextmanager
from typing import Any, TextIO

logger = logging.getLogger(__name__)

RESULT_TOO_LARGE = -32050  # a code of our own, in JSON-RPC's server-defined range
_HEAD_BYTES = 4096  # where a response's top-level "id" and "result" keys are looked for


def head_keys(head: str) -> tuple[dict[str, Any], set[str]]:
    """The top-level members of the JSON object that starts with `head` (possibly cut):
    ({key: value} for the scalar values read in full, {every key seen})."""
    decoder = json.JSONDecoder()
    values: dict[str, Any] = {}
    keys: set[str] = set()
    depth, index = 0, 0
    while index < len(head):
        char = head[index]
        if char == '"':
            try:
                token, end = decoder.raw_decode(head, index)
            except ValueError:
                break  # a string cut by the end of the head
            rest = head[end:].lstrip()
            if depth == 1 and rest.startswith(":"):  # a top-level key
                keys.add(token)
                value_at = len(head) - len(rest[1:].lstrip())
                try:
                    value, _ = decoder.raw_decode(head, value_at)
                    if not isinstance(value, dict | list):
                        values[token] = value
                except ValueError:
                    pass
            index = end
            continue
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        index += 1
    return values, keys


def too_large_reply(head: bytes, limit: int) -> Any:
    """The error response standing in for an oversized response, None when the head does
    not show one (a request or notification from the server, or an unusual key order)."""
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    values, keys = head_keys(head.decode("utf-8", errors="replace"))
    request_id = values.get("id")
    if (isinstance(request_id, bool) or not isinstance(request_id, int | str)
            or "method" in keys or not keys & {"result", "error"}):
        return None
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(
        code=RESULT_TOO_LARGE,
        message=f"the server's answer is over the {limit}-byte limit (max_result_bytes); "
                f"it was skipped")))


@asynccontextmanager
async def bounded_stdio_client(server: Any, errlog: TextIO = sys.stderr,
                               max_message_bytes: int = 8 * 2**20) -> Any:
    """`mcp.client.stdio.stdio_client(server, errlog)` with the bounded line reader."""
    try:
        import anyio
        import anyio.lowlevel
        from mcp.client import stdio as sdk

        helpers = (sdk._get_executable_command, sdk._create_platform_compatible_process,
                   sdk._drain_stdout, sdk._stop_server_process, sdk._aclose_all,
                   sdk._parse_line, sdk._WRITER_FLUSH_TIMEOUT)
    except (ImportError, AttributeError):  # another SDK version: its own reader, unbounded
        from mcp.client.stdio import stdio_client

        async with stdio_client(server, errlog=errlog) as streams:
            yield streams
        return
    executable, spawn, drain, stop, aclose_all, parse_line, flush_timeout = helpers
    process = await spawn(command=executable(server.command), args=server.args,
                          env=sdk.get_default_environment() | (server.env or {}),
                          errlog=errlog, cwd=server.cwd)
    # As in the SDK: no awaits before the task group, or a cancel would leak the process.
    from mcp.shared.message import SessionMessage

    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()
    state = {"shutting_down": False}

    async def deliver(message: Any) -> bool:
        try:
            await read_writer.send(message)
            return True
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False  # the session is gone

    async def stdout_reader() -> None:
        parts: list[bytes] = []
        size, skipping = 0, False
        try:
            async with read_writer:
                try:
                    async for chunk in process.stdout:
                        start = 0
                        while True:
                            newline = chunk.find(b"\n", start)
                            piece = chunk[start:] if newline < 0 else chunk[start:newline]
                            if not skipping and size + len(piece) > max_message_bytes:
                                head = b"".join(parts)[:_HEAD_BYTES] + piece[:_HEAD_BYTES]
                                reply = too_large_reply(head[:_HEAD_BYTES], max_message_bytes)
                                logger.warning("MCP server %s sent a message over %d bytes; "
                                               "skipped", server.command, max_message_bytes)
                                parts, size, skipping = [], 0, True
                                if reply is not None and not await deliver(reply):
                                    return
                            elif not skipping:
                                parts.append(piece)
                                size += len(piece)
                            if newline < 0:
                                break
                            start = newline + 1
                            line = b"".join(parts)
                            was_skipping, parts, size, skipping = skipping, [], 0, False
                            if was_skipping or not line.strip():
                                continue
                            text = line.decode(server.encoding, server.encoding_error_handler)
                            if not await deliver(parse_line(text)):
                                return
                finally:
                    await drain(process)
        except anyio.ClosedResourceError:
            pass  # our own shutdown closed stdout under the read
        except (anyio.BrokenResourceError, ConnectionError, UnicodeDecodeError):
            if not state["shutting_down"]:
                logger.exception("Reading from the MCP server's stdout failed mid-session")

    async def stdin_writer() -> None:
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode(
                        server.encoding, server.encoding_error_handler))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the session sees the end instead of hanging
        finally:
            writer_done.set()

    async def shutdown() -> None:  # the SDK's sequence
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(flush_timeout):
            await writer_done.wait()
        await stop(process)
        await aclose_all(read_stream, write_stream, read_writer, write_reader)
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as group:
        group.start_soon(stdout_reader)
        group.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            state["shutting_down"] = True
            with anyio.CancelScope(shield=True):  # the server must stop even when cancelled
                await shutdown()
            group.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()
