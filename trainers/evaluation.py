"""Evaluate a policy on held-out DeepResearch tasks: one entry point and one result for SFT
and RL evaluation.

    evaluation = evaluate(policy_or_engine, chat, {"world_size": 2000, "world_seed": 0},
                          num_tasks=200, k=1)
    evaluation.summary()   # {"episodes", "tasks", "format_valid_rate", "accuracy", "pass@1",
                           #  "answer_rate", "mean_turns", "cut_turn_rate", ...}

The policy is either
* a `trainers.policy.TransformersPolicy`: each episode is `trainers.policy.run_episode`
  (one conversation at a time, the KV cache kept across turns, optional DR-Venus turn
  retries); task i is reset with seed i; its sampling settings are the policy's own, and
  `seeds` re-seeds its generator for one pass over the tasks per seed; or
* a `trainers.engines` Engine: each task is `trainers.rollout.rollout_group` on a
  `envs.group.DeepResearchGroupEnv` of k members (the training rollouts' code path, the k
  samples in one batch); task i is reset with seed + i.
Both decode with the one sampling rule of trainers.sampling, and every number of the
summary is computed here from the trajectories alone (their turns and the metadata the two
episode runners record: finish reasons and discarded attempts).

Metrics (summary): episodes (trajectories), tasks; per generated turn (retried attempts
included): format_valid_rate, cut_turn_rate (cut by the token cap: repetition loops),
retried_turn_rate; per trajectory: accuracy = pass@1, answer_rate, mean_turns and the rest of
trainers.rl.metrics.trajectory_stats (format_error_rate over the turns sent to the env,
browse ratios, num_correct, mean_tokens); pass@k and k when k > 1; with several seeds each
seed's format_valid_rate and accuracy.

Where we deviate from DR-Venus and why
* pass@k is the share of tasks where at least one of exactly k samples is correct (outcome
  >= 0.5), not the unbiased estimator from n > k samples: with n = k the two coincide, and
  evaluation during training is short.
* pass@1 is the mean outcome over all trajectories (with k > 1 sampled, the expected
  single-sample accuracy). DR-Venus reports pass@1 with a judge; here the outcome is the
  env's reward metric (EM or F1).
* Retries are off by default: evaluation measures the policy as it is (trainers.policy says
  how retries work; engines never retry, as RL rollouts do not).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainers.engines.base import Engine
from trainers.rl.metrics import CORRECT_THRESHOLD, trajectory_stats
from trainers.rollout import SamplingConfig
from trainers.tokenization import ChatTokenizer
from trainers.trajectory import Trajectory


@dataclass
class TurnCounts:
    """Generated turns of one trajectory: sent to the env, valid, cut, retried."""

    turns: int
    valid: int
    cut: int
    retried: int

    @property
    def generated(self) -> int:
        return self.turns + self.retried


def turn_counts(trajectory: Trajectory) -> TurnCounts:
    """Counts from the turns and the metadata both episode runners write: `finish_reasons`
    (one per turn sent; "length" = cut by the token cap) and `discarded_turns` (retried
    attempts, each with its "cut" flag)."""
    discarded = trajectory.metadata.get("discarded_turns", [])
    reasons = trajectory.metadata.get("finish_reasons", [])
    return TurnCounts(turns=len(trajectory.turns),
                      valid=sum(turn.valid for turn in trajectory.turns),
                      cut=reasons.count("length") + sum(bool(d["cut"]) for d in discarded),
                      retried=len(discarded))


@dataclass
class Evaluation:
    """Trajectories of one evaluation.

    per_task: one list of k trajectories per task played (per seed, task by task).
    k:        samples per task.
    seeds:    the seed each entry of per_task was played with.
    """

    per_task: list[list[Trajectory]] = field(default_factory=list)
    k: int = 1
    seeds: list[int | None] = field(default_factory=list)

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for group in self.per_task for t in group]

    def summary(self) -> dict[str, float]:
        """The metrics of the module docstring (one dict)."""
        trajectories = self.trajectories
        if not trajectories:
            raise ValueError("no trajectories to summarise (zero tasks were evaluated)")
        stats = trajectory_stats(trajectories)
        summary: dict[str, Any] = {"episodes": len(trajectories),
                                   "tasks": float(len({t.task_id for t in trajectories})),
                                   **_turn_rates(trajectories)}
        summary.update({key: stats[key] for key in ("accuracy", "answer_rate", "mean_turns")})
        summary["pass@1"] = stats["accuracy"]
        if self.k > 1:
            solved = sum(any(_outcome(t) >= CORRECT_THRESHOLD for t in group)
                         for group in self.per_task)
            summary["pass@k"] = solved / len(self.per_task)
            summary["k"] = float(self.k)
        summary.update(stats)
        seeds = list(dict.fromkeys(self.seeds))
        if len(seeds) > 1:
            for seed in seeds:
                own = [t for group, s in zip(self.per_task, self.seeds) if s == seed
                       for t in group]
                summary[f"format_valid_rate_seed{seed}"] = _turn_rates(own)["format_valid_rate"]
                summary[f"accuracy_seed{seed}"] = sum(map(_outcome, own)) / len(own)
        return summary


def _turn_rates(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    counts = [turn_counts(t) for t in trajectories]
    generated = sum(c.generated for c in counts)

    def share(count: int) -> float:
        return count / generated if generated else 0.0

    return {"format_valid_rate": share(sum(c.valid for c in counts)),
            "cut_turn_rate": share(sum(c.cut for c in counts)),
            "retried_turn_rate": share(sum(c.retried for c in counts))}


def evaluate(policy: Any, chat: ChatTokenizer, env_kwargs: dict[str, Any], *,
             num_tasks: int = 0, task_split: str = "test", k: int = 1,
             seeds: Sequence[int] | None = None, sampling: SamplingConfig | None = None,
             max_retries: int = 0, max_context_tokens: int = 32_768,
             progress: bool = False) -> Evaluation:
    """Play the first `num_tasks` tasks of `task_split` (0 = all) k times each, per seed.

    Args:
        policy: a trainers.policy.TransformersPolicy or a trainers.engines Engine (its
            current weights are evaluated).
        chat: the policy's ChatTokenizer.
        env_kwargs: DeepResearch-v0 keywords (world, budgets, token_counter, ...); their
            "task_split" is replaced by `task_split`. With an engine, pass
            token_counter=trainers.rollout.text_token_counter(chat) for exact env budgets.
        num_tasks: how many tasks, from the start of the split's list; 0 = the whole split.
            More than the split holds plays the whole split, with a warning.
        task_split: "test", "train" or "all" (envs.config).
        k: samples per task.
        seeds: one pass over the tasks per seed. Policy: its generator is re-seeded with
            each (None = one pass with the generator as it is). Engine: task i's group is
            reset with seed + i and seeds the sampling (None = seed 0).
        sampling: engine only: per-turn sampling; default greedy for k = 1, else temperature
            1.0 seeded with the seed (greedy k > 1 samples would all be the same episode).
            A policy samples with its own settings.
        max_retries: policy only: DR-Venus turn retries (trainers.policy.run_episode).
        max_context_tokens: engine only: the rollout's hard cap on an episode's ids.
        progress: show a tqdm bar over tasks.

    Raises:
        ValueError: k < 1, num_tasks < 0, env_kwargs naming group_size, or an argument the
            kind of policy does not take.
    """
    from trainers.policy import TransformersPolicy

    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if not isinstance(num_tasks, int) or num_tasks < 0:
        raise ValueError(f"num_tasks must be an int >= 0 (0 = all), got {num_tasks!r}")
    if "group_size" in env_kwargs:
        raise ValueError("env_kwargs must not set group_size; evaluate uses k")
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    env_kwargs = {**env_kwargs, "task_split": task_split}
    result = Evaluation(k=k)
    if isinstance(policy, TransformersPolicy):
        if sampling is not None:
            raise ValueError("sampling is for engines; a TransformersPolicy samples with its "
                             "own temperature / top_p / top_k")
        for seed in (None,) if seeds is None else seeds:
            if seed is not None:
                policy.generator.manual_seed(seed)
            _play_policy(policy, env_kwargs, num_tasks, k, max_retries, progress, result, seed)
    elif isinstance(policy, Engine):
        if max_retries:
            raise ValueError("max_retries needs a TransformersPolicy: engine rollouts never "
                             "retry (trainers.rollout)")
        for seed in (0,) if seeds is None else seeds:
            _play_engine(policy, chat, env_kwargs, num_tasks, k, seed, sampling,
                         max_context_tokens, progress, result)
    else:
        raise TypeError(f"policy must be a TransformersPolicy or an Engine, got "
                        f"{type(policy).__name__}")
    return result


def _task_count(available: int, num_tasks: int, task_split: str) -> int:
    if num_tasks > available:
        warnings.warn(f"num_tasks={num_tasks} but split {task_split!r} has only {available} "
                      f"tasks; evaluating all of them", RuntimeWarning, stacklevel=3)
    return available if num_tasks == 0 else min(num_tasks, available)


def _tasks(count: int, task_split: str, progress: bool) -> Any:
    if not progress:
        return range(count)
    from tqdm.auto import tqdm

    return tqdm(range(count), desc=f"evaluating on {task_split}", unit="task",
                dynamic_ncols=True)


def _play_policy(policy: Any, env_kwargs: dict[str, Any], num_tasks: int, k: int,
                 max_retries: int, progress: bool, result: Evaluation,
                 seed: int | None) -> None:
    import gymnasium as gym

    from trainers.policy import run_episode

    split = env_kwargs["task_split"]
    env = gym.make("envs:DeepResearch-v0", **env_kwargs)  # "envs:" registers the ids
    try:
        count = _task_count(len(env.unwrapped.tasks), num_tasks, split)
        for index in _tasks(count, split, progress):
            group = []
            for member in range(k):
                suffix = f"/{member}" if k > 1 else ""
                trajectory, _ = run_episode(env, policy, task_index=index, seed=index,
                                            trajectory_id=f"eval-{split}-{index:05d}{suffix}",
                                            max_retries=max_retries)
                group.append(trajectory)
            result.per_task.append(group)
            result.seeds.append(seed)
    finally:
        env.close()


def _play_engine(engine: Engine, chat: ChatTokenizer, env_kwargs: dict[str, Any],
                 num_tasks: int, k: int, seed: int, sampling: SamplingConfig | None,
                 max_context_tokens: int, progress: bool, result: Evaluation) -> None:
    from envs.group import DeepResearchGroupEnv
    from trainers.rollout import rollout_group

    if sampling is None:
        sampling = (SamplingConfig(temperature=0.0) if k == 1
                    else SamplingConfig(temperature=1.0, seed=seed))
    elif k > 1 and sampling.temperature == 0.0:
        warnings.warn(f"k={k} with greedy sampling: the k samples are identical, so pass@k "
                      "equals pass@1", RuntimeWarning, stacklevel=3)
    elif k > 1 and sampling.seed is None:
        # Unseeded sampling is fine statistically but not reproducible; seed it.
        sampling = dataclasses.replace(sampling, seed=seed)
    split = env_kwargs["task_split"]
    group = DeepResearchGroupEnv(group_size=k, **env_kwargs)
    try:
        count = _task_count(len(group.tasks), num_tasks, split)
        for i in _tasks(count, split, progress):
            result.per_task.append(rollout_group(
                engine, group, chat, seed=seed + i, options={"task_index": i},
                sampling=sampling, max_context_tokens=max_context_tokens))
            result.seeds.append(seed)
    finally:
        group.close()


def _outcome(trajectory: Trajectory) -> float:
    return 0.0 if trajectory.outcome is None else float(trajectory.outcome)


__all__ = ["Evaluation", "TurnCounts", "evaluate", "turn_counts"]
