"""An ASGI guard in front of openenv-core's WebSocket sessions (`/ws`).

openenv-core's handler answers a bad message with an error reply only when the message is
a JSON object; anything else ended the session (and lost its episode): a JSON array,
string, number or null (`message.get` on a non-dict), JSON nested past the recursion limit
(a RecursionError is not the JSONDecodeError it expects), and a binary frame
(`receive_text` on bytes). It also never closes a session whose client went silent, and a
client that disconnects right after its `{"type": "close"}` made the handler's own close
raise, which uvicorn logs as "Exception in ASGI application" with a traceback.

`SessionGuard(app, idle_timeout_s)` sits between uvicorn and that handler:

- every frame is checked before the handler sees it (`frame_problem`); a frame it would
  choke on gets OpenEnv's error reply, `{"type": "error", "data": {"message", "code"}}`,
  and the session goes on. Codes: INVALID_JSON (a binary frame, JSON nested deeper than
  MAX_JSON_DEPTH), VALIDATION_ERROR (JSON that is not an object). Invalid JSON text
  and bad objects go on to the handler, which answers them itself;
- a session that sends nothing for `idle_timeout_s` gets an error reply saying so
  (code SESSION_ERROR) and is closed (WebSocket code 1000, reason "idle timeout"); its
  environment is released like on any disconnect;
- closing a connection whose client is already gone is not an error.

HTTP routes and other WebSocket paths pass through untouched.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from venus_gym.jsonl import MAX_JSON_DEPTH, parse_json_object

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
GUARDED_PATH = "/ws"


def frame_problem(message: Message) -> tuple[str, str] | None:
    """(error code, reason) for a WebSocket frame openenv-core's handler cannot take, or
    None for one it answers itself (a JSON object, or text that is not JSON at all)."""
    text = message.get("text")
    if text is None:
        return ("INVALID_JSON", "binary frames are not accepted: send each message as a "
                                "JSON text frame")
    try:
        parse_json_object(text, allow_lone_surrogates=True)
    except json.JSONDecodeError:
        return None  # the handler's own INVALID_JSON reply
    except ValueError as e:
        if "deeply" in str(e):
            return "INVALID_JSON", f"JSON nested too deeply (more than {MAX_JSON_DEPTH} levels)"
        return ("VALIDATION_ERROR", f"a message must be a JSON object such as "
                                    f'{{"type": "reset", "data": {{}}}}: {e}')
    return None


def _error(code: str, reason: str) -> Message:
    reply = {"type": "error", "data": {"message": reason, "code": code}}
    return {"type": "websocket.send", "text": json.dumps(reply)}


class SessionGuard:
    """ASGI middleware guarding the `/ws` sessions of an OpenEnv app (module docstring).

    idle_timeout_s: seconds a session may stay silent; None or 0 = no limit.
    """

    def __init__(self, app: Any, idle_timeout_s: float | None = None):
        if idle_timeout_s is not None and idle_timeout_s < 0:
            raise ValueError(f"idle_timeout_s must be >= 0 or None, got {idle_timeout_s}")
        self.app = app
        self.idle_timeout_s = idle_timeout_s or None

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope.get("type") != "websocket" or scope.get("path") != GUARDED_PATH:
            await self.app(scope, receive, send)
            return
        closed = False

        async def guarded_send(message: Message) -> None:
            nonlocal closed
            if message.get("type") == "websocket.close":
                if closed:
                    return  # already closed here (idle timeout)
                closed = True
                try:
                    await send(message)
                except OSError:  # the client left first: nothing is left to close
                    pass
                return
            await send(message)

        async def guarded_receive() -> Message:
            nonlocal closed
            while True:
                try:
                    message = await asyncio.wait_for(receive(), self.idle_timeout_s)
                except TimeoutError:  # asyncio.wait_for: no message in time
                    try:
                        await send(_error("SESSION_ERROR", f"no message for "
                                                           f"{self.idle_timeout_s} s: the session "
                                                           f"is closed (idle timeout)"))
                    except OSError:  # gone already
                        pass
                    await guarded_send({"type": "websocket.close", "code": 1000,
                                        "reason": "idle timeout"})
                    return {"type": "websocket.disconnect", "code": 1000}
                if message.get("type") != "websocket.receive":
                    return message
                problem = frame_problem(message)
                if problem is None:
                    return message
                await send(_error(*problem))

        await self.app(scope, guarded_receive, guarded_send)
