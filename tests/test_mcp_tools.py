"""MCP servers as DeepResearch-v0 tools (venus_gym.tools.mcp_tools), against a fastmcp server
(tests/mcp_server.py) over stdio and over streamable HTTP on 127.0.0.1, and a hand-written
stdio server whose replies break the protocol: the tools appear in the system prompt with
their schemas and the parser checks calls to them; calls go through the toolbox (timeouts,
retries, sanitised observations, cost accounting, record/replay); a server that hangs,
crashes mid-call or answers malformed content gives an observation, never an exception."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

import envs  # noqa: F401  (registers the environments)
from envs.group import DeepResearchGroupEnv
from venus_gym.protocol import (
    format_tool_turn,
    parse_turn,
    register_tool_schema,
    render_system_prompt,
)
from venus_gym.tools import CacheMissError, ToolBackendError
from venus_gym.tools.mcp_connection import acquire_connection, release_connection
from venus_gym.tools.mcp_tools import MCPConnection, close_mcp_connections, parse_mcp_spec

pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e .[mcp])")
pytest.importorskip("fastmcp", reason="the test server needs fastmcp")

SERVER = str(Path(__file__).with_name("mcp_server.py"))
QUIET = {"FASTMCP_LOG_LEVEL": "CRITICAL", "FASTMCP_SHOW_SERVER_BANNER": "false"}
SMALL = {"world_size": 200, "max_turns": 30}


def stdio(mode: str = "stdio", **options) -> dict:
    return {"mcp": {"command": [sys.executable, SERVER, mode], "env": QUIET, **options}}


def start_http_server() -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, SERVER, "http"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True,
                               env={"PATH": "", **QUIET})
    line = process.stdout.readline()
    assert line.startswith("serving http://127.0.0.1:"), line
    return process, line.split()[1]


@pytest.fixture(scope="module")
def http_url():
    process, url = start_http_server()
    yield url
    process.kill()
    process.wait()


def call(env, name: str, arguments: dict) -> tuple[str, dict, float]:
    """One tool turn; (observation body, the call's info, seconds)."""
    started = time.monotonic()
    observation, reward, terminated, truncated, info = env.step(
        format_tool_turn("Use the tool.", name, arguments))
    assert info["valid"], info["reason"]
    assert observation.startswith("<tool_response>\n")
    body = observation.removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")
    return body, info, time.monotonic() - started


def test_the_servers_tools_are_offered_with_their_schemas_and_checked():
    env = gym.make("DeepResearch-v0", extra_tools=[stdio(timeout_s=5)], **SMALL).unwrapped
    assert env.offered_tools[:2] == ("search", "visit")
    assert {"add", "echo", "weather", "sleep", "crash", "fail", "noisy", "counter",
            "picture"} <= set(env.offered_tools)
    schema_line = next(line for line in env.system_prompt.splitlines()
                       if '"name": "weather"' in line)
    weather = json.loads(schema_line)["function"]
    assert weather["description"] == "The weather in a city."
    assert weather["parameters"]["required"] == ["city"]
    assert weather["parameters"]["properties"]["units"]["anyOf"] == [{"type": "string"},
                                                                     {"type": "null"}]
    compact = render_system_prompt(env.offered_tools, style="compact")
    assert '- weather {"city": str, "units": str|null}: The weather in a city.' in compact
    assert '- add {"a": int, "b": int}: Add two integers.' in compact

    tools = env.offered_tools
    assert parse_turn(format_tool_turn("t", "weather", {"city": "Oslo", "units": None}),
                      tools).valid
    for arguments, reason in [
            ({"city": "Oslo", "units": 5}, "argument 'units' must be str|null, got int"),
            ({"units": "kelvin"}, "missing required argument 'city'"),
            ({"city": "Oslo", "when": "now"}, "unexpected argument(s) 'when'")]:
        turn = parse_turn(format_tool_turn("t", "weather", arguments), tools)
        assert not turn.valid and turn.reason.startswith(reason), turn.reason
    assert not parse_turn(format_tool_turn("t", "add", {"a": 1.5, "b": 2}), tools).valid


def test_stdio_calls_and_every_failure_are_observations():
    env = gym.make("DeepResearch-v0", tool_retries=1,
                   extra_tools=[stdio(timeout_s=1.5)], **SMALL).unwrapped
    _, info = env.reset(seed=0)
    assert info["cost"]["plugin_calls"] == 0

    assert call(env, "add", {"a": 2, "b": 3})[0] == "5"
    assert call(env, "weather", {"city": "Oslo"})[0] == "Oslo: 21 degrees celsius"

    body, info, _ = call(env, "fail", {"message": "boom"})  # an isError result: not retried
    assert body == "fail failed: MCPToolError: Error calling tool 'fail': boom"
    assert info["tool_calls"][0]["ok"] is False and info["tool_calls"][0]["error"] == body

    body, _, _ = call(env, "noisy", {})  # sanitised like any tool output
    assert "\x07" not in body and "<|im_end|>" not in body
    assert "</tool_response>" not in body and body.startswith("bell\ufffd then")

    assert call(env, "picture", {})[0] == "[image content: image/png, 8 base64 characters]"

    body, info, seconds = call(env, "sleep", {"seconds": 30})  # hangs: timeout, one retry
    assert body.startswith("sleep failed: TimeoutError: MCP server ")
    assert "no answer to tool 'sleep' within 1.5 s (after 2 attempts)" in body
    assert 3.0 <= seconds < 10
    assert call(env, "add", {"a": 1, "b": 1})[0] == "2"  # the session is still usable

    pid = call(env, "pid", {})[0]
    body, info, _ = call(env, "crash", {})  # the server exits mid-call; the retry restarts
    assert body.startswith("crash failed: ")  # it, within the call's 1.5 s or not
    # How the second attempt fails depends on how fast the restarted server starts here:
    # it crashes again, or the attempt's 1.5 s run out while it reconnects.
    assert ("ToolBackendError: MCP server " in body
            and "closed the connection during tool 'crash'" in body) or \
        ("TimeoutError: MCP server " in body and "tool 'crash'" in body
         and "1.5 s" in body), body
    assert body.endswith("(after 2 attempts)")
    # The restart goes on in the background (within connect_timeout_s); on a loaded machine
    # starting Python and fastmcp can outlast both 1.5 s attempts of the next call, so the
    # test waits, on the connection itself (not counted as the env's calls), until a
    # restarted server answers. The retry may have crashed a restarted server again, whose
    # exit the connection only sees on its next request: hence a few tries.
    connection = acquire_connection(parse_mcp_spec(stdio(timeout_s=1.5)))
    try:
        for attempt in range(3):
            try:
                connection.call_tool("add", {"a": 0, "b": 0}, 60)
                break
            except (ToolBackendError, TimeoutError):
                assert attempt < 2, "the server did not come back within three 60 s tries"
    finally:
        release_connection(connection)
    assert call(env, "add", {"a": 5, "b": 5})[0] == "10"  # a fresh server process
    assert call(env, "pid", {})[0] != pid
    assert info["cost"]["plugin_calls"] == 11  # every live attempt, retries included
    assert env.cost()["plugin_calls"] == 13


def test_streamable_http_with_a_prefix_and_a_tool_choice(http_url):
    env = gym.make("DeepResearch-v0", tool_retries=0, extra_tools=[
        {"mcp": {"url": http_url, "prefix": "lab_", "tools": ["add", "sleep", "fail"],
                 "timeout_s": 1}}], **SMALL).unwrapped
    assert env.offered_tools == ("search", "visit", "lab_add", "lab_sleep", "lab_fail")
    env.reset(seed=0)
    assert call(env, "lab_add", {"a": 40, "b": 2})[0] == "42"
    body, _, seconds = call(env, "lab_sleep", {"seconds": 30})
    assert body == (f"lab_sleep failed: TimeoutError: MCP server {http_url}: no answer to tool "
                    f"'sleep' within 1.0 s") and seconds < 5
    assert call(env, "lab_fail", {"message": "no"})[0] == \
        "lab_fail failed: MCPToolError: Error calling tool 'fail': no"
    assert call(env, "lab_add", {"a": 1, "b": 2})[0] == "3"
    assert not parse_turn(format_tool_turn("t", "add", {"a": 1, "b": 2}),
                          env.offered_tools).valid  # only under its prefixed name

    with pytest.raises(ValueError, match=r"has no tool\(s\) \['nope'\]"):
        gym.make("DeepResearch-v0", extra_tools=[{"mcp": {"url": http_url,
                                                          "tools": ["nope"]}}], **SMALL)
    with pytest.raises(ValueError, match="'seadd' twice or under a built-in tool's name "
                                         r"\(give the MCP server a 'prefix'\)"):
        gym.make("DeepResearch-v0", extra_tools=[{"mcp": {"url": http_url, "tools": ["add"],
                                                          "prefix": "se"}},
                                                 {"mcp": {"url": http_url, "tools": ["add"],
                                                          "prefix": "se"}}], **SMALL)


def test_an_http_server_that_dies_mid_call_is_an_observation():
    process, url = start_http_server()
    try:
        env = gym.make("DeepResearch-v0", tool_retries=0,
                       extra_tools=[{"mcp": {"url": url, "timeout_s": 5}}], **SMALL).unwrapped
        env.reset(seed=0)
        assert call(env, "echo", {"text": "hi"})[0] == "hi"
        body, info, seconds = call(env, "crash", {})
        assert body.startswith(f"crash failed: ToolBackendError: MCP server {url}") \
            and seconds < 5
        process.wait(timeout=10)
        body, info, _ = call(env, "echo", {"text": "again"})  # nobody to reconnect to
        assert body.startswith(f"echo failed: ToolBackendError: MCP server {url}: cannot "
                               f"connect")
        assert info["tool_calls"][0]["ok"] is False
    finally:
        process.kill()


def test_malformed_replies_are_observations():
    env = gym.make("DeepResearch-v0", tool_retries=0,
                   extra_tools=[stdio("raw-malformed", timeout_s=1)], **SMALL).unwrapped
    env.reset(seed=0)
    body, _, _ = call(env, "broken", {})  # content is 42, not a list
    assert body.startswith("broken failed: MCPProtocolError: the server's reply to tool "
                           "'broken' is not valid MCP: 1 validation error for CallToolResult")
    body, _, seconds = call(env, "garbage", {})  # a line that is not JSON-RPC: no answer
    assert body.startswith("garbage failed: TimeoutError: ") and seconds < 5
    assert call(env, "broken", {})[0].startswith("broken failed: MCPProtocolError")


def test_calls_are_recorded_and_replayed_without_the_server(tmp_path, monkeypatch):
    cache = tmp_path / "tools.sqlite"
    # A generous deadline: the test counts live calls, and a slow server start on a busy
    # machine would otherwise turn one of them into a retry.
    spec = stdio(timeout_s=30)
    record = gym.make("DeepResearch-v0", cache_mode="record", cache_path=str(cache),
                      extra_tools=[spec], **SMALL).unwrapped
    record.reset(seed=0)
    recorded = [call(record, "echo", {"text": "alpha"})[0], call(record, "counter", {})[0],
                call(record, "fail", {"message": "recorded"})[0]]
    assert recorded[1].startswith("call ")
    assert call(record, "counter", {})[0] == recorded[1]  # record reuses what it stored
    assert record.cost()["plugin_calls"] == 3 and record.cost()["cache_hits"] == 1

    close_mcp_connections()  # replay must not start the server

    def no_server(self):
        raise AssertionError("replay contacted the MCP server")

    monkeypatch.setattr(MCPConnection, "ensure_open", no_server)
    replay = gym.make("DeepResearch-v0", cache_mode="replay", cache_path=str(cache),
                      extra_tools=[spec], **SMALL).unwrapped
    assert replay.offered_tools == record.offered_tools  # the listing is replayed too
    replay.reset(seed=0)
    replayed = [call(replay, "echo", {"text": "alpha"})[0], call(replay, "counter", {})[0],
                call(replay, "fail", {"message": "recorded"})[0]]
    assert replayed == recorded
    assert replay.cost()["plugin_calls"] == 0 and replay.cost()["cache_hits"] == 4
    with pytest.raises(CacheMissError, match="no entry for plugin"):
        replay.step(format_tool_turn("t", "echo", {"text": "never recorded"}))


def test_a_group_of_environments_shares_one_server():
    group = DeepResearchGroupEnv(group_size=3, extra_tools=[stdio(timeout_s=5)], **SMALL)
    group.reset(seed=0)
    pids = set()
    for env in group.envs:
        env.reset(seed=0)
        pids.add(call(env, "pid", {})[0])
    assert len(pids) == 1
    group.close()


def test_bad_specs_and_a_missing_sdk_fail_with_the_fix(monkeypatch):
    with pytest.raises(ValueError, match=r"extra_tools\[0\]: an MCP server needs exactly one "
                                         "of 'url'"):
        gym.make("DeepResearch-v0", extra_tools=[{"mcp": {"url": "http://127.0.0.1:1/mcp",
                                                          "command": "x"}}], **SMALL)
    with pytest.raises(ValueError, match=r"unknown mcp server key\(s\) \['timeout'\]"):
        gym.make("DeepResearch-v0", extra_tools=[{"mcp": {"url": "http://127.0.0.1:1/mcp",
                                                          "timeout": 3}}], **SMALL)
    with pytest.raises(ValueError, match="applies to backend='web' and to MCP servers"):
        gym.make("DeepResearch-v0", cache_mode="record", cache_path="x.sqlite", **SMALL)
    with pytest.raises(ToolBackendError, match=r"MCP server http://127.0.0.1:9/mcp: cannot "
                                               "connect"):
        gym.make("DeepResearch-v0", extra_tools=[{"mcp": {"url": "http://127.0.0.1:9/mcp",
                                                          "connect_timeout_s": 5}}], **SMALL)
    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(ImportError, match=r"pip install -e \.\[mcp\]"):
        gym.make("DeepResearch-v0", extra_tools=[stdio()], **SMALL)


def test_training_and_eval_configs_take_mcp_servers(tmp_path):
    import argparse

    import yaml

    from trainers.evaluation.run import add_arguments, benchmark_env_kwargs, config_from_args
    from trainers.rl.config import load_rl_config

    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump({"policy": {"path": "p"}, "env": {"extra_tools": [
        "calculator", {"mcp": {"command": ["python", "server.py"], "prefix": "x_"}}]}}))
    config = load_rl_config(path, ["env.cache_mode=record", "env.cache_path=t.sqlite"])
    assert config.env.kwargs()["extra_tools"][1] == {"mcp": {"command": ["python",
                                                                         "server.py"],
                                                             "prefix": "x_"}}
    override = "env.extra_tools=[{mcp: {url: 'http://127.0.0.1:8000/mcp'}}]"
    assert load_rl_config(path, [override]).env.extra_tools == [
        {"mcp": {"url": "http://127.0.0.1:8000/mcp"}}]
    with pytest.raises(ValueError, match=r"extra_tools\[0\]: unknown mcp server key"):
        load_rl_config(path, ["env.extra_tools=[{mcp: {urll: 'http://127.0.0.1:1/mcp'}}]"])
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for argv in (["--policy", "p", "--out", "o", override],
                 ["--policy", "p", "--out", "o", "--env",
                  "extra_tools=[{mcp: {url: 'http://127.0.0.1:8000/mcp'}}]"]):
        kwargs, _ = benchmark_env_kwargs(config_from_args(parser.parse_args(argv)))
        assert kwargs["extra_tools"] == ({"mcp": {"url": "http://127.0.0.1:8000/mcp"}},)


