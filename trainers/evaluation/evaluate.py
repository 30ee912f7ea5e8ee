"""Evaluate a policy on held-out DeepResearch tasks: one entry point and one result for SFT
and RL evaluation.

    evaluation = evaluate(engine, chat, {"world_size": 2000, "world_seed": 0},
                          num_tasks=200, k=1)
    evaluation.summary()   # {"episodes", "tasks", "format_valid_rate", "accuracy", "pass@1",
                           #  "answer_rate", "mean_turns", "cut_turn_rate", ...}

The policy is a `trainers.engines` Engine (a local model: `HFEngine(model, tokenizer)`;
a served one: the OpenAI-compatible client). Each task is `trainers.rollout.rollout_group`
on a `envs.group.DeepResearchGroupEnv` of k members: the training rollouts' episode runner,
the k samples in one batch; task i is reset with seed + i. Every number of the summary is
computed here from the trajectories alone (their turns and the metadata the episode runner
records: finish reasons and discarded attempts).

Metrics (summary): episodes (trajectories), tasks; per generated turn (retried attempts
included): format_valid_rate, cut_turn_rate (cut by the token cap: repetition loops),
retried_turn_rate; per trajectory: accuracy = pass@1, answer_rate, mean_turns and the rest of
trainers.evaluation.metrics.trajectory_stats (format_error_rate over the turns sent to the
env, browse ratios, num_correct, mean_tokens); pass@k and k when k > 1; with several seeds
each seed's format_valid_rate and accuracy.

Where we deviate from DR-Venus and why
* pass@k is the share of tasks where at least one of exactly k samples is correct (outcome
  >= 0.5), not the unbiased estimator from n > k samples: with n = k the two coincide, and
  evaluation during training is short.
* pass@1 is the mean outcome over all trajectories (with k > 1 sampled, the expected
  single-sample accuracy). DR-Venus reports pass@1 with a judge; here the outcome is the
  env's reward metric (EM or F1).
* Retries are off by default: evaluation measures the policy as it is (trainers.rollout says
  how retries work; RL rollouts never retry).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainers.engines.base import Engine
from trainers.evaluation.metrics import is_correct, outcome, trajectory_stats
from trainers.modeling.tokenization import ChatTokenizer
from trainers.rollout import SamplingConfig
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
            solved = sum(any(map(is_correct, group))
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
                summary[f"accuracy_seed{seed}"] = sum(map(outcome, own)) / len(own)
        return summary


def _turn_rates(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    counts = [turn_counts(t) for t in trajectories]
    generated = sum(c.generated for c in counts)

    def share(count: int) -> float:
        return count / generated if generated else 0.0

    return {"format_valid_rate": share(sum(c.valid for c in counts)),
            "cut_turn_rate": share(sum(c.cut for c in counts)),
            "retried_turn_rate": share(sum(c.retried for c in counts))}


def evaluate(engine: Engine, chat: ChatTokenizer, env_kwargs: dict[str, Any], *,
             num_tasks: int = 0, task_split: str = "test", k: int = 1,
             seeds: Sequence[int] | None = None, sampling: SamplingConfig | None = None,
             max_retries: int = 0, max_context_tokens: int = 32_768,
             progress: bool = False, task_indices: Sequence[int] | None = None,
             on_task: OnTask | None = None) -> Evaluation:
    """Play the first `num_tasks` tasks of `task_split` (0 = all) k times each, per seed.

    Args:
        engine: a trainers.engines Engine (its current weights are evaluated).
        chat: the policy's ChatTokenizer.
        env_kwargs: DeepResearch-v0 keywords (world, budgets, token_counter, ...); their
            "task_split" is replaced by `task_split`. Pass
            token_counter=trainers.rollout.text_token_counter(chat) for exact env budgets.
        num_tasks: how many tasks, from the start of the split's list; 0 = the whole split.
            More than the split holds plays the whole split, with a warning.
        task_split: "test", "train" or "all" (envs.config).
        k: samples per task.
        seeds: one pass over the tasks per seed (None = seed 0): task i's group is reset
            with seed + i, and a sampled pass whose `sampling` has no seed of its own is
            seeded with it.
        sampling: per-turn sampling; default greedy for k = 1, else temperature 1.0 (greedy
            k > 1 samples would all be the same episode).
        max_retries: DR-Venus turn retries (trainers.rollout); 0 = the policy as it is.
        max_context_tokens: the rollout's hard cap on an episode's ids.
        progress: show a tqdm bar over tasks.
        task_indices: play exactly these tasks of the split (indices into its list) instead
            of the first `num_tasks` (which must then be 0); e.g. the tasks a resumed
            evaluation has not finished.
        on_task: called after each task with (task index, its k trajectories, wall seconds),
            e.g. to append them to a results file as they finish.

    Raises:
        ValueError: k < 1, num_tasks < 0, max_retries < 0 or env_kwargs naming group_size.
        TypeError: `engine` is not an Engine.
    """
    if not isinstance(engine, Engine):
        raise TypeError(f"evaluate plays an Engine (e.g. trainers.engines.hf.HFEngine(model, "
                        f"tokenizer)), got {type(engine).__name__}")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if not isinstance(num_tasks, int) or num_tasks < 0:
        raise ValueError(f"num_tasks must be an int >= 0 (0 = all), got {num_tasks!r}")
    if "group_size" in env_kwargs:
        raise ValueError("env_kwargs must not set group_size; evaluate uses k")
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    if task_indices is not None:
        if num_tasks:
            raise ValueError("give num_tasks or task_indices, not both")
        task_indices = [int(i) for i in task_indices]
        if any(i < 0 for i in task_indices):
            raise ValueError(f"task_indices must be >= 0, got {task_indices}")
    plan = _Plan(num_tasks, task_indices, on_task)
    env_kwargs = {**env_kwargs, "task_split": task_split}
    result = Evaluation(k=k)
    for seed in (0,) if seeds is None else seeds:
        _play(engine, chat, env_kwargs, plan, k, seed, sampling, max_retries,
              max_context_tokens, progress, result)
    return result


OnTask = Callable[[int, list[Trajectory], float], None]


@dataclass
class _Plan:
    """Which tasks to play and what to do after each."""

    num_tasks: int
    task_indices: list[int] | None
    on_task: OnTask | None

    def indices(self, available: int, task_split: str) -> list[int]:
        if self.task_indices is not None:
            beyond = [i for i in self.task_indices if i >= available]
            if beyond:
                raise ValueError(f"task_indices {beyond} are beyond split {task_split!r}, "
                                 f"which has {available} tasks")
            return list(self.task_indices)
        return list(range(_task_count(available, self.num_tasks, task_split)))

    def done(self, index: int, group: list[Trajectory], started: float) -> None:
        if self.on_task is not None:
            self.on_task(index, group, time.perf_counter() - started)


def _task_count(available: int, num_tasks: int, task_split: str) -> int:
    if num_tasks > available:
        warnings.warn(f"num_tasks={num_tasks} but split {task_split!r} has only {available} "
                      f"tasks; evaluating all of them", RuntimeWarning, stacklevel=4)
    return available if num_tasks == 0 else min(num_tasks, available)


def _tasks(indices: list[int], task_split: str, progress: bool) -> Any:
    if not progress:
        return indices
    from tqdm.auto import tqdm

    return tqdm(indices, desc=f"evaluating on {task_split}", unit="task",
                dynamic_ncols=True)


def _play(engine: Engine, chat: ChatTokenizer, env_kwargs: dict[str, Any], plan: _Plan,
          k: int, seed: int, sampling: SamplingConfig | None, max_retries: int,
          max_context_tokens: int, progress: bool, result: Evaluation) -> None:
    from envs.group import DeepResearchGroupEnv
    from trainers.rollout import rollout_group

    if sampling is None:
        sampling = (SamplingConfig(temperature=0.0) if k == 1
                    else SamplingConfig(temperature=1.0, seed=seed))
    elif k > 1 and sampling.temperature == 0.0:
        warnings.warn(f"k={k} with greedy sampling: the k samples are identical, so pass@k "
                      "equals pass@1", RuntimeWarning, stacklevel=3)
    elif sampling.temperature > 0 and sampling.seed is None:
        # Unseeded sampling is fine statistically but not reproducible; seed it.
        sampling = dataclasses.replace(sampling, seed=seed)
    split = env_kwargs["task_split"]
    group = DeepResearchGroupEnv(group_size=k, **env_kwargs)
    try:
        indices = plan.indices(len(group.tasks), split)
        for i in _tasks(indices, split, progress):
            started = time.perf_counter()
            result.per_task.append(rollout_group(
                engine, group, chat, seed=seed + i, options={"task_index": i},
                sampling=sampling, max_context_tokens=max_context_tokens,
                max_retries=max_retries))
            result.seeds.append(seed)
            plan.done(i, result.per_task[-1], started)
    finally:
        group.close()


__all__ = ["Evaluation", "TurnCounts", "evaluate", "turn_counts"]
