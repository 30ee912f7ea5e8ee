"""DeepResearch-v0 behind OpenEnv's server protocol (`openenv-core` 0.3), and its client.

    venus-gym serve-env --host 127.0.0.1 --port 8000 --world synthetic --world-size 2000

    from envs.integrations.openenv import DeepResearchClient, DeepResearchAction
    async with DeepResearchClient(base_url="http://127.0.0.1:8000") as client:
        result = await client.reset(seed=0, task_id="venus-s0-2h-00000")
        result = await client.step(DeepResearchAction(text="<think>..</think><tool_call>.."))
    # synchronous: with DeepResearchClient(base_url=...).sync() as client: ...

The server is openenv-core's own (`create_app`): `WS /ws` sessions (reset / step / state
messages, one environment per session) plus `POST /reset`, `POST /step`, `GET /state`,
`GET /schema`, `GET /health`, so any OpenEnv client (its `GenericEnvClient`, verifiers'
OpenEnv taskset, TRL's OpenEnv examples) can play DeepResearch-v0 remotely. A bad message
(invalid JSON, JSON that is not an object, JSON nested too deeply, a binary frame, an action
that is not `{"text": str}`, a step before reset or after the end) is answered with
OpenEnv's error reply (`{"type": "error", "data": {"code", ...}}`) and the session stays
open: `openenv_guard.SessionGuard` checks each frame before openenv-core's handler, which
would close the session on the non-objects, the deep nesting and binary frames. A session
silent for `idle_timeout_s` is closed. `bind` listens before it returns, so a client may
connect as soon as the caller says where.

Typed models: `DeepResearchAction(text)` is one assistant turn;
`DeepResearchObservation` carries the environment's observation `text`, its `info` dict
(made JSON-safe), `terminated` / `truncated`, and OpenEnv's `reward` / `done`
(done = terminated or truncated); `DeepResearchState` the episode's task, turn and budget.
Each session's environment is `gym.make("DeepResearch-v0", **env_kwargs)`, so format
checks, budgets and scoring are the environment's, and a seed gives the same episode as a
local `gym.make`. Reset keywords besides `seed` / `episode_id` (`task_id`, `task_index`,
`question`, `answer`) become the environment's reset options.

Deviation from OpenEnv's templates: no Docker image or `openenv.yaml` package; the server
runs in-process from the `venus-gym` command (Docker is a deployment choice here). Lives in
`envs` (it needs only the environment; the layering keeps trainers out).
"""

from __future__ import annotations

import json
import socket
from typing import Any

import gymnasium as gym
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

import envs  # noqa: F401  (registers DeepResearch-v0)
from envs.integrations.openenv_guard import SessionGuard
from venus_gym.tools.serving import DEFAULT_BACKLOG, check_backlog

ENV_ID = "DeepResearch-v0"
RESET_OPTIONS = ("task_id", "task_index", "question", "answer")


class DeepResearchAction(Action):
    """One assistant turn in the DR-Venus format (think, then a tool call or an answer)."""

    text: str = Field(..., description="The assistant turn, exactly as generated")


class DeepResearchObservation(Observation):
    """What DeepResearch-v0 returned for a reset or a step."""

    text: str = Field("", description="The observation: the question after reset, then "
                                      "tool responses / notices; empty after the end")
    info: dict[str, Any] = Field(default_factory=dict,
                                 description="The environment's info dict (JSON-safe)")
    terminated: bool = Field(False, description="A well-formed answer ended the episode")
    truncated: bool = Field(False, description="A budget ended the episode")


class DeepResearchState(State):
    """The session's episode: OpenEnv's episode_id and step_count plus the task."""

    task_id: str | None = Field(None, description="The task being played")
    tokens_used: int = Field(0, description="Context tokens used so far")
    done: bool = Field(True, description="No episode is running (ended or never reset)")


