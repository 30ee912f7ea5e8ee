"""DeepResearch-v0 as a `verifiers` (0.4, `verifiers.v1`) environment: taskset, env, harness.

    vf-eval deep-research-v0 --env.taskset.env-kwargs '{"world_size": 2000}' ...
    # or in Python:
    import verifiers.v1 as vf
    env = vf.load_environment(vf.resolve_env_config(
        {"taskset": {"id": "deep-research-v0", "env_kwargs": {"world_size": 2000}}}))

Three pieces, the shape verifiers 0.4 gives a stepping environment (its own OpenEnv
taskset is built the same way):
* `DeepResearchTaskset` yields one task per DeepResearch-v0 task: the question as the
  prompt, the environment's system prompt (tool schemas, turn format) as the system prompt.
* `DeepResearchVfEnv.run` opens the player's interaction and plays the turns through a
  real `DeepResearch-v0` (`gym.make`): each assistant reply is one `env.step`, the next
  observation (tool response, malformed-turn notice or forced-final notice) is the next
  user turn, and the episode ends when the environment terminates or truncates it. So the
  environment's own format checks, turn/context budgets, forced final answer and answer
  scoring decide everything; verifiers only carries the conversation.
* The trace's reward `deep_research` is the sum of the environment's step rewards (the
  answer's score plus the turn-level format penalties), exactly what a Gymnasium loop with
  the same actions gets; metrics `outcome`, `format_penalty`, `env_turns` split it.

Where this deviates from a plain verifiers taskset, and why:
* The player's default harness is `DeepResearchChat`, an in-process chat turn: one model
  call per segment through the rollout's interception endpoint (the contract verifiers'
  `Harness.launch` documents). The built-in `null` harness would do the same through a
  PEP 723 script that `uv` installs at run time, which needs network; this one needs none.
* The default runtime is `subprocess` (nothing runs in it), not a Prime sandbox.
* Plug-in id: verifiers imports a taskset by module name and cannot import a dotted one,
  so the top-level module `deep_research_v0` re-exports these classes for the id
  `deep-research-v0`.
* Rewards are per episode: IGPO's turn-level information gain needs the project's
  trainer (docs/rl.md).

Lives in `envs` (not `trainers`): it needs only the environment, and the layering lets
`envs` import neither trainers nor torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import httpx
import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.runtimes import ProgramResult, SubprocessConfig

import envs  # noqa: F401  (registers DeepResearch-v0)
from envs.deep_research import DeepResearchEnv

ENV_ID = "DeepResearch-v0"


class DeepResearchData(vf.TaskData):
    """One DeepResearch-v0 task; `id` is the environment's task id."""

    answers: list[str] = Field(default_factory=list)
    """The gold answers (scoring side; the player never sees them)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """The `gym.make("DeepResearch-v0", ...)` keywords the episode is played with."""
    env_seed: int = 0
    """The seed passed to the environment's reset."""


class DeepResearchTask(vf.Task[DeepResearchData]):
    """A DeepResearch-v0 task; its reward is recorded by `DeepResearchVfEnv.run`."""


class DeepResearchTasksetConfig(vf.TasksetConfig):
    """Which DeepResearch-v0 tasks to play."""

    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keywords for gym.make("DeepResearch-v0", ...): world, world_size, task_split,
    max_turns, ... (envs.config.DeepResearchConfig lists them)."""
    env_seed: int = 0
    """Seed of each episode's env.reset (the task itself is chosen by id)."""
    limit: int | None = Field(None, ge=1)
    """Yield only the first `limit` tasks (None: all tasks of the split)."""


class DeepResearchTaskset(vf.Taskset[DeepResearchTask, DeepResearchTasksetConfig]):
    """The environment's tasks of the configured world and split, in its order."""

    def load(self) -> Iterator[DeepResearchTask]:
        config = self.config
        env = DeepResearchEnv(**config.env_kwargs)
        try:
            tasks = env.tasks[: config.limit] if config.limit else env.tasks
            for task in tasks:
                yield DeepResearchTask(DeepResearchData(
                    id=task.id, name=task.id, prompt=task.question,
                    system_prompt=env.system_prompt, answers=list(task.answers),
                    env_kwargs=dict(config.env_kwargs), env_seed=config.env_seed),
                    config.task)
        finally:
            env.close()


class DeepResearchChatConfig(vf.HarnessConfig):
    """The in-process chat harness (no settings of its own)."""


class DeepResearchChat(vf.Harness[DeepResearchChatConfig]):
    """One assistant turn per segment: the conversation so far, sent once to the
    rollout's interception endpoint (which records the turn and asks the model)."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: vf.TaskData,
                     tool_interception_url: str | None = None) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages: list[dict] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [message_to_wire(m) for m in prompt or []]
        # No timeout here: the agent's rollout timeout bounds the segment.
        async with httpx.AsyncClient(timeout=None) as http:
            reply = await http.post(f"{endpoint.rstrip('/')}/chat/completions",
                                    json={"model": ctx.model, "messages": messages},
                                    headers={"Authorization": f"Bearer {secret}"})
        if reply.is_success:
            return ProgramResult(exit_code=0, stdout="", stderr="")
        return ProgramResult(exit_code=1, stdout="",
                             stderr=f"model call failed: HTTP {reply.status_code}: "
                                    f"{reply.text[:2000]}")


class DeepResearchEnvConfig(vf.EnvConfig):
    """The player seat; its harness defaults to `DeepResearchChat` (the taskset's)."""

    player: vf.AgentConfig = vf.AgentConfig(runtime=SubprocessConfig())
    """The policy playing DeepResearch-v0 (`--env.player.*`)."""


class DeepResearchVfEnv(vf.Env[DeepResearchEnvConfig]):
    """Plays each task's turns through a real DeepResearch-v0 (see the module header)."""

    async def run(self, task: DeepResearchTask, agents: vf.Agents) -> None:
        data = task.data
        env = gym.make(ENV_ID, **data.env_kwargs)
        total = outcome = penalty = 0.0
        turns, ended = 0, False
        try:
            observation, _ = env.reset(seed=data.env_seed, options={"task_id": data.id})
            if observation != data.prompt:
                raise ValueError(f"task {data.id}: the environment's question differs from "
                                 f"the task's prompt; build tasks with the same env_kwargs")
            async with agents.player.interaction(task) as interaction:
                segment = await interaction.turn()
                while not segment.terminated:
                    observation, reward, terminated, truncated, info = env.step(
                        _reply_text(segment))
                    turns += 1
                    total += reward
                    if info.get("kind") == "answer":
                        outcome = float(info["score"])
                    elif not info.get("valid", True):
                        penalty += reward
                    if terminated or truncated:
                        ended = True
                        break
                    segment = await interaction.turn(observation)
                # False when verifiers stopped the exchange first (its max_turns, a @stop).
                interaction.trace.info["deep_research"] = {"task_id": data.id,
                                                           "episode_ended": ended}
        finally:
            env.close()
        trace = interaction.trace
        trace.record_reward("deep_research", total)
        trace.record_metrics({"outcome": outcome, "format_penalty": penalty,
                              "env_turns": float(turns)})


def _reply_text(segment: vf.Segment) -> str:
    """The segment's last assistant message as sent (verifiers' `last_reply` strips it)."""
    for message in reversed(segment.messages):
        if isinstance(message, vf.AssistantMessage):
            return message.content if isinstance(message.content, str) else segment.last_reply
    return segment.last_reply


__all__ = ["DeepResearchChat", "DeepResearchTaskset", "DeepResearchVfEnv"]
