"""The RL driver: one loop, top to bottom, like the paper's Algorithm 1.

    venus-gym rl --config trainers/configs/demo_igpo.yaml      (or trainers.rl.driver.train)

    for step in steps:
        jobs       = step_jobs(seed, step, ...)         the next queries_per_step train tasks
        results    = rollouts.rollout(jobs)             G environments per task, token in/out
        batch      = to_batch(results)                  the data currency (trainers.batch)
        batch      = learners.score(batch, answers)     old / reference log-probs + IG probes
        rewards    = algorithm.turn_rewards(batch)      per turn: IG, format, outcome (pure)
        advantages = algorithm.weighted_advantages(batch, rewards)  normalise, discount, per token
        metrics    = ppo_update(learners, batch)        PPO epochs x mini-batches
        sync.push(step + 1)                             learner weights -> engines
        log metrics, save samples, checkpoint every save_every steps

Each phase is timed by one helper (`PhaseTimer`: rollout_s, score_s, update_s, learner_s =
score + update, sync_s). The workers (trainers.rl.cluster: rollout workers with their
engines, a learner group joined by torch.distributed, a shared search service) are objects
in this process (for debugging) or Ray actors; this file is the same either way.

Determinism and restarts. A step's tasks and sampling seeds are a pure function of
(run.seed, step, group); learners hold all other state (weights, optimizer, reference), and a
checkpoint (trainers.rl.checkpoint) stores it with the step. A run restarted from its
checkpoint therefore continues exactly as the uninterrupted run (tests/test_rl_driver.py
compares them bit for bit).

Fault tolerance. Each rollout worker has one group in flight. When a worker dies its group
runs on another (or on a replacement that first gets the current weights), so no group is
lost or counted twice (WorkerGroup.map; tested by killing an actor). A learner that dies
stops the run at once with a message naming it and the last complete checkpoint; nothing
is saved (learner_died_message). Checkpoints are atomic, so a driver killed at any point
resumes (run.resume: latest) from the newest complete one exactly.

Scale (docs/rl.md, "GPU scale"): rollout.completion_cutoff cuts straggling groups (whole
groups, cancelled between turns, never trained on); sync.method: broadcast sends the weights
in buckets over a process group of their own (trainers.rl.weight_sync); run.async_rollouts
rolls out step t+1 while step t trains. All three are off by default.

Where we deviate from DR-Venus / verl and why
* Synchronous (on-policy) steps by default: rollouts use the weights of the previous update.
  run.async_rollouts is one step off-policy: the loss corrects towards the generating
  policy with truncated importance sampling (tis_cap, required), but a turn's IG is scored
  by the newer learner weights, not by the policy that chose the turn (the gap is measured
  by benchmarks/rl_step.py, ig_gap).
* The learning rate is constant after warm-up (DR-Venus gives no schedule for RL).
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainers.batch import RolloutBatch, collate, record_from_trajectory
from trainers.distributed import WorkerDied
from trainers.evaluation.metrics import question_spread, trajectory_stats
from trainers.modeling.models import load_tokenizer
from trainers.rl.checkpoint import (
    latest_rl_checkpoint,
    resume,
    save_checkpoint,
    write_rl_policy_record,
)
from trainers.rl.cluster import start_workers
from trainers.rl.config import LearnerConfig, RLConfig, rl_config_to_dict
from trainers.rl.held_out import EvalPolicy
from trainers.rl.learner import EXTREME_METRICS
from trainers.rl.learner_group import LearnerGroup
from trainers.rl.rollout_group import GroupDone, RolloutGroup
from trainers.rl.rollout_worker import RolloutJob, RolloutResult
from trainers.rl.weight_updates import WeightSync
from trainers.run_log import MetricsLogger, dumps_json
from trainers.trajectory import Trajectory


# --- what to roll out --------------------------------------------------------------------
def job_seed(run_seed: int, step: int, group: int) -> int:
    """A 31-bit seed for one group's sampling, stable across processes and restarts."""
    digest = hashlib.sha256(f"{run_seed}/{step}/{group}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def step_jobs(run_seed: int, step: int, queries: int, num_tasks: int) -> list[RolloutJob]:
    """The queries of `step`: consecutive positions of a per-epoch shuffle of the train tasks
    (the data position is step * queries; every task is seen once per epoch)."""
    jobs = []
    for group in range(queries):
        position = step * queries + group
        epoch, offset = divmod(position, num_tasks)
        order = torch.randperm(num_tasks, generator=torch.Generator().manual_seed(
            job_seed(run_seed, -1, epoch)))
        jobs.append(RolloutJob(task_index=int(order[offset]), group_id=group,
                               seed=job_seed(run_seed, step, group)))
    return jobs


def train_task_count(available: int, pool: int) -> int:
    """How many train tasks step_jobs draws from: the first `pool` (run.train_tasks), or all."""
    if pool > available:
        raise ValueError(f"run.train_tasks is {pool} but the train split has {available} tasks")
    return pool or available


def groups_needed(cutoff: float, groups: int) -> int:
    """How many of a step's `groups` must finish (rollout.completion_cutoff), at least one."""
    return max(1, min(groups, math.ceil(cutoff * groups - 1e-9)))


@dataclass
class StepRollouts:
    """One step's finished groups (whole ones only) and what the straggler cutoff cut."""

    results: list[RolloutResult]
    cut: int
    seconds: float


def roll_out(rollouts: RolloutGroup, jobs: list[RolloutJob], cutoff: float,
             on_group_done: GroupDone | None = None, groups_per_call: int = 1
             ) -> StepRollouts:
    """Every job's group, or (cutoff < 1) the first groups_needed(...) to finish: the others
    are cancelled between turns and dropped whole. groups_per_call > 1: a worker plays that
    many groups at once (RolloutWorker.rollout_many)."""
    started = time.perf_counter()
    if groups_per_call > 1:
        calls = [jobs[i:i + groups_per_call] for i in range(0, len(jobs), groups_per_call)]
        kept = rollouts.rollout_many(calls, on_group_done)
        return StepRollouts(kept, 0, time.perf_counter() - started)
    results = rollouts.rollout(jobs, on_group_done, need=groups_needed(cutoff, len(jobs)))
    kept = [result for result in results if result is not None]
    return StepRollouts(kept, len(jobs) - len(kept), time.perf_counter() - started)


class RolloutSchedule:
    """When each step's groups are rolled out: in the step (synchronous, the default), or
    (run.async_rollouts) during the previous step's update, with its weights (one step
    off-policy). Overlap needs workers that run concurrently (Ray); in-process, step + 1's
    groups run right after step's, before its update."""

    def __init__(self, rollouts: RolloutGroup, jobs_of: Callable[[int], list[RolloutJob]], *,
                 cutoff: float, on_group_done: GroupDone | None, ahead: bool,
                 groups_per_call: int = 1):
        self.rollouts, self.jobs_of, self.cutoff = rollouts, jobs_of, cutoff
        self.groups_per_call = groups_per_call
        self.on_group_done, self.ahead = on_group_done, ahead
        self._background = ThreadPoolExecutor(1) if ahead and rollouts.concurrent else None
        self._next: Future[StepRollouts] | StepRollouts | None = None

    def take(self, step: int) -> StepRollouts:
        """Step `step`'s groups (rolled out now, or already under way)."""
        if self._next is None:
            return roll_out(self.rollouts, self.jobs_of(step), self.cutoff, self.on_group_done,
                            self.groups_per_call)
        rolled = self._next.result() if isinstance(self._next, Future) else self._next
        self._next = None
        return rolled

    def start_next(self, step: int) -> None:
        """async_rollouts: start step `step`'s groups now."""
        if not self.ahead:
            return
        args = (self.rollouts, self.jobs_of(step), self.cutoff, self.on_group_done,
                self.groups_per_call)
        self._next = self._background.submit(roll_out, *args) if self._background else \
            roll_out(*args)

    def wait(self) -> None:
        """Block until the next step's groups are done (so that all come from one policy
        before the weights change)."""
        if isinstance(self._next, Future):
            self._next = self._next.result()

    def close(self) -> None:
        if self._background is not None:
            self._background.shutdown(wait=False, cancel_futures=True)


# --- the step's verbs -----------------------------------------------------------------------
def to_batch(results: Sequence[RolloutResult], pad_token_id: int
             ) -> tuple[RolloutBatch, list[list[str]]]:
    """RolloutBatch of all groups (group id = position in the step) and gold answers."""
    records, answers = [], []
    for group, result in enumerate(results):
        for trajectory in result.trajectories:
            records.append(record_from_trajectory(trajectory, group_id=group))
            answers.append(list(trajectory.answers))
    return collate(records, pad_token_id=pad_token_id), answers


def ppo_update(learners: LearnerGroup, batch: RolloutBatch, config: LearnerConfig
               ) -> dict[str, float]:
    """ppo_epochs passes, each over `mini_batches` mini-batches of whole trajectories (in
    batch order, so the run is reproducible); each mini-batch is one optimizer step of the
    learner group. Metrics are averaged over the optimizer steps, except the extremes
    (ratio_min / ratio_max), which stay the extremes of the whole step."""
    chunks = [rows for rows in (list(range(batch.batch_size))[i::config.mini_batches]
                                for i in range(config.mini_batches)) if rows]
    totals: dict[str, float] = {}
    count = 0
    for _ in range(config.ppo_epochs):
        for rows in chunks:
            for key, value in learners.update(batch.select(rows)).items():
                if key in EXTREME_METRICS:
                    pick = min if key.endswith("_min") else max
                    totals[key] = pick(totals.get(key, value), value)
                else:
                    totals[key] = totals.get(key, 0.0) + value
            count += 1
    return {key: value if key in EXTREME_METRICS else value / count
            for key, value in totals.items()}


def rollout_drift(batch: RolloutBatch) -> dict[str, float]:
    """|engine log-prob - learner log-prob| on the policy tokens of a scored RolloutBatch:
    ~0 when the engine runs the learner's current weights (a failed weight sync or a
    numerics mismatch shows up here); {} without engine log-probs."""
    if batch.engine_logprobs is None or batch.old_logprobs is None:
        return {}
    diff = (batch.engine_logprobs - batch.old_logprobs).abs()[batch.loss_mask]
    if not len(diff):
        return {}
    return {"rollout_logprob_diff_mean": float(diff.mean()),
            "rollout_logprob_diff_max": float(diff.max())}


class PhaseTimer:
    """Wall-clock seconds of the named phases of one step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started


def step_metrics(config: RLConfig, rolled: StepRollouts, batch: RolloutBatch,
                 trajectories: list[Trajectory], advantage_metrics: dict[str, float],
                 update_metrics: dict[str, float], timer: PhaseTimer, lag: float,
                 rollouts: RolloutGroup) -> dict[str, float]:
    """Everything logged for one step."""
    seconds = timer.seconds
    generated = sum(r.stats.generated_tokens for r in rolled.results)
    metrics = {**update_metrics, **trajectory_stats(trajectories),
               **question_spread(trajectories),
               "reward": float(batch.outcome.mean()), **advantage_metrics,
               **rollout_drift(batch), "rollout_s": seconds["rollout_s"],
               "score_s": seconds["score_s"], "update_s": seconds["update_s"],
               "learner_s": seconds["score_s"] + seconds["update_s"],
               "tokens_per_s": generated / max(rolled.seconds, 1e-9),
               "generated_tokens": float(generated),
               "worker_restarts": float(rollouts.restarts),
               "retried_groups": float(rollouts.retried)}
    if config.rollout.completion_cutoff < 1:
        metrics.update({"rollout/groups_cut": float(rolled.cut),
                        "rollout/groups_kept": float(len(rolled.results))})
    if config.run.async_rollouts:
        metrics.update({"rollout/weights_lag": lag, "rollout/overlapped_s": rolled.seconds,
                        "rollout/wait_s": seconds["wait_s"]})
    if config.sync.method != "object_store":
        metrics["sync_s"] = seconds["sync_s"]
    return metrics


# --- the loop -------------------------------------------------------------------------------
@dataclass
class RunResult:
    """What a run produced: per-step metrics, evaluations and where things are."""

    history: list[dict[str, float]] = field(default_factory=list)
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    output_dir: Path = Path(".")
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    trajectories: list[list[Trajectory]] = field(default_factory=list)


def train(config: RLConfig, *, stop_after: int | None = None,
          on_group_done: GroupDone | None = None,
          keep_trajectories: bool = False) -> RunResult:
    """Run (or resume) the RL loop of `config`.

    stop_after: return after this many steps of this call (simulates a killed run in tests).
    on_group_done: called with each finished group and the rollout worker group (progress
        hooks, fault injection).
    keep_trajectories: return every step's trajectories (tests).
    """
    config.validate()
    output_dir = Path(config.run.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if config.policy.threads:
        torch.set_num_threads(config.policy.threads)
    algorithm = config.algorithm.build()
    tokenizer, chat = load_tokenizer(config.policy.path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    workers = start_workers(config, algorithm)
    learners, rollouts = workers.learners, workers.rollouts
    result = RunResult(output_dir=output_dir)
    schedule: RolloutSchedule | None = None
    try:
        start_step = 0
        if config.run.resume:
            start_step, result.before = resume(learners, output_dir, config.run.resume)
        sync = WeightSync(learners, rollouts, method=config.sync.method,
                          backend=config.sync.backend, bucket_bytes=config.sync.bucket_bytes,
                          uses_gpus=config.learner.gpus_per_learner > 0,
                          to_engines=config.rollout.sync_weights)
        sync.push(start_step)
        evaluator = EvalPolicy(config, sync.current())
        if start_step == 0 and config.eval.before:
            result.before = evaluator.evaluate(chat)
        end = config.run.steps if stop_after is None else min(config.run.steps,
                                                              start_step + stop_after)
        num_tasks = train_task_count(rollouts.num_tasks(), config.run.train_tasks)
        schedule = RolloutSchedule(
            rollouts, lambda step: step_jobs(config.run.seed, step,
                                             config.rollout.queries_per_step, num_tasks),
            cutoff=config.rollout.completion_cutoff, on_group_done=on_group_done,
            ahead=config.run.async_rollouts, groups_per_call=config.rollout.groups_per_call)
        with run_logger(config, output_dir, start_step) as logger:
            for step in range(start_step, end):
                timer = PhaseTimer()
                # 1-2. sample queries and roll out G environments for each (async: they were
                # rolled out during the previous step's update, with its weights)
                with timer.phase("rollout_s"):
                    rolled = schedule.take(step)
                if step + 1 < end:
                    schedule.start_next(step + 1)
                trajectories = [t for r in rolled.results for t in r.trajectories]
                with timer.phase("score_s"):
                    # 3-4. one batch; old / reference log-probs and IG probe scores
                    batch, answers = to_batch(rolled.results, pad_id)
                    batch = learners.score(batch, answers,
                                           algorithm.probe_distractors(batch, answers))
                    # 5. turn rewards, then advantages: pure functions of the scored batch
                    rewards = algorithm.turn_rewards(batch)
                    advantages = algorithm.weighted_advantages(batch, rewards)
                    batch = batch.replace(advantages=advantages.tokens)
                # 6. learner updates: PPO epochs over mini-batches of whole trajectories
                with timer.phase("update_s"):
                    update_metrics = ppo_update(learners, batch, config.learner)
                # 7. the new weights go to the engines (async: once step + 1's groups are
                # done, so that they all come from one policy)
                with timer.phase("wait_s"):
                    schedule.wait()
                with timer.phase("sync_s"):
                    sync.push(step + 1)
                # 8. metrics, samples, evaluation, checkpoint
                lag = float(step - min((r.weights_version for r in rolled.results),
                                       default=step))
                metrics = step_metrics(config, rolled, batch, trajectories, advantages.metrics,
                                       update_metrics, timer, lag, rollouts)
                if sync.push_bytes:
                    metrics["sync_bytes"] = float(sync.push_bytes)
                if config.eval.every and (step + 1) % config.eval.every == 0:
                    evaluator.load(sync.current())
                    metrics.update({f"eval/{k}": v for k, v in evaluator.evaluate(chat).items()})
                logger.log(step, metrics)
                if config.run.sample_trajectories:
                    logger.save_samples(step, trajectories, k=config.run.sample_trajectories)
                result.history.append({"step": step, **metrics})
                if keep_trajectories:
                    result.trajectories.append(trajectories)
                if (config.run.save_every and (step + 1) % config.run.save_every == 0) \
                        or step + 1 == config.run.steps:
                    save_checkpoint(learners, output_dir, step + 1, result.before,
                                    config.rollout.queries_per_step)
        result.weights = sync.current()
        if end == config.run.steps:
            finish(config, evaluator, result, chat, tokenizer)
        return result
    except WorkerDied as error:
        if error.group is not learners.group:
            raise
        raise RuntimeError(learner_died_message(str(error), output_dir,
                                                error.lost_node)) from error
    finally:
        if schedule is not None:
            schedule.close()
        workers.close()


def run_logger(config: RLConfig, output_dir: Path, start_step: int) -> MetricsLogger:
    """The run's metrics.jsonl / console / TensorBoard / W&B logger, with the whole config."""
    return MetricsLogger(output_dir, config.run.steps, start_step=start_step,
                         progress_bar=config.run.progress_bar,
                         tensorboard={"auto": "auto", "on": True, "off": False}[
                             config.run.tensorboard],
                         wandb_project=config.run.wandb_project or None,
                         config=rl_config_to_dict(config))


def finish(config: RLConfig, evaluator: EvalPolicy, result: RunResult, chat: Any,
           tokenizer: Any) -> None:
    """The final policy: evaluated (eval.after), saved to output_dir/final, eval.json."""
    evaluator.load(result.weights)
    if config.eval.after:
        result.after = evaluator.evaluate(chat)
    evaluator.save_final(result.output_dir / "final", tokenizer)
    write_rl_policy_record(config, result.output_dir / "final")
    (result.output_dir / "eval.json").write_text(dumps_json(
        {"before": result.before, "after": result.after}, indent=2))


def learner_died_message(death: str, output_dir: Path, lost_node: str | None = None) -> str:
    """What a dead learner means and what to do (docs/failure_behaviour.md), on one line."""
    checkpoint = latest_rl_checkpoint(output_dir)
    where = (f"the last complete checkpoint is {checkpoint} (step "
             f"{int(checkpoint.name.split('-')[-1])}); rerun with run.resume: latest to "
             "continue from it" if checkpoint else
             f"{output_dir} has no complete checkpoint; rerun from the start")
    if lost_node:
        where += (" once the cluster again has a node for every learner (one that declares "
                  "learner.ray_resources, if set)")
    return (f"{death}. The run stops: learners are joined by torch.distributed, so one "
            "cannot be replaced alone, and nothing was saved (the other learners may be "
            f"in the middle of an update, so their state is not a consistent one); {where}.")
