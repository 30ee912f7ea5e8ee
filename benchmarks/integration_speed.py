"""Oracle episodes through the verifiers and OpenEnv integrations, against the same
episodes in a plain Gymnasium loop in the same run (rough: a 2,000-page synthetic world,
one episode at a time, everything on this machine).

    python benchmarks/integration_speed.py [--episodes 20]

Prints:
    RESULT local_steps_per_s=<float>      gym.make + oracle, in-process (the baseline)
    RESULT openenv_steps_per_s=<float>    the same turns over OpenEnv's WebSocket session
    RESULT verifiers_episodes_per_s=<float>  whole verifiers episodes (taskset, env,
                                             interception, eval client, a 127.0.0.1 model
                                             server replaying the oracle)
    RESULT local_episodes_per_s=<float>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym

import envs  # noqa: F401
from venus_gym.worlds.oracle import OracleAgent

KW = {"world_size": 2000, "world_seed": 0, "max_turns": 16}


def oracle_actions(seed: int) -> tuple[str, list[str]]:
    env = gym.make("DeepResearch-v0", **KW)
    observation, info = env.reset(seed=seed)
    agent, actions = OracleAgent(env.unwrapped.task), []
    while True:
        actions.append(agent.act(observation))
        observation, _, terminated, truncated, _ = env.step(actions[-1])
        if terminated or truncated:
            return info["task_id"], actions


def local(plays):
    env = gym.make("DeepResearch-v0", **KW)
    for seed, (_, actions) in plays.items():
        env.reset(seed=seed)
        for action in actions:
            env.step(action)


def openenv(plays):
    import uvicorn

    from envs.integrations.openenv import DeepResearchAction, DeepResearchClient, bind, make_app

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(make_app(KW), log_level="warning",
                                           ws="websockets-sansio"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)

    async def play():
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with DeepResearchClient(base_url=url) as client:
            await client.reset(seed=0)  # the session's environment is built on first use
            t0 = time.perf_counter()
            for seed, (_, actions) in plays.items():
                await client.reset(seed=seed)
                for action in actions:
                    await client.step(DeepResearchAction(text=action))
            return time.perf_counter() - t0

    elapsed = asyncio.run(play())
    server.should_exit = True
    return elapsed


def verifiers(plays):
    import verifiers.v1 as vf

    replies: dict[str, list[str]] = {tid: list(a) for tid, a in plays.values()}
    current = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            text = current["queue"].pop(0)
            out = json.dumps({"id": "c", "object": "chat.completion", "created": 0,
                              "model": "oracle", "choices": [{
                                  "index": 0, "finish_reason": "stop",
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

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    ctx = vf.ModelContext(model="oracle", client=vf.EvalClientConfig(
        base_url=f"http://127.0.0.1:{http.server_port}/v1", api_key_var="BENCH_KEY"))
    env = vf.load_environment(vf.resolve_env_config(
        {"taskset": {"id": "deep-research-v0", "env_kwargs": KW}}))
    tasks = {t.data.id: t for t in env.taskset}

    async def play():
        async with env.serving():
            t0 = time.perf_counter()
            for task_id, actions in replies.items():
                current["queue"] = list(actions)
                episode = await env.run_episode(tasks[task_id], ctx)
                assert episode.ok, episode.errors
            return time.perf_counter() - t0

    elapsed = asyncio.run(play())
    http.shutdown()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=20)
    args = parser.parse_args()
    plays = {seed: oracle_actions(seed) for seed in range(args.episodes)}
    plays = {s: p for s, p in plays.items()  # one play per task (verifiers plays by task)
             if p[0] not in {q[0] for t, q in plays.items() if t < s}}
    steps = sum(len(a) for _, a in plays.values())
    local(plays)  # warm
    t0 = time.perf_counter()
    local(plays)
    t_local = time.perf_counter() - t0
    t_openenv = openenv(plays)
    t_vf = verifiers(plays)
    print(f"episodes={len(plays)} steps={steps}")
    print(f"RESULT local_steps_per_s={steps / t_local:.1f}")
    print(f"RESULT local_episodes_per_s={len(plays) / t_local:.1f}")
    print(f"RESULT openenv_steps_per_s={steps / t_openenv:.1f}")
    print(f"RESULT openenv_episodes_per_s={len(plays) / t_openenv:.1f}")
    print(f"RESULT verifiers_episodes_per_s={len(plays) / t_vf:.2f}")
    print(f"RESULT verifiers_steps_per_s={steps / t_vf:.1f}")


if __name__ == "__main__":
    main()
