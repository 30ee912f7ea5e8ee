"""Paired held-out evaluation: several policies on the same tasks with the same sampling
seeds, and standard errors of their differences.

    held_out = [HeldOut("world 0 test", {"world_size": 2000, "world_seed": 0, ...}, "test")]
    runs = paired_evaluate({"start": "warm-start", "igpo": "runs/lc/igpo/final"}, held_out,
                           k=2, seed=0, max_turn_tokens=256)
    table = compare(runs["start"], runs["igpo"])    # {"pass@1": Difference(...), ...}

Every policy plays every task of every held-out set k times, sampled at `temperature`; task
i of a set is reset with seed + i and member j's turn t samples with a seed that depends on
(seed, set, i, t, j) only, so two policies meet the same questions under the same random
numbers (with equal policies the trajectories are identical; tests/test_paired_eval.py).

Statistics, per metric (HEADLINE):
* pass@1: mean outcome per task, averaged over tasks (outcome >= 0.5 is correct; with EM
  the mean is the share of correct samples);
* format_valid_rate: format-valid turns / generated turns, pooled over the tasks;
* answer_rate: the share of trajectories that end in a valid answer turn.
The standard error of one policy's value, and of the difference between two, is the
task-clustered bootstrap of trainers.evaluation.stats: tasks are resampled with replacement, and
for a difference the same resampled tasks are used for both policies (a paired bootstrap:
what the two policies share, the task's difficulty, cancels). z = difference / its SE.

Where we deviate and why: DR-Venus compares policies by pass@1 from separate greedy runs.
Greedy decoding of a small policy flips on near-ties (a 4e-6 change in log-probs moved a
24-task format-error rate by 0.03, docs/benchmarks.md), so a greedy before / after change of
a few points says nothing; sampled, paired runs with SEs say how large a change is against
its noise.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainers.evaluation.evaluate import Evaluation, turn_counts
from trainers.evaluation.metrics import answered, browse_ratio, outcome
from trainers.evaluation.stats import bootstrap_se, z_score
from trainers.trajectory import Trajectory

Group = Sequence[Trajectory]
# Headline metrics and whether a higher value is better (all three are).
HEADLINE: tuple[str, ...] = ("pass@1", "format_valid_rate", "answer_rate")
WORSE_Z = -2.0  # a difference below -2 SE is "worse beyond noise" (~2.3% one-sided)


@dataclass
class HeldOut:
    """One held-out task set: a world's split, played with these env settings."""

    name: str
    env_kwargs: dict[str, Any]
    split: str = "test"
    num_tasks: int = 0  # 0 = the whole split


def _task_mean(value: Callable[[Trajectory], float]) -> Callable[[Sequence[Group]], float]:
    def statistic(groups: Sequence[Group]) -> float:
        means = [sum(map(value, g)) / len(g) for g in groups if len(g)]
        return sum(means) / len(means) if means else math.nan
    return statistic


def _format_valid(groups: Sequence[Group]) -> float:
    counts = [turn_counts(t) for g in groups for t in g]
    generated = sum(c.generated for c in counts)
    return sum(c.valid for c in counts) / generated if generated else math.nan


METRICS: dict[str, Callable[[Sequence[Group]], float]] = {
    "pass@1": _task_mean(outcome),
    "format_valid_rate": _format_valid,
    "answer_rate": _task_mean(lambda t: float(answered(t))),
    # Not a headline metric (higher is not better in itself): the paper's tool-use measure.
    "browse_ratio": _task_mean(browse_ratio),
}


@dataclass
class Difference:
    """One metric of two policies on the same tasks: values, their SEs, b - a and its
    paired SE, z = (b - a) / SE."""

    a: float
    a_se: float
    b: float
    b_se: float
    diff: float
    diff_se: float

    @property
    def z(self) -> float:
        return z_score(self.diff, self.diff_se)

    @property
    def worse(self) -> bool:
        """b is worse than a beyond noise (z below WORSE_Z)."""
        return self.z < WORSE_Z

    def as_dict(self) -> dict[str, float | bool]:
        return {"a": self.a, "a_se": self.a_se, "b": self.b, "b_se": self.b_se,
                "diff": self.diff, "diff_se": self.diff_se, "z": self.z, "worse": self.worse}


def task_keys(evaluation: Evaluation) -> list[tuple[Any, str]]:
    """(held-out split name, task id) of each played task, in order: what pairs two runs."""
    return [(g[0].metadata.get("held_out"), g[0].task_id) for g in evaluation.per_task]