class DeepResearchOpenEnv(Environment[DeepResearchAction, DeepResearchObservation,
                                      DeepResearchState]):
    """One DeepResearch-v0 per OpenEnv session."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session owns its gym env; no shared state

    def __init__(self, **env_kwargs: Any):
        super().__init__()
        self.env = gym.make(ENV_ID, **env_kwargs)
        self._state = DeepResearchState()

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> DeepResearchObservation:
        unknown = sorted(set(kwargs) - set(RESET_OPTIONS))
        if unknown:
            raise ValueError(f"unknown reset arguments {unknown}; DeepResearch-v0 takes seed, "
                             f"episode_id and {', '.join(RESET_OPTIONS)}")
        options = {k: v for k, v in kwargs.items() if v is not None}
        text, info = self.env.reset(seed=seed, options=options or None)
        self._state = DeepResearchState(episode_id=episode_id, step_count=0,
                                        task_id=info["task_id"],
                                        tokens_used=info["tokens_used"], done=False)
        return DeepResearchObservation(text=text, info=_json_safe(info), reward=None,
                                       done=False)

    def step(self, action: DeepResearchAction, timeout_s: float | None = None,
             **kwargs: Any) -> DeepResearchObservation:
        if self._state.done:
            raise RuntimeError("no episode is running: reset first (the last one ended, "
                               "or this connection never reset)")
        text, reward, terminated, truncated, info = self.env.step(action.text)
        done = bool(terminated or truncated)
        self._state.step_count += 1
        self._state.tokens_used = info["tokens_used"]
        self._state.done = done
        return DeepResearchObservation(text=text, info=_json_safe(info), reward=float(reward),
                                       done=done, terminated=bool(terminated),
                                       truncated=bool(truncated))

    @property
    def state(self) -> DeepResearchState:
        return self._state

    def close(self) -> None:
        self.env.close()


def _json_safe(info: dict[str, Any]) -> dict[str, Any]:
    # Info holds tuples and, for the web backend, nested stats: one JSON round trip gives
    # the dict the client will see. The raw action is left out: the client sent it, and a
    # lone surrogate in it would make the reply unencodable.
    return json.loads(json.dumps({k: v for k, v in info.items() if k != "raw_action"},
                                 default=str))


class DeepResearchClient(EnvClient[DeepResearchAction, DeepResearchObservation,
                                   DeepResearchState]):
    """OpenEnv client for a DeepResearch-v0 server (a WebSocket session)."""

    def _step_payload(self, action: DeepResearchAction) -> dict[str, Any]:
        return {"text": action.text, "metadata": action.metadata}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[DeepResearchObservation]:
        observation = DeepResearchObservation(**{**payload.get("observation", {}),
                                                 "reward": payload.get("reward"),
                                                 "done": payload.get("done", False)})
        return StepResult(observation=observation, reward=payload.get("reward"),
                          done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> DeepResearchState:
        return DeepResearchState(**payload)


def make_app(env_kwargs: dict[str, Any] | None = None, max_sessions: int = 8,
             idle_timeout_s: float | None = None) -> Any:
    """The FastAPI app serving DeepResearch-v0 with `env_kwargs` (openenv's create_app),
    its `/ws` sessions behind `SessionGuard` (malformed frames answered, sessions silent
    for `idle_timeout_s` closed; None = never)."""
    kwargs = dict(env_kwargs or {})
    DeepResearchOpenEnv(**kwargs).close()  # a bad argument fails here, not per session

    def factory() -> DeepResearchOpenEnv:
        return DeepResearchOpenEnv(**kwargs)

    factory.SUPPORTS_CONCURRENT_SESSIONS = True  # read by create_app for a factory
    app = create_app(factory, DeepResearchAction, DeepResearchObservation,
                     env_name="deep_research", max_concurrent_envs=max_sessions)
    app.add_middleware(SessionGuard, idle_timeout_s=idle_timeout_s)
    return app


def bind(host: str, port: int, backlog: int = DEFAULT_BACKLOG) -> socket.socket:
    """A socket listening on host:port (port 0: any free port) with `backlog` queued
    connections. It listens before it is returned, so connections made as soon as the
    caller prints the address wait in the queue until the server accepts them."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(check_backlog(backlog))
    return sock


def serve(app: Any, sock: socket.socket, log_level: str = "warning",
          backlog: int = DEFAULT_BACKLOG) -> None:
    """Serve `app` on `sock` until interrupted (uvicorn, one process)."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, ws="websockets-sansio",
                                           backlog=check_backlog(backlog)))
    server.run(sockets=[sock])
