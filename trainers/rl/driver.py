"""The RL driver: one loop, top to bottom, like the paper's Algorithm 1.

    venus-gym rl --config trainers/configs/demo_igpo.yaml      (or trainers.rl.driver.train)

    for step in steps:
        jobs       = step_jobs(seed, step, ...)         the next queries_per_step train tasks
        results    = rollouts.map("rollout", jobs)      G environments per task, token in/out
        batch      = to_batch(results)                  the data currency (trainers.batch)
        batch      = score(learners, batch)             old / reference log-probs + IG probes
        rewards    = algorithm.turn_rewards(batch)      per turn: IG, format, outcome (pure)
        advantages = algorithm.advantages(batch, rewards)  normalise, discount, per token
        metrics    = update(learners, batch)            PPO epochs x mini-batches, all-reduced
        engines   <- learner weights                    (weight sync; not with a served
                                                         model: rollout.sync_weights)
        log metrics, save samples, checkpoint every save_every steps

The worker verbs (trainers.rl.workers) run on worker groups (trainers.rl.worker_group,
started by trainers.rl.run_workers):
objects in this process (for debugging) or Ray actors (rollout workers with their engines,
learners joined by torch.distributed, a shared search service); this file is the same.

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

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trainers.batch import RolloutBatch, collate, record_from_trajectory
from trainers.models import load_tokenizer
from trainers.rl.checkpoint import latest_rl_checkpoint, resume, save_checkpoint
from trainers.rl.config import LearnerConfig, RLConfig, rl_config_to_dict
from trainers.rl.held_out import EvalPolicy
from trainers.rl.metrics import dumps_json, rollout_drift
from trainers.rl.run_workers import Workers, start_workers
from trainers.rl.weight_sync import BroadcastSync
from trainers.rl.worker_group import WorkerDied, WorkerGroup
from trainers.rl.workers import (
    LossTotals,
    RolloutJob,
    RolloutResult,
    deal_rows,
    merge_scores,
    merge_update_metrics,
    policy_rows,
)
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


def score(learners: WorkerGroup, batch: RolloutBatch, answers: list[list[str]],
          distractors: list[list[str]] | None = None) -> RolloutBatch:
    """Old / reference log-probs and probe scores; learner r scores rows r, r + W, ...
    distractors: per row, wrong answers for contrastive IG (Algorithm.probe_distractors)."""
    shards = deal_rows(batch.batch_size, learners.size)
    outputs = learners.call_each("logprobs_and_probe_scores", [
        (batch.select(rows), [answers[i] for i in rows],
         None if distractors is None else [distractors[i] for i in rows])
        if rows else None for rows in shards])
    return merge_scores(batch, shards, outputs)


def update(learners: WorkerGroup, batch: RolloutBatch, config: LearnerConfig
           ) -> dict[str, float]:
    """ppo_epochs passes, each over `mini_batches` mini-batches of whole trajectories (in
    batch order, so the run is reproducible); each mini-batch is one optimizer step with its
    rows dealt over the learners. Metrics are averaged over the optimizer steps."""
    chunks = [rows for rows in (list(range(batch.batch_size))[i::config.mini_batches]
                                for i in range(config.mini_batches)) if rows]
    totals: dict[str, float] = {}
    count = 0
    for _ in range(config.ppo_epochs):
        for rows in chunks:
            mini = batch.select(rows)
            units = LossTotals(tokens=int(mini.loss_mask.sum()), sequences=policy_rows(mini))
            parts = deal_rows(mini.batch_size, learners.size)
            # A learner without rows still joins the gradient all-reduce (batch None).
            outputs = learners.call_each("update", [
                (mini.select(part) if part else None, units) for part in parts])
            for key, value in merge_update_metrics(outputs).items():
                totals[key] = totals.get(key, 0.0) + value
            count += 1
    return {key: value / count for key, value in totals.items()}


def sync_weights(workers: Workers, version: int, to_engines: bool = True,
                 broadcast: BroadcastSync | None = None) -> dict[str, torch.Tensor] | None:
    """Learner rank 0's weights into every rollout engine, and into every replacement
    engine started later; returns them. to_engines=False (rollout.sync_weights: false, a
    served model as a fixed behaviour policy) only returns them, for evaluation and saving.
    broadcast (sync.method: broadcast): the engines get them over the broadcast group and
    nothing comes back to the driver (None); a replacement fetches them when it starts."""
    if broadcast is not None:
        broadcast.send(version)
        learners, rollouts = workers.learners, workers.rollouts
        rollouts.remember("set_weights", lambda: (
            rollouts.put(learners.call_first("weights")), version))
        return None
    weights = workers.learners.call_first("weights")
    if to_engines:
        workers.rollouts.call_sticky("set_weights", workers.rollouts.put(weights), version)
    return weights


def groups_needed(cutoff: float, groups: int) -> int:
    """How many of a step's `groups` must finish (rollout.completion_cutoff), at least one."""
    return max(1, min(groups, math.ceil(cutoff * groups - 1e-9)))


