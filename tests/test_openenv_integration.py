"""DeepResearch-v0 over OpenEnv's protocol (envs.integrations.openenv): openenv-core's own
server on 127.0.0.1, played with openenv-core's client machinery; every observation and
reward must be the local gym.make environment's for the same seed and actions."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import gymnasium as gym
import pytest

pytest.importorskip("openenv.core.env_server.http_server")
pytest.importorskip("websockets")

from openenv.core.generic_client import GenericEnvClient  # noqa: E402

import envs  # noqa: E402,F401
from envs.integrations.openenv import (  # noqa: E402
    DeepResearchAction,
    DeepResearchClient,
)
from tests.conftest import OPENENV_KW  # noqa: E402
from venus_gym.worlds.oracle import OracleAgent  # noqa: E402

pytestmark = pytest.mark.slow
KW = OPENENV_KW
MALFORMED = "no tags at all"


@pytest.fixture(scope="module")
def url(openenv_server):
    return openenv_server


def local_episode(seed, actions_from):
    """Play locally: actions_from(observation, turn) -> action; [(obs, reward, term, trunc)]."""
    env = gym.make("DeepResearch-v0", **KW)
    observation, info = env.reset(seed=seed)
    steps, actions = [(observation, None, False, False)], []
    while True:
        actions.append(actions_from(observation, len(actions), env.unwrapped.task))
        observation, reward, terminated, truncated, _ = env.step(actions[-1])
        steps.append((observation, reward, terminated, truncated))
        if terminated or truncated:
            return steps, actions


def scripted(malformed_at=None):
    oracle = {}

    def act(observation, turn, task):
        oracle.setdefault("agent", OracleAgent(task))
        return MALFORMED if turn == malformed_at else oracle["agent"].act(observation)
    return act


@pytest.mark.parametrize("seed,malformed_at", [(0, None), (3, None), (5, 1)])
def test_an_episode_over_openenv_equals_the_local_environment(url, seed, malformed_at):
    steps, actions = local_episode(seed, scripted(malformed_at))
    assert steps[-1][2]  # the oracle answered (after the malformed turn, if any)

    async def remote():
        async with DeepResearchClient(base_url=url) as client:
            result = await client.reset(seed=seed)
            got = [(result.observation.text, result.reward, False, False)]
            for action in actions:
                result = await client.step(DeepResearchAction(text=action))
                o = result.observation
                got.append((o.text, result.reward, o.terminated, o.truncated))
                assert result.done == (o.terminated or o.truncated)
            state = await client.state()
            return got, state, o

    got, state, last = asyncio.run(remote())
    assert got == steps
    assert state.step_count == len(actions) and state.done
    assert last.info["kind"] == "answer" and last.info["score"] == steps[-1][1]
    if malformed_at is not None:
        assert got[malformed_at + 1][1] == -1.0 and "<tool_response>" in got[malformed_at + 1][0]


def test_openenvs_generic_client_plays_it_with_plain_dicts(url):
    steps, actions = local_episode(0, scripted())

    async def remote():
        async with GenericEnvClient(base_url=url) as client:
            result = await client.reset(seed=0)
            rewards = []
            for action in actions:
                result = await client.step({"text": action})
                rewards.append(result.reward)
            return result, rewards

    result, rewards = asyncio.run(remote())
    assert rewards == [s[1] for s in steps[1:]] and result.done
    assert result.observation["terminated"] is True


@pytest.mark.parametrize("message,code", [
    ("{not json", "INVALID_JSON"),
    (json.dumps({"type": "step", "data": {"txt": "x"}}), "VALIDATION_ERROR"),
    (json.dumps({"type": "step", "data": {"text": 5}}), "VALIDATION_ERROR"),
    (json.dumps({"type": "teleport", "data": {}}), "UNKNOWN_TYPE"),
    (json.dumps({"type": "reset", "data": {"task_id": "no-such-task"}}), "EXECUTION_ERROR"),
])
def test_a_bad_message_gets_an_error_reply_and_the_session_goes_on(url, message, code):
    import websockets.sync.client as ws

    with ws.connect(url.replace("http://", "ws://") + "/ws") as conn:
        conn.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        question = json.loads(conn.recv())["data"]["observation"]["text"]
        conn.send(message)
        reply = json.loads(conn.recv())
        assert reply["type"] == "error" and reply["data"]["code"] == code, reply
        conn.send(json.dumps({"type": "reset", "data": {"seed": 0}}))  # still served
        assert json.loads(conn.recv())["data"]["observation"]["text"] == question


def test_a_step_before_reset_or_after_the_end_is_an_error_reply(url):
    steps, actions = local_episode(0, scripted())

    async def remote():
        async with DeepResearchClient(base_url=url) as client:
            with pytest.raises(RuntimeError, match="reset first"):
                await client.step(DeepResearchAction(text=actions[0]))
            await client.reset(seed=0)
            for action in actions:
                await client.step(DeepResearchAction(text=action))
            with pytest.raises(RuntimeError, match="reset first"):
                await client.step(DeepResearchAction(text=actions[0]))
            return (await client.reset(seed=0)).observation.text  # the session goes on

    assert asyncio.run(remote()) == steps[0][0]


def test_the_serve_env_command_serves_on_a_free_port():
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-m", "trainers.cli", "serve-env", "--port", "0",
                             "--world-size", "100", "--world-seed", "1"],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("serving http://127.0.0.1:"), line
        base = line.split()[1]

        async def remote():
            deadline = time.monotonic() + 60
            while True:
                try:
                    async with DeepResearchClient(base_url=base) as client:
                        return (await client.reset(seed=2)).observation.text
                except (ConnectionError, OSError):
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)

        expected, _ = gym.make("DeepResearch-v0", world_size=100, world_seed=1).reset(seed=2)
        assert asyncio.run(remote()) == expected
    finally:
        proc.terminate()
        proc.wait(20)
