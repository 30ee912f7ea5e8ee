"""A group of G DeepResearch environments reset to the same task, stepped as a batch.

Group-normalised RL (GRPO, IGPO) samples G rollouts of one query and compares them. This
is not a Gymnasium VectorEnv on purpose: a vector env auto-resets each copy to an
independent episode, while a group must stay on one task until every member is done,
and finished members simply stop taking actions.

All members share one world, one search index and one tool stack. With
`num_threads > 1` the members' tool calls run concurrently (useful for remote backends:
a retrieval server, an LLM summarizer, the live web); the local default is fast enough
that threads only add overhead.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .deep_research import DeepResearchEnv


class DeepResearchGroupEnv:
    """G copies of DeepResearch-v0 on one task.

    reset(seed, options) -> (observations: list[str], infos: list[dict])
    step(actions)        -> (observations, rewards, terminated, truncated, infos), each a
                            list of length G. `actions[i]` must be a str for members still
                            running and None for finished ones; finished members return
                            ("", 0.0, their final terminated/truncated flags, {}).
    """

    def __init__(self, group_size: int = 8, num_threads: int = 1, **env_kwargs: Any):
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        first = DeepResearchEnv(**env_kwargs)
        self.envs = [first] + [DeepResearchEnv(toolbox=first.toolbox, **env_kwargs)
                               for _ in range(group_size - 1)]
        self.group_size = group_size
        self.tasks = first.tasks
        self.system_prompt = first.system_prompt
        self._pool = ThreadPoolExecutor(num_threads) if num_threads > 1 else None
        self._rng = np.random.default_rng()
        self.terminated = [True] * group_size
        self.truncated = [True] * group_size

    @property
    def done(self) -> list[bool]:
        return [a or b for a, b in zip(self.terminated, self.truncated)]

    @property
    def all_done(self) -> bool:
        return all(self.done)

    @property
    def task(self):
        return self.envs[0].task

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[list[str], list[dict[str, Any]]]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        options = dict(options or {})
        if "task_id" not in options and "task_index" not in options:
            options["task_index"] = int(self._rng.integers(len(self.tasks)))
        member_seeds = self._rng.integers(2**31, size=self.group_size)
        obs, infos = [], []
        for env, s in zip(self.envs, member_seeds):
            o, i = env.reset(seed=int(s), options=options)
            obs.append(o)
            infos.append(i)
        self.terminated = [False] * self.group_size
        self.truncated = [False] * self.group_size
        return obs, infos

    def step(self, actions: Sequence[str | None]):
        if len(actions) != self.group_size:
            raise ValueError(f"expected {self.group_size} actions, got {len(actions)}")
        for i, (a, d) in enumerate(zip(actions, self.done)):
            if d and a is not None:
                raise ValueError(f"member {i} has finished its episode: pass None as its "
                                 f"action (or reset the group)")
            if not d and not isinstance(a, str):
                raise TypeError(f"member {i} is still running and needs an action (str), "
                                f"got {type(a).__name__}")
        live = [i for i, d in enumerate(self.done) if not d]
        if self._pool is not None and len(live) > 1:
            results = list(self._pool.map(lambda i: self.envs[i].step(actions[i]), live))
        else:
            results = [self.envs[i].step(actions[i]) for i in live]
        out_obs = [""] * self.group_size
        out_rew = [0.0] * self.group_size
        out_info: list[dict[str, Any]] = [{} for _ in range(self.group_size)]
        for i, (o, r, term, trunc, info) in zip(live, results):
            out_obs[i], out_rew[i], out_info[i] = o, r, info
            self.terminated[i], self.truncated[i] = term, trunc
        return out_obs, out_rew, list(self.terminated), list(self.truncated), out_info

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        for env in self.envs:
            env.close()
