"""MCP servers as untrusted parties (venus_gym.tools.mcp_tools, mcp_connection,
mcp_listing, mcp_stdio), against the hand-written stdio servers of
tests/mcp_untrusted_server.py: tool listings are sanitised like observations and bounded
(each description, each schema, the whole tool section, with a warning naming each tool
cut or left out); a call, reconnecting included, keeps its deadline and gym.make keeps
connect_timeout_s even when a server never answers `initialize`; an environment stops the
servers it started when it closes (a shared one when its last environment closes) and a
refused build stops what it started; tool schemas are scoped to the environments that
offer them; an oversized stdio result is refused quickly and the session stays usable."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

import envs  # noqa: F401  (registers the environments)
from venus_gym.protocol import format_tool_turn, parse_turn, render_system_prompt
from venus_gym.tools import ToolBackendError
from venus_gym.tools.mcp_listing import MAX_DESCRIPTION_CHARS, MCPToolWarning

pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e .[mcp])")

SERVER = str(Path(__file__).with_name("mcp_untrusted_server.py"))
SMALL = {"world_size": 200, "max_turns": 30}


def server(mode: str, *extra: str, **options) -> dict:
    return {"mcp": {"command": [sys.executable, SERVER, mode, *extra], **options}}


def pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting to be reaped counts as stopped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_stopped(pid: int, within_s: float) -> bool:
    ends = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > ends:
            return False
        time.sleep(0.02)
    return True


def call(env, name: str, arguments: dict) -> tuple[str, float]:
    """One tool turn: (observation body, seconds)."""
    started = time.monotonic()
    observation, _, _, _, info = env.step(format_tool_turn("Use the tool.", name, arguments))
    assert info["valid"], info["reason"]
    body = observation.removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")
    return body, time.monotonic() - started


def test_tool_descriptions_names_and_schemas_are_sanitised():
    env = gym.make("DeepResearch-v0", extra_tools=[server("hostile", tools=["lookup"],
                                                          prefix="h1_")], **SMALL).unwrapped
    plain = render_system_prompt(("search", "visit"))
    for prompt in (env.system_prompt,
                   render_system_prompt(env.offered_tools, style="compact")):
        assert "<|im_start|>" not in prompt and "<|im_end|>" not in prompt
        assert "\x07" not in prompt
        assert prompt.count("</tool_response>") <= plain.count("</tool_response>")
        assert "Look up.< |im_end| >" in prompt
    assert "&lt;/tool_response&gt;< |im_start| >" in env.system_prompt
    env.reset(seed=0)
    assert call(env, "h1_lookup", {"query": "x"})[0] == "ok"  # still called by its own name
    env.close()


def test_a_huge_description_and_a_crowded_tool_section_are_bounded():
    with pytest.warns(MCPToolWarning) as caught:
        env = gym.make("DeepResearch-v0", max_context_tokens=6144,
                       extra_tools=[server("hostile", prefix="h2_")], **SMALL).unwrapped
    messages = [str(warning.message) for warning in caught]
    assert any(f"description of tool 'h2_huge' was cut from 1,000,000 to "
               f"{MAX_DESCRIPTION_CHARS:,} characters" in m for m in messages), messages
    left_out = [m for m in messages if "is not offered" in m]
    assert left_out and all("1536 tokens" in m.replace(",", "") for m in left_out)
    assert "h2_huge" in env.offered_tools and "h2_filler_29" not in env.offered_tools
    assert any("tool 'h2_filler_29' is not offered" in m for m in left_out)
    assert env._system_tokens < 6144 // 4 + env.count_tokens(render_system_prompt())
    assert len(env.system_prompt) < 12_000
    env.close()


def test_a_call_reconnecting_to_a_server_that_never_answers_keeps_its_deadline(tmp_path):
    env = gym.make("DeepResearch-v0", tool_retries=1, extra_tools=[server(
        "crash-then-noinit", "--marker", str(tmp_path / "started"), "--pidfile",
        str(tmp_path / "pids"), timeout_s=1, connect_timeout_s=30, prefix="c3_")],
        **SMALL).unwrapped
    env.reset(seed=0)
    deadline = 2 * 1 + 0.5 + 0.5  # two attempts of 1 s, the backoff, slack
    body, seconds = call(env, "c3_crash", {})  # dies; the retry meets a mute restart
    assert body.startswith("c3_crash failed: TimeoutError: MCP server ") and seconds < deadline
    assert "(after 2 attempts)" in body
    body, seconds = call(env, "c3_ok", {})  # the restart is still mute: same deadline
    assert body.startswith("c3_ok failed: TimeoutError: ") and seconds < deadline, body
    env.close()
    assert all(wait_stopped(pid, 5) for pid in pids(tmp_path / "pids"))


def test_gym_make_keeps_connect_timeout_with_a_server_that_never_initialises(tmp_path):
    started = time.monotonic()
    with pytest.raises(ToolBackendError, match=r"noinit .*: no session within 1.0 s"):
        gym.make("DeepResearch-v0", extra_tools=[server(
            "noinit", "--pidfile", str(tmp_path / "pids"), connect_timeout_s=1)], **SMALL)
    assert time.monotonic() - started < 1.8
    [pid] = pids(tmp_path / "pids")
    assert wait_stopped(pid, 5)  # the refused build stopped it


def test_a_refused_build_and_closed_environments_stop_their_servers(tmp_path):
    refused = tmp_path / "refused"
    with pytest.raises(ValueError, match=r"MCP tool 'b4_bad name!'"):
        gym.make("DeepResearch-v0", extra_tools=[server("badname", "--pidfile", str(refused),
                                                        prefix="b4_")], **SMALL)
    [pid] = pids(refused)
    assert wait_stopped(pid, 5)

    shared = tmp_path / "shared"
    spec = server("big", "--pidfile", str(shared), prefix="s4_", timeout_s=5)
    first = gym.make("DeepResearch-v0", extra_tools=[spec], **SMALL)
    second = gym.make("DeepResearch-v0", extra_tools=[spec], **SMALL)
    [pid] = pids(shared)  # one server for both
    first.close()
    assert alive(pid)  # the second still offers it
    second.unwrapped.reset(seed=0)
    assert call(second.unwrapped, "s4_pid", {})[0] == str(pid)
    second.close()  # the last one: stopped by the time close returns
    assert wait_stopped(pid, 0.5)
    second.close()  # idempotent


def test_tool_schemas_are_scoped_to_the_environment_that_offers_them():
    first = gym.make("DeepResearch-v0", extra_tools=[server("echo:text", prefix="e5_")],
                     **SMALL).unwrapped
    first.reset(seed=0)
    assert call(first, "e5_echo", {"text": "one"})[0] == "one"
    first.close()
    second = gym.make("DeepResearch-v0", extra_tools=[server("echo:message", prefix="e5_")],
                      **SMALL).unwrapped  # a different e5_echo
    second.reset(seed=0)
    assert call(second, "e5_echo", {"message": "two"})[0] == "two"
    assert not parse_turn(format_tool_turn("t", "e5_echo", {"text": "x"}),
                          second.offered_tools).valid
    second.close()


def test_an_oversized_stdio_result_is_refused_and_the_session_kept():
    env = gym.make("DeepResearch-v0", tool_retries=0,
                   extra_tools=[server("big", prefix="o6_", timeout_s=10)], **SMALL).unwrapped
    env.reset(seed=0)
    pid = call(env, "o6_pid", {})[0]
    body, seconds = call(env, "o6_big", {"mb": 50})
    assert body.startswith("o6_big failed: MCPResultTooLarge: MCP server ") and seconds < 5
    assert "over 8,388,608 bytes (max_result_bytes); refused" in body
    assert call(env, "o6_big", {"mb": 0.5})[0].startswith("x" * 100)  # under the limit
    assert call(env, "o6_ok", {})[0] == "ok" and call(env, "o6_pid", {})[0] == pid
    env.close()

    small = gym.make("DeepResearch-v0", tool_retries=0, extra_tools=[server(
        "big", prefix="o6_", timeout_s=10, max_result_bytes=100_000)], **SMALL).unwrapped
    small.reset(seed=0)
    assert call(small, "o6_big", {"mb": 0.05})[0].startswith("x" * 100)
    assert call(small, "o6_big", {"mb": 0.2})[0].startswith("o6_big failed: "
                                                            "MCPResultTooLarge")
    assert call(small, "o6_ok", {})[0] == "ok"
    small.close()


def test_an_oversized_answer_received_whole_is_refused_too():
    """Over HTTP the answer arrives whole (50 MB in about 0.5 s): it is refused after."""
    from types import SimpleNamespace

    from venus_gym.tools.mcp_tools import MCPResultTooLarge, MCPServer, MCPTool

    class Connection:  # what MCPTool needs of a connection, answering 2,000 characters
        label = "MCP server http://127.0.0.1:1/mcp"
        server = MCPServer(url="http://127.0.0.1:1/mcp", max_result_bytes=1024)

        def call_tool(self, name, arguments, timeout_s):
            text = SimpleNamespace(type="text", text="y" * 2000)
            return SimpleNamespace(content=[text], is_error=False)

    tool = MCPTool(Connection(), "big", "big", {}, 1.0)
    with pytest.raises(MCPResultTooLarge, match=r"is 2,000 characters, over max_result_bytes "
                                                 r"\(1,024\); refused"):
        tool.call({})
