"""Evaluate a generation engine on a split of DeepResearch tasks: pass@1, pass@k, and the
episode statistics of trainers.rl.metrics.

    result = evaluate_engine(engine, chat, {"world_size": 2000, "world_seed": 0},
                             num_tasks=200, k=4)
    result.summary()   # {"pass@1", "pass@k", "k", "accuracy", "browse_ratio", ..., "tasks"}

Each task is played with `trainers.rollout.rollout_group` on a
`envs.group.DeepResearchGroupEnv` of k members, so evaluation runs exactly the code path of
training rollouts (token in / token out, the same budgets and forced final turn).

Where we deviate from DR-Venus and why
* pass@k is the share of tasks where at least one of exactly k samples is correct (outcome
  >= 0.5), not the unbiased estimator from n > k samples: with n = k the two coincide, and
  evaluation during training is short.
* pass@1 is the mean outcome over all k * tasks trajectories (with k > 1 sampled at
  temperature 1.0, the expected single-sample accuracy; with k = 1 greedy decoding). DR-Venus
  reports pass@1 with a judge; here the outcome is the env's reward metric (EM or F1).
* No retries on empty / repetitive turns (REFERENCE.md section 1): the policy is measured
  as it is.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

from envs.group import DeepResearchGroupEnv
from trainers.engines.base import Engine
from trainers.rl.metrics import CORRECT_THRESHOLD, trajectory_stats
from trainers.rollout import SamplingConfig, rollout_group
from trainers.tokenization import ChatTokenizer
from trainers.trajectory import Trajectory


@dataclass
class EvalResult:
    """Trajectories of one evaluation.

    trajectories: all of them, task by task (member order within a task).
    per_task:     one list of k trajectories per task, in task order.
    k:            samples per task.
    """

    trajectories: list[Trajectory] = field(default_factory=list)
    per_task: list[list[Trajectory]] = field(default_factory=list)
    k: int = 1

    def summary(self) -> dict[str, float]:
        """pass@1 (mean outcome over all trajectories, None counted 0), pass@k and k (only
        when k > 1: share of tasks where any of the k trajectories has outcome >= 0.5),
        every number of trajectory_stats, and tasks (how many were played)."""
        if not self.trajectories:
            raise ValueError("no trajectories to summarise (zero tasks were evaluated)")
        stats = trajectory_stats(self.trajectories)
        summary: dict[str, float] = {"pass@1": stats["accuracy"]}
        if self.k > 1:
            solved = sum(any(_outcome(t) >= CORRECT_THRESHOLD for t in group)
                         for group in self.per_task)
            summary["pass@k"] = solved / len(self.per_task)
            summary["k"] = float(self.k)
        summary.update(stats)
        summary["tasks"] = float(len(self.per_task))
        return summary


def evaluate_engine(engine: Engine, chat: ChatTokenizer, env_kwargs: dict[str, Any], *,
                    num_tasks: int = 0, task_split: str = "test", k: int = 1,
                    sampling: SamplingConfig | None = None, max_context_tokens: int = 32_768,
                    seed: int = 0, progress: bool = False) -> EvalResult:
    """Play the first `num_tasks` tasks of `task_split` (0 = all) k times each.

    Args:
        engine: any trainers.engines Engine (its current weights are evaluated).
        chat: the policy's ChatTokenizer.
        env_kwargs: DeepResearchEnv keywords (world, budgets, token_counter, ...), e.g. the
            training env's; their "task_split" is replaced by `task_split`. Pass
            token_counter=trainers.rollout.text_token_counter(chat) for exact env budgets
            (trainers.rollout explains why).
        num_tasks: how many tasks, from the start of the split's list; 0 = the whole split.
            More than the split holds plays the whole split, with a warning.
        task_split: "test", "train" or "all" (envs.config).
        k: samples per task (the group size).
        sampling: per-turn sampling; default greedy for k = 1, else temperature 1.0 seeded
            with `seed` (greedy k > 1 samples would all be the same episode).
        max_context_tokens: the rollout's hard cap on an episode's ids.
        seed: task i's group is reset with seed + i (member seeds, tool randomness).
        progress: show a tqdm bar over tasks.

    Raises:
        ValueError: k < 1, num_tasks < 0, or env_kwargs naming group_size.
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if not isinstance(num_tasks, int) or num_tasks < 0:
        raise ValueError(f"num_tasks must be an int >= 0 (0 = all), got {num_tasks!r}")
    if "group_size" in env_kwargs:
        raise ValueError("env_kwargs must not set group_size; evaluate_engine uses k")
    if sampling is None:
        sampling = (SamplingConfig(temperature=0.0) if k == 1
                    else SamplingConfig(temperature=1.0, seed=seed))
    elif k > 1 and sampling.temperature == 0.0:
        warnings.warn(f"k={k} with greedy sampling: the k samples are identical, so pass@k "
                      "equals pass@1", RuntimeWarning, stacklevel=2)
    elif k > 1 and sampling.seed is None:
        # Unseeded sampling is fine statistically but not reproducible; seed it.
        sampling = dataclasses.replace(sampling, seed=seed)

    group = DeepResearchGroupEnv(group_size=k, **{**env_kwargs, "task_split": task_split})
    try:
        available = len(group.tasks)
        count = available if num_tasks == 0 else min(num_tasks, available)
        if num_tasks > available:
            warnings.warn(f"num_tasks={num_tasks} but split {task_split!r} has only "
                          f"{available} tasks; evaluating all of them", RuntimeWarning,
                          stacklevel=2)
        indices: Any = range(count)
        if progress:
            from tqdm.auto import tqdm

            indices = tqdm(indices, desc=f"eval {task_split}", unit="task",
                           dynamic_ncols=True)
        result = EvalResult(k=k)
        for i in indices:
            trajectories = rollout_group(engine, group, chat, seed=seed + i,
                                         options={"task_index": i}, sampling=sampling,
                                         max_context_tokens=max_context_tokens)
            result.per_task.append(trajectories)
            result.trajectories.extend(trajectories)
    finally:
        group.close()
    return result


def _outcome(trajectory: Trajectory) -> float:
    return 0.0 if trajectory.outcome is None else float(trajectory.outcome)


__all__ = ["EvalResult", "evaluate_engine"]