@dataclass
class StepRollouts:
    """One step's finished groups (whole ones only) and what the straggler cutoff cut."""

    results: list[RolloutResult]
    cut: int
    seconds: float


def roll_out(rollouts: WorkerGroup, jobs: list[RolloutJob], cutoff: float,
             on_group_done: Callable[[RolloutResult, WorkerGroup], None] | None = None
             ) -> StepRollouts:
    """Every job's group, or (cutoff < 1) the first groups_needed(...) to finish: the others
    are cancelled between turns and dropped whole."""
    started = time.perf_counter()
    need = groups_needed(cutoff, len(jobs))
    results = rollouts.map("rollout", jobs, on_group_done, need=need,
                           cancel="cancel" if need < len(jobs) else None)
    kept = [result for result in results if result is not None]
    return StepRollouts(kept, len(jobs) - len(kept), time.perf_counter() - started)


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
          on_group_done: Callable[[RolloutResult, WorkerGroup], None] | None = None,
          keep_trajectories: bool = False) -> RunResult:
    """Run (or resume) the RL loop of `config`.

    stop_after: return after this many steps of this call (simulates a killed run in tests).
    on_group_done: called with each finished group and the rollout worker group (progress
        hooks, fault injection).
    keep_trajectories: return every step's trajectories (tests).
    """
    from trainers.rl.metrics import MetricsLogger, trajectory_stats

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
    # Async rollouts overlap the update only on Ray (in-process they would run in turn).
    background = ThreadPoolExecutor(1) if config.run.async_rollouts and config.run.use_ray \
        else None
    try:
        start_step = 0
        if config.run.resume:
            start_step, result.before = resume(learners, output_dir, config.run.resume)
        broadcast = None
        if config.sync.method == "broadcast":
            backend = config.sync.backend
            if backend == "auto":
                backend = "nccl" if config.learner.gpus_per_learner > 0 else "gloo"
            broadcast = BroadcastSync(learners, rollouts, config.sync.bucket_bytes, backend)
        weights = sync_weights(workers, start_step, config.rollout.sync_weights, broadcast)
        num_tasks = rollouts.call_first("num_tasks")
        evaluator = EvalPolicy(config, weights if weights is not None
                               else learners.call_first("weights"))
        if start_step == 0 and config.eval.before:
            result.before = evaluator.evaluate(chat)
        logger = MetricsLogger(output_dir, config.run.steps, start_step=start_step,
                               progress_bar=config.run.progress_bar,
                               tensorboard={"auto": "auto", "on": True, "off": False}[
                                   config.run.tensorboard],
                               wandb_project=config.run.wandb_project or None,
                               config=rl_config_to_dict(config))
        end = config.run.steps if stop_after is None else min(config.run.steps,
                                                              start_step + stop_after)
        cutoff = config.rollout.completion_cutoff

        def jobs_of(step: int) -> list[RolloutJob]:
            return step_jobs(config.run.seed, step, config.rollout.queries_per_step, num_tasks)

        ahead: Future[StepRollouts] | StepRollouts | None = None  # step + 1's, async mode
        with logger:
            for step in range(start_step, end):
                # 1-2. sample queries and roll out G environments for each (async: they were
                # rolled out during the previous step's update, with its weights)
                started = time.perf_counter()
                if ahead is None:
                    rolled = roll_out(rollouts, jobs_of(step), cutoff, on_group_done)
                else:
                    rolled = ahead.result() if isinstance(ahead, Future) else ahead
                    ahead = None
                results = rolled.results
                rollout_seconds = time.perf_counter() - started
                if config.run.async_rollouts and step + 1 < end:
                    # step + 1's groups start now, with the weights these were sampled with
                    # at the latest (one step off-policy); in-process they run here.
                    args = (rollouts, jobs_of(step + 1), cutoff, on_group_done)
                    ahead = background.submit(roll_out, *args) if background else \
                        roll_out(*args)
                trajectories = [t for r in results for t in r.trajectories]
                # 3-4. one batch; old / reference log-probs and information-gain probe scores
                started = time.perf_counter()
                batch, answers = to_batch(results, pad_id)
                batch = score(learners, batch, answers,
                              algorithm.probe_distractors(batch, answers))
                # 5. turn rewards, then advantages: pure functions of the scored batch
                rewards = algorithm.turn_rewards(batch)
                advantages = algorithm.advantages(batch, rewards)
                batch = batch.replace(advantages=advantages.tokens)
                # 6. learner updates: PPO epochs over mini-batches of whole trajectories
                update_metrics = update(learners, batch, config.learner)
                learner_seconds = time.perf_counter() - started
                # 7. the new weights go to the engines (async: once step + 1's groups are
                # done, so that they all come from one policy)
                started = time.perf_counter()
                if isinstance(ahead, Future):
                    ahead = ahead.result()
                wait_seconds = time.perf_counter() - started
                started = time.perf_counter()
                weights = sync_weights(workers, step + 1, config.rollout.sync_weights,
                                       broadcast)
                sync_seconds = time.perf_counter() - started
                # 8. metrics, samples, checkpoint
                generated = sum(r.stats.generated_tokens for r in results)
                metrics = {**update_metrics, **trajectory_stats(trajectories),
                           "reward": float(batch.outcome.mean()),
                           **advantages.metrics, **rollout_drift(batch),
                           "rollout_s": rollout_seconds, "learner_s": learner_seconds,
                           "tokens_per_s": generated / max(rolled.seconds, 1e-9),
                           "generated_tokens": float(generated),
                           "worker_restarts": float(rollouts.restarts),
                           "retried_groups": float(rollouts.retried)}
                if cutoff < 1:
                    metrics.update({"rollout/groups_cut": float(rolled.cut),
                                    "rollout/groups_kept": float(len(results))})
                if config.run.async_rollouts:
                    metrics.update({
                        "rollout/weights_lag": float(step - min(
                            (r.weights_version for r in results), default=step)),
                        "rollout/overlapped_s": rolled.seconds,
                        "rollout/wait_s": wait_seconds})
                if config.sync.method != "object_store":
                    metrics["sync_s"] = sync_seconds
                if config.eval.every and (step + 1) % config.eval.every == 0:
                    weights = weights if weights is not None else learners.call_first("weights")
                    evaluator.load(weights)
                    held_out = evaluator.evaluate(chat)
                    metrics.update({f"eval/{k}": v for k, v in held_out.items()})
                logger.log(step, metrics)
                if config.run.sample_trajectories:
                    logger.save_samples(step, trajectories, k=config.run.sample_trajectories)
                result.history.append({"step": step, **metrics})
                if keep_trajectories:
                    result.trajectories.append(trajectories)
                last = step + 1 == config.run.steps
                if (config.run.save_every and (step + 1) % config.run.save_every == 0) or last:
                    save_checkpoint(learners, output_dir, step + 1, result.before,
                                    config.rollout.queries_per_step)
        if weights is None:
            weights = learners.call_first("weights")
        if end == config.run.steps:
            evaluator.load(weights)
            if config.eval.after:
                result.after = evaluator.evaluate(chat)
            evaluator.save_final(output_dir / "final", tokenizer)
            (output_dir / "eval.json").write_text(dumps_json(
                {"before": result.before, "after": result.after}, indent=2))
        result.weights = weights
        return result
    except WorkerDied as error:
        if error.group is not learners:
            raise
        raise RuntimeError(learner_died_message(str(error), output_dir)) from error
    finally:
        if background is not None:
            background.shutdown(wait=False, cancel_futures=True)
        workers.close()


def learner_died_message(death: str, output_dir: Path) -> str:
    """What a dead learner means and what to do (docs/failure_behaviour.md)."""
    checkpoint = latest_rl_checkpoint(output_dir)
    where = (f"the last complete checkpoint is {checkpoint} (step "
             f"{int(checkpoint.name.split('-')[-1])}); rerun with run.resume: latest to "
             "continue from it" if checkpoint else
             f"{output_dir} has no complete checkpoint; rerun from the start")
    return (f"{death}. The run stops: learners are joined by torch.distributed, so one "
            "cannot be replaced alone, and nothing was saved (the other learners may be "
            f"in the middle of an update, so their state is not a consistent one); {where}.")