def compare(a: Evaluation, b: Evaluation, metrics: Sequence[str] = HEADLINE, *,
            samples: int = 1000, seed: int = 0) -> dict[str, Difference]:
    """b against a on the same tasks (paired_evaluate's output), per metric.

    Raises:
        ValueError: the two evaluations did not play the same tasks in the same order, or a
            metric is unknown.
    """
    if task_keys(a) != task_keys(b):
        raise ValueError("compare needs two evaluations of the same tasks in the same order "
                         "(paired_evaluate plays every policy on one task list)")
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metrics {unknown}; known: {sorted(METRICS)}")
    pairs = list(zip(a.per_task, b.per_task))
    table = {}
    for name in metrics:
        statistic = METRICS[name]

        def difference(chosen: Sequence[tuple[Group, Group]],
                       statistic: Callable[[Sequence[Group]], float] = statistic) -> float:
            return statistic([p[1] for p in chosen]) - statistic([p[0] for p in chosen])

        table[name] = Difference(
            a=statistic(a.per_task), a_se=bootstrap_se(a.per_task, statistic, samples=samples,
                                                       seed=seed),
            b=statistic(b.per_task), b_se=bootstrap_se(b.per_task, statistic, samples=samples,
                                                       seed=seed),
            diff=difference(pairs), diff_se=bootstrap_se(pairs, difference, samples=samples,
                                                          seed=seed))
    return table