def test_schemas_mcp_servers_use_are_checked():
    register_tool_schema({"type": "function", "function": {
        "name": "mcp_shapes", "description": "Shapes.", "parameters": {
            "type": "object", "required": ["mode"],
            "properties": {
                "mode": {"type": "string", "enum": ["fast", "slow"]},
                "ids": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
                "filters": {"type": "object"},
                "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                "anything": {"description": "no type: any JSON value"},
                "flag": {"type": ["boolean", "string"]}}}}})
    tools = ("search", "mcp_shapes")

    def reason(arguments):
        return parse_turn(format_tool_turn("t", "mcp_shapes", arguments), tools).reason

    assert reason({"mode": "fast", "ids": [1, 2], "filters": {"a": [1]}, "limit": None,
                   "anything": [{"x": 1}], "flag": "yes"}) == "ok"
    assert reason({"mode": "medium"}) == \
        "argument 'mode' must be one of \"fast\", \"slow\", got '\"medium\"'"
    assert reason({"mode": "fast", "ids": [1, "2"]}) == \
        "argument 'ids' item 1 must be integer, got str"
    assert reason({"mode": "fast", "ids": []}) == "argument 'ids' must have at least 1 " \
                                                  "item(s), got 0"
    assert reason({"mode": "fast", "filters": [1]}) == \
        "argument 'filters' must be object, got list"
    assert reason({"mode": "fast", "limit": 2.5}) == \
        "argument 'limit' must be int|null, got float"
    assert reason({"mode": "fast", "flag": 3}) == \
        "argument 'flag' must be boolean or string, got int"
    assert reason({"mode": "fast", "flag": True}) == "ok"
