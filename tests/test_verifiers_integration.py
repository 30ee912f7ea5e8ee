"""DeepResearch-v0 as a verifiers 0.4 environment (envs.integrations.verifiers): whole
episodes through verifiers' own rollout machinery (taskset, env, interaction, interception
server, eval client) against a local OpenAI-compatible server on 127.0.0.1 that answers
with scripted turns; the reward verifiers records must be what the environment gives for
the same turns."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest

pytest.importorskip("verifiers.v1")
import verifiers.v1 as vf  # noqa: E402

import envs  # noqa: E402,F401
from venus_gym.worlds.oracle import OracleAgent  # noqa: E402

KW = {"world_size": 100, "world_seed": 1, "max_turns": 6}
pytestmark = pytest.mark.slow
MALFORMED = "I think the answer is somewhere, but I will not use the format."


class ScriptedModel:
    """An OpenAI-compatible chat endpoint; `policy(messages) -> text` writes each reply."""

    def __init__(self):
        self.policy = None
        self.requests: list[dict] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                model.requests.append(body)
                text = model.policy(body["messages"])
                out = json.dumps({
                    "id": f"c{len(model.requests)}", "object": "chat.completion",
                    "created": int(time.time()), "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                              "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def context(self) -> vf.ModelContext:
        return vf.ModelContext(model="scripted", client=vf.EvalClientConfig(
            base_url=f"http://127.0.0.1:{self.server.server_port}/v1",
            api_key_var="VENUS_GYM_TEST_KEY"))


@pytest.fixture(scope="module")
def model():
    server = ScriptedModel()
    yield server
    server.server.shutdown()
    server.server.server_close()


def play(model, policy, task_index=0):
    """One verifiers episode of the taskset's task `task_index`: (task, episode)."""
    config = vf.resolve_env_config({"taskset": {"id": "deep-research-v0", "env_kwargs": KW,
                                                "limit": task_index + 1}})
    env = vf.load_environment(config)
    task = list(env.taskset)[task_index]
    model.policy, model.requests[:] = policy, []

    async def run():
        async with env.serving():
            return await env.run_episode(task, model.context)

    return task, asyncio.run(run())


def replay(task_id, actions):
    """The same turns in a plain Gymnasium loop: (observations after each turn, rewards)."""
    env = gym.make("DeepResearch-v0", **KW)
    observation, _ = env.reset(seed=0, options={"task_id": task_id})
    observations, rewards = [observation], []
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(action)
        observations.append(observation)
        rewards.append(reward)
        if terminated or truncated:
            break
    env.close()
    return observations, rewards


def oracle_for(task_id):
    env = gym.make("DeepResearch-v0", **KW)
    env.reset(seed=0, options={"task_id": task_id})
    return OracleAgent(env.unwrapped.task), env.unwrapped.system_prompt


def test_the_taskset_is_the_environments_tasks_with_its_system_prompt():
    taskset = vf.load_taskset(vf.resolve_env_config(
        {"taskset": {"id": "deep-research-v0", "env_kwargs": KW}}).taskset)
    env = gym.make("DeepResearch-v0", **KW).unwrapped
    tasks = list(taskset)
    assert [t.data.id for t in tasks] == [t.id for t in env.tasks]
    assert [t.data.prompt for t in tasks] == [t.question for t in env.tasks]
    assert {t.data.system_prompt for t in tasks} == {env.system_prompt}


def first_task_id():
    taskset = vf.load_taskset(vf.resolve_env_config(
        {"taskset": {"id": "deep-research-v0", "env_kwargs": KW}}).taskset)
    return next(iter(taskset)).data.id


def test_an_oracle_episode_scores_what_the_environment_scores(model):
    task_id = first_task_id()
    oracle, system_prompt = oracle_for(task_id)
    replies: list[str] = []

    def policy(messages):
        replies.append(oracle.act(messages[-1]["content"]))
        return replies[-1]

    task, episode = play(model, policy)
    assert episode.ok and not episode.errors, episode.errors
    (trace,) = episode.traces
    observations, rewards = replay(task_id, replies)
    assert rewards[-1] == 1.0 and len(replies) >= 3  # the oracle searched, read, answered
    assert trace.rewards["deep_research"].score == pytest.approx(sum(rewards))
    assert trace.reward == pytest.approx(sum(rewards))
    assert trace.metrics["outcome"] == 1.0 and trace.metrics["format_penalty"] == 0.0
    assert trace.metrics["env_turns"] == len(replies)
    assert trace.info["deep_research"]["episode_ended"]
    # What the model was shown, turn by turn, is what the environment returned, and the
    # conversation it was sent is the episode's transcript so far.
    first = model.requests[0]["messages"]
    assert first[0] == {"role": "system", "content": system_prompt}
    assert first[1]["content"] == task.data.prompt == observations[0]
    assert [r["messages"][-1]["content"] for r in model.requests] == \
        observations[:len(replies)]
    last = model.requests[-1]["messages"]
    assert [m["content"] for m in last if m["role"] == "assistant"] == replies[:-1]


def test_a_malformed_turn_is_penalised_as_the_environment_penalises_it(model):
    task_id = first_task_id()
    oracle, _ = oracle_for(task_id)
    replies: list[str] = []

    def policy(messages):
        # Turn 2 is malformed; the oracle plays the rest from the observations it sees.
        text = MALFORMED if len(replies) == 1 else oracle.act(messages[-1]["content"])
        replies.append(text)
        return text

    _, episode = play(model, policy)
    (trace,) = episode.traces
    observations, rewards = replay(task_id, replies)
    assert rewards[1] == -1.0 and "<tool_response>" in observations[2]  # the env's notice
    assert [r["messages"][-1]["content"] for r in model.requests][2] == observations[2]
    assert trace.reward == pytest.approx(sum(rewards))
    assert trace.metrics["format_penalty"] == -1.0
    assert trace.metrics["outcome"] == rewards[-1]