def comparison_lines(table: Mapping[str, Difference], a_name: str, b_name: str) -> list[str]:
    """A markdown table of compare()'s output, with worse-beyond-noise rows flagged."""
    lines = [f"| metric | {a_name} | {b_name} | change (paired SE) | z | |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for name, d in table.items():
        flag = "**worse beyond noise**" if d.worse else ""
        lines.append(f"| {name} | {d.a:.3f} ± {d.a_se:.3f} | {d.b:.3f} ± {d.b_se:.3f} | "
                     f"{d.diff:+.3f} ± {d.diff_se:.3f} | {d.z:+.2f} | {flag} |")
    return lines


def _member_seed(seed: int, held_out: int, task: int) -> int:
    # A task's sampling seed: apart for every (set, task), the same for every policy.
    return (seed * 1_000_003 + held_out * 100_003 + task * 1_009) % (2**31 - 10_000)


def paired_evaluate(policies: Mapping[str, str | Path], held_out: Sequence[HeldOut], *,
                    k: int = 1, seed: int = 0, temperature: float = 1.0,
                    max_turn_tokens: int = 256, max_context_tokens: int = 8192,
                    threads: int = 0, log: Callable[[str], None] | None = print,
                    groups_per_call: int = 1, device: str = "auto",
                    jobs: int = 1) -> dict[str, Evaluation]:
    """Play every held-out task k times with each policy directory (module docstring).

    Args:
        policies: name -> policy directory (or `warm-start`).
        held_out: the task sets; each trajectory's metadata["held_out"] names its set.
        k: samples per task and policy.
        seed: the sampling seed of the whole evaluation.
        temperature: sampling temperature (> 0: a greedy paired evaluation is one sample).
        max_turn_tokens: token cap per turn; max_context_tokens: an episode's hard cap.
        threads: torch threads in all (0 = leave as is; with jobs > 1, the usable cores).
        log: progress lines (None = quiet).
        groups_per_call: tasks played at once, their turns sharing engine calls
            (trainers.rollout.rollout_groups); the trajectories are the same either way.
        device: where the policies run: "auto" (the current CUDA device when there is one,
            else the CPU), "cpu" or "cuda".
        jobs: processes playing side by side (trainers.backends.run_in_processes), each
            every jobs-th task of the whole list with threads // jobs torch threads, their
            episodes put back in the one task order. A task's random numbers depend on the
            task only, so the episodes are those of one process unless the logits' rounding
            at another thread count flips a sampled token (none did in
            tests/test_paired_eval.py, nor in a 99-task learning check;
            benchmarks/parallel_checks.py counts them); on a small policy and few cores
            separate processes beat one process's intra-op threads. The held-out sets'
            env_kwargs are pickled to the processes (plain values: a live client or a lambda
            fails), and each process prints its own progress lines (`log` only says whether).

    Returns name -> Evaluation, whose per_task lists follow the same task order.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for a sampled paired evaluation, got "
                         f"{temperature}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    settings = dict(k=k, seed=seed, temperature=temperature, max_turn_tokens=max_turn_tokens,
                    max_context_tokens=max_context_tokens, groups_per_call=groups_per_call,
                    device=device)
    if jobs == 1:
        return _play_shard(dict(policies), list(held_out), shard=0, jobs=1, threads=threads,
                           log=log, **settings)
    import functools

    from trainers.backends import run_in_processes, threads_per_process

    per_process = threads_per_process(threads, jobs)
    started = time.perf_counter()
    child_log = functools.partial(print, flush=True) if log is not None else None
    shards = run_in_processes([
        (_play_shard, (dict(policies), list(held_out)),
         dict(shard=shard, jobs=jobs, threads=per_process, log=child_log, **settings))
        for shard in range(jobs)])
    results = {name: interleave_shards([shard[name] for shard in shards]) for name in policies}
    if log is not None:
        for name, evaluation in results.items():
            summary = {m: METRICS[m](evaluation.per_task) for m in HEADLINE}
            log(f"  {name} ({policies[name]}): {len(evaluation.per_task)} tasks x {k}, "
                + ", ".join(f"{m} {v:.3f}" for m, v in summary.items())
                + f" ({jobs} processes, {time.perf_counter() - started:.0f} s in all)")
    return results


def interleave_shards(shards: Sequence[Evaluation]) -> Evaluation:
    """One policy's evaluation from its shards: shard s of n played tasks s, s + n, s + 2n,
    ... of the whole list, so task p is entry p // n of shard p % n.

    Raises:
        ValueError: the shards' lengths cannot come from one list dealt out that way.
    """
    n = len(shards)
    total = sum(len(shard.per_task) for shard in shards)
    expected = [len(range(s, total, n)) for s in range(n)]
    if [len(shard.per_task) for shard in shards] != expected:
        raise ValueError(f"shards of {[len(s.per_task) for s in shards]} tasks do not deal "
                         f"out one list of {total} (expected {expected})")
    merged = Evaluation(k=shards[0].k if shards else 1)
    for position in range(total):
        shard, index = shards[position % n], position // n
        merged.per_task.append(shard.per_task[index])
        merged.seeds.append(shard.seeds[index])
    return merged


def _play_shard(policies: dict[str, str | Path], held_out: list[HeldOut], *, shard: int,
                jobs: int, k: int, seed: int, temperature: float, max_turn_tokens: int,
                max_context_tokens: int, threads: int, log: Callable[[str], None] | None,
                groups_per_call: int, device: str) -> dict[str, Evaluation]:
    """paired_evaluate in one process: every jobs-th task of the whole task list (all sets
    in order), starting at `shard`."""
    import torch

    from envs.group import DeepResearchGroupEnv
    from trainers.engines.hf import HFEngine
    from trainers.modeling.models import load_policy, resolve_device
    from trainers.rollout import GroupPlay, SamplingConfig, rollout_groups, text_token_counter

    if threads:
        torch.set_num_threads(threads)
    label = f" shard {shard + 1}/{jobs}" if jobs > 1 else ""
    results: dict[str, Evaluation] = {}
    for name, path in policies.items():
        started = time.perf_counter()
        model, tokenizer, chat = load_policy(path)
        model = model.eval().to(resolve_device(device, "paired_evaluate(device=...)"))
        engine = HFEngine(model, tokenizer)
        evaluation = Evaluation(k=k)
        position = 0  # of the set's first task in the whole list
        for index, held in enumerate(held_out):
            # A stuck remote tool backend must not stall the evaluation.
            env_kwargs = {"tool_timeout_s": 60.0, **held.env_kwargs, "task_split": held.split,
                          "token_counter": text_token_counter(chat)}
            groups = [DeepResearchGroupEnv(group_size=k, **env_kwargs)
                      for _ in range(max(1, groups_per_call))]
            try:
                available = len(groups[0].tasks)
                count = available if not held.num_tasks else min(held.num_tasks, available)
                mine = [task for task in range(count) if (position + task) % jobs == shard]
                position += count
                for first in range(0, len(mine), len(groups)):
                    plays = []
                    for task, group in zip(mine[first:first + len(groups)], groups):
                        member_seed = _member_seed(seed, index, task)
                        plays.append(GroupPlay(group, seed=member_seed,
                                               options={"task_index": task},
                                               sampling=SamplingConfig(
                                                   max_turn_tokens=max_turn_tokens,
                                                   temperature=temperature, seed=member_seed)))
                    for trajectories in rollout_groups(engine, plays, chat,
                                                       max_context_tokens=max_context_tokens):
                        for trajectory in trajectories:
                            trajectory.metadata["held_out"] = held.name
                        evaluation.per_task.append(trajectories)
                        evaluation.seeds.append(seed)
            finally:
                for group in groups:
                    group.close()
        results[name] = evaluation
        if log is not None and evaluation.per_task:
            summary = {m: METRICS[m](evaluation.per_task) for m in HEADLINE}
            log(f"  {name}{label} ({path}): {len(evaluation.per_task)} tasks x {k}, "
                + ", ".join(f"{m} {v:.3f}" for m, v in summary.items())
                + f" ({time.perf_counter() - started:.0f} s)")
        del engine, model
    return results


__all__ = ["HEADLINE", "METRICS", "Difference", "HeldOut", "WORSE_Z", "compare",
           "comparison_lines", "interleave_shards", "paired_evaluate"]
