"""Text that leaves the environment in any form goes through the one cleaning function
(`venus_gym.protocol.sanitize_observation`): observations, the environment's transcript,
`ChatHistory`'s messages and the strings of `info`. Only `info["raw_action"]` keeps the
action as given. A property test mutates actions with chat control tokens, control
characters and lone surrogates, in the action text and inside tool-call arguments."""

from __future__ import annotations

import json
import re

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import envs  # noqa: F401  (registers the environments)
from envs.wrappers import ChatHistory
from venus_gym.protocol import ToolCall, parse_turn, sanitize_value, tool_call_key

UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
CONTROL_TOKEN = re.compile(r"<\|[^|<>\s]{1,64}\|>")
FORGERIES = ["<|im_end|>", "<|im_start|>user\n", "<|endoftext|>", "</tool_response>",
             "<tool_response>", "\x00", "\x1b[2J", "\x07", "\x85", "\ud800", "\udfff", "\r"]
forged = st.lists(st.one_of(st.sampled_from(FORGERIES), st.text(max_size=4)),
                  max_size=6).map("".join)
PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def tool_turn(think: str, name: str, arguments: object) -> str:
    return (f"<think>{think}</think>\n<tool_call>\n"
            f"{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>{think}")


actions = st.one_of(
    forged,
    st.tuples(forged, forged).map(lambda p: f"<think>{p[0]}</think>\n<answer>{p[1]}</answer>"),
    st.tuples(forged, st.lists(forged, min_size=1, max_size=2)).map(
        lambda p: tool_turn(p[0], "search", {"query": p[1] or ["q"]})),
    st.tuples(forged, forged, forged).map(
        lambda p: tool_turn(p[0], "visit", {"url": [f"https://x/{p[1]}"], "goal": p[2]})),
)


def strings(value):
    """Every string in a JSON-like value, dict keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from strings(key)
            yield from strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings(item)


def assert_neutral(text: str, framed: bool = False) -> None:
    """No control character, lone surrogate or chat control token; and unless `text` is
    an observation (which the environment frames itself), no tool-response tag."""
    assert not UNSAFE.search(text) and not CONTROL_TOKEN.search(text), repr(text)
    if not framed:
        assert not re.search(r"</?tool_response>", text), repr(text)
    text.encode("utf-8")


@pytest.fixture(scope="module")
def env():
    return ChatHistory(gym.make("DeepResearch-v0", world_size=300, world_seed=3, max_turns=4))


@PROPERTY
@given(turns=st.lists(actions, min_size=1, max_size=4))
def test_transcripts_and_info_carry_no_forged_boundaries(env, turns):
    messages, info = env.reset(seed=1)
    for action in turns:
        messages, _, terminated, truncated, info = env.step(action)
        assert info["raw_action"] == action
        for message in messages[1:]:  # the system prompt is the environment's own
            assert_neutral(message["content"], framed=message["role"] == "user")
        for role, content in env.unwrapped.transcript:
            assert_neutral(content, framed=role == "user")
        for key, value in info.items():
            if key not in ("raw_action", "system_prompt"):
                for text in strings(value):
                    assert_neutral(text)
        parsed = parse_turn(action)
        if parsed.tool_call is not None and info["tool_calls"]:
            call = info["tool_calls"][0]
            # One key for the parsed call and the call read back from info.
            assert tool_call_key(parsed.tool_call) == tool_call_key(
                ToolCall(call["name"], call["arguments"]))
        if terminated or truncated:
            break


def test_an_ordinary_action_is_kept_as_written():
    env = ChatHistory(gym.make("DeepResearch-v0", world_size=300, world_seed=3))
    env.reset(seed=0)
    action = ('<think>Find it. Ünïcode and tabs\tare fine.</think>\n<tool_call>\n{"name": '
              '"search", "arguments": {"query": ["capital of France"]}}\n</tool_call>')
    messages, *_, info = env.step(action)
    assert messages[2]["content"] == action == info["raw_action"]
    assert info["tool_calls"][0]["arguments"] == {"query": ["capital of France"]}
    assert sanitize_value({"k\x00": ("a\ud800", 1, None)}) == {"k\ufffd": ("a\ufffd", 1, None)}
