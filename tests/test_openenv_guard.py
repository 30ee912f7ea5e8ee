"""The guard in front of openenv-core's WebSocket sessions (envs.integrations.openenv_guard),
at the ASGI level: which frames it answers itself, the idle timeout, and a close after the
client left. Against the real server: tests/test_reliability_reproducers.py section 5."""

from __future__ import annotations

import asyncio
import json

import pytest

from envs.integrations.openenv_guard import SessionGuard, frame_problem


@pytest.mark.parametrize("message,code", [
    ({"type": "websocket.receive", "bytes": b"\x00\x01"}, "INVALID_JSON"),
    ({"type": "websocket.receive", "text": "[" * 5000 + "]" * 5000}, "INVALID_JSON"),
    ({"type": "websocket.receive", "text": '{"a": ' + "[" * 101 + "]" * 101 + "}"},
     "INVALID_JSON"),  # parses, but deeper than MAX_JSON_DEPTH
    ({"type": "websocket.receive", "text": "[1, 2]"}, "VALIDATION_ERROR"),
    ({"type": "websocket.receive", "text": '"reset"'}, "VALIDATION_ERROR"),
    ({"type": "websocket.receive", "text": "null"}, "VALIDATION_ERROR"),
    ({"type": "websocket.receive", "text": "{not json"}, None),  # openenv answers it
    ({"type": "websocket.receive", "text": '{"type": "step", "data": {"text": "\\ud800"}}'},
     None),
])
def test_frames_the_handler_would_choke_on_are_answered_here(message, code):
    problem = frame_problem(message)
    assert (problem[0] if problem else None) == code


class Client:
    """A scripted ASGI client: `frames` in order, then silence (or a disconnect)."""

    def __init__(self, frames, then_disconnect=False, fail_close=False):
        self.incoming = [{"type": "websocket.connect"}] + [
            {"type": "websocket.receive", **f} for f in frames]
        self.then_disconnect = then_disconnect
        self.fail_close = fail_close
        self.sent = []

    async def receive(self):
        if self.incoming:
            return self.incoming.pop(0)
        if self.then_disconnect:
            return {"type": "websocket.disconnect", "code": 1000}
        await asyncio.Event().wait()  # silent forever

    async def send(self, message):
        if message["type"] == "websocket.close" and self.fail_close:
            raise OSError("client disconnected")
        self.sent.append(message)


async def echo_app(scope, receive, send):
    """Accepts, then answers each text frame with its length until a disconnect."""
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            await send({"type": "websocket.close", "code": 1000})
            return
        await send({"type": "websocket.send", "text": str(len(message["text"]))})


def run(guard, client, path="/ws"):
    scope = {"type": "websocket", "path": path}
    asyncio.run(asyncio.wait_for(guard(scope, client.receive, client.send), 10))
    return [m.get("text") or m["type"] for m in client.sent]


def test_bad_frames_get_an_error_and_good_ones_reach_the_app():
    client = Client([{"text": "[1]"}, {"bytes": b"x"}, {"text": '{"a": 1}'}],
                    then_disconnect=True)
    sent = run(SessionGuard(echo_app), client)
    assert sent[0] == "websocket.accept" and sent[-1] == "websocket.close"
    errors = [json.loads(s)["data"]["code"] for s in sent[1:3]]
    assert errors == ["VALIDATION_ERROR", "INVALID_JSON"] and sent[3] == "8"


def test_a_silent_session_is_told_and_closed_after_the_idle_timeout():
    client = Client([{"text": '{"a": 1}'}])  # then silent
    sent = run(SessionGuard(echo_app, idle_timeout_s=0.05), client)
    assert sent[:2] == ["websocket.accept", "8"]
    notice = json.loads(sent[2])["data"]
    assert notice["code"] == "SESSION_ERROR" and "idle timeout" in notice["message"]
    assert sent[3:] == ["websocket.close"]  # the app's own close after it is not sent twice


def test_closing_after_the_client_left_is_not_an_error():
    client = Client([], then_disconnect=True, fail_close=True)
    assert run(SessionGuard(echo_app), client) == ["websocket.accept"]


def test_other_paths_pass_through_untouched():
    client = Client([{"text": "[1]"}], then_disconnect=True)
    sent = run(SessionGuard(echo_app, idle_timeout_s=0.05), client, path="/mcp")
    assert sent == ["websocket.accept", "3", "websocket.close"]
    with pytest.raises(ValueError):
        SessionGuard(echo_app, idle_timeout_s=-1)
