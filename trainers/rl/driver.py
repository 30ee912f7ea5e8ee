"""The RL driver: one loop, top to bottom, like the paper's Algorithm 1.

    venus-gym rl --config examples/configs/igpo_tiny.yaml      (or trainers.rl.driver.train)

    for step in steps:
        jobs        = the next queries_per_step train tasks, each with its own seed
        results     = rollout workers play G environments per task     (token in, token out)
        batch       = collate(trajectories)                            (the data currency)
        batch       = learners.score(batch)        old / reference log-probs + IG probe scores
        advantages  = algorithm.advantages(batch)  IG + format + outcome -> per-token
        metrics     = learners.update(batch)       PPO epochs x mini-batches, grads all-reduced
        engines    <- learner weights                                  (weight sync)
        log metrics, save samples, checkpoint every save_every steps

Ray stays at the edge: `Workers` runs the same worker objects (trainers.rl.workers) either in
this process (`run.use_ray: false`, for debugging) or as Ray actors (rollout workers with
their engines, learners joined by torch.distributed, one shared search service).

Determinism and restarts. A step's tasks and sampling seeds are a pure function of
(run.seed, step, group); learners hold all other state (weights, optimizer, reference), and a
checkpoint stores it with the step. A run restarted from its checkpoint therefore continues
exactly as the uninterrupted run (tests/test_rl_driver.py compares them bit for bit).

Fault tolerance. Each rollout worker has one group in flight. When a worker dies its group
goes back to the queue and runs on another (or on a replacement worker that first gets the
current weights), so no group is lost or counted twice (tested by killing an actor).

Where we deviate from DR-Venus / verl and why
* Synchronous (on-policy) steps: rollouts use the weights of the previous update. Async
  off-policy rollouts are faster on big clusters but make the IG rewards of a turn depend on
  a policy that no longer exists; we keep the paper's on-policy setting.
* The learning rate is constant after warm-up (DR-Venus gives no schedule for RL).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainers.batch import collate, record_from_trajectory
from trainers.rl.config import RLConfig, rl_config_to_dict
from trainers.rl.metrics import dumps_json
from trainers.rl.workers import (
    EXTREME_METRICS,
    LEARNER_STATE_FILE,
    Learner,
    LossTotals,
    RolloutJob,
    RolloutResult,
    RolloutWorker,
    SearchService,
    load_policy,
    load_tokenizer,
    policy_rows,
)
from trainers.rollout import SamplingConfig, text_token_counter
from trainers.trajectory import Trajectory

DRIVER_STATE_FILE = "driver.json"


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


# --- the workers, in-process or on Ray ---------------------------------------------------
def _sampling(config: RLConfig) -> SamplingConfig:
    return SamplingConfig(max_turn_tokens=config.rollout.max_turn_tokens,
                          temperature=config.rollout.temperature, top_p=config.rollout.top_p)


class Workers:
    """Rollout workers and learners behind the driver's verbs; in-process or Ray actors."""

    def __init__(self, config: RLConfig, algorithm: Any):
        self.config = config
        self.use_ray = config.run.use_ray
        self.restarts = 0
        self.retried_groups = 0
        self.search = None
        threads = config.policy.threads
        learners = config.learner.num_learners
        # In-process the learner may use this machine's GPU; a Ray learner only the GPUs it
        # reserves (gpus_per_learner), decided inside the actor.
        use_gpu = config.learner.gpus_per_learner > 0 if self.use_ray else True
        learner_kwargs = dict(lr=config.learner.lr, betas=tuple(config.learner.betas),
                              weight_decay=config.learner.weight_decay,
                              grad_clip=config.learner.grad_clip,
                              warmup_steps=config.learner.warmup_steps,
                              micro_batch_size=config.learner.micro_batch_size,
                              backend=config.learner.backend,
                              strategy=config.learner.strategy, use_gpu=use_gpu,
                              threads=threads, seed=config.run.seed)
        if not self.use_ray:
            self.learners = [Learner(config.policy.path, algorithm, **learner_kwargs)]
            self.rollout_workers = [self._new_rollout_worker(None)]
            return
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(address=config.run.ray_address or None, include_dashboard=False,
                     **({} if config.run.ray_address else {"num_cpus": os.cpu_count()}))
        search_url = None
        if config.env.shared_search:
            self.search = ray.remote(num_cpus=0)(SearchService).remote(
                config.env.world_size, config.env.world_seed)
            search_url = ray.get(self.search.url.remote())
        self._search_url = search_url
        learner_class = ray.remote(num_cpus=config.learner.cpus_per_learner,
                                   num_gpus=config.learner.gpus_per_learner)(Learner)
        self.learners = [learner_class.remote(config.policy.path, algorithm, rank=rank,
                                              world_size=learners, **learner_kwargs)
                         for rank in range(learners)]
        if learners > 1:
            # Rank 0 hosts the rendezvous, so its node's address is used; every rank joins
            # at once (init_process_group blocks until all have).
            master = ray.get(self.learners[0].rendezvous_address.remote())
            ray.get([learner.join.remote(master) for learner in self.learners])
        self.rollout_workers = [self._new_rollout_worker(search_url)
                                for _ in range(max(1, config.rollout.num_workers))]
        # Names (pids) of the live workers, for logs and for tests that kill one.
        self.worker_names = dict(zip(self.rollout_workers,
                                     ray.get([w.ping.remote() for w in self.rollout_workers])))

    def _new_rollout_worker(self, search_url: str | None) -> Any:
        config = self.config
        args = (config.policy.path, config.env.kwargs(), config.rollout.group_size,
                _sampling(config), config.rollout.max_context_tokens, config.rollout.engine,
                config.policy.threads, search_url, dict(config.rollout.vllm_options))
        if not self.use_ray:
            return RolloutWorker(*args)
        import ray

        return ray.remote(num_cpus=config.rollout.cpus_per_worker,
                          num_gpus=config.rollout.gpus_per_worker,
                          max_restarts=0)(RolloutWorker).remote(*args)

    # verbs ---------------------------------------------------------------------------
    def num_train_tasks(self) -> int:
        worker = self.rollout_workers[0]
        return worker.num_tasks() if not self.use_ray else _get(worker.num_tasks.remote())

    def rollout(self, jobs: Sequence[RolloutJob],
                on_group_done: Callable[[RolloutResult, Workers], None] | None = None
                ) -> list[RolloutResult]:
        """Run every job exactly once; results in job order."""
        if not self.use_ray:
            results = []
            for job in jobs:
                results.append(self.rollout_workers[0].rollout(job))
                if on_group_done:
                    on_group_done(results[-1], self)
            return results
        import ray
        from ray.exceptions import RayActorError

        queue = deque(jobs)
        done: dict[int, RolloutResult] = {}
        in_flight: dict[Any, tuple[RolloutJob, Any]] = {}
        idle = list(self.rollout_workers)
        while queue or in_flight:
            while queue and idle:
                worker, job = idle.pop(0), queue.popleft()
                in_flight[worker.rollout.remote(job)] = (job, worker)
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            job, worker = in_flight.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except RayActorError:
                # The worker died (killed, OOM, node lost): its group runs again elsewhere.
                self.retried_groups += 1
                queue.appendleft(job)
                replacement = self._replace_dead_worker(worker)
                if replacement is not None:
                    idle.append(replacement)
                continue
            if job.group_id in done:
                raise RuntimeError(f"group {job.group_id} finished twice")
            done[job.group_id] = result
            idle.append(worker)
            if on_group_done:
                on_group_done(result, self)
        return [done[job.group_id] for job in jobs]

    def score(self, batch: Any, answers: list[list[str]]) -> Any:
        """Old / reference log-probs and probe scores, rows dealt across learners."""
        shards = _deal(batch.batch_size, len(self.learners))
        calls = [(learner, batch.select(rows), [answers[i] for i in rows])
                 for learner, rows in zip(self.learners, shards) if rows]
        if self.use_ray:
            outputs = _get([learner.score.remote(b, a) for learner, b, a in calls])
        else:
            outputs = [learner.score(b, a) for learner, b, a in calls]
        changes = {}
        for name in outputs[0]:
            width = batch.input_ids.shape[1] if name != "boundary_scores" else \
                batch.turn_end.shape[1] + 1
            fill = float("nan") if name == "boundary_scores" else 0.0
            merged = torch.full((batch.batch_size, width), fill)
            for rows, output in zip([s for s in shards if s], outputs):
                merged[rows, :output[name].shape[1]] = output[name]
            changes[name] = merged
        return batch.replace(**changes)

    def update(self, batch: Any, totals: LossTotals) -> dict[str, float]:
        """One optimizer step on a mini-batch, rows dealt across learners."""
        shards = _deal(batch.batch_size, len(self.learners))
        parts = [batch.select(rows) if rows else None for rows in shards]
        if self.use_ray:
            outputs = _get([learner.update.remote(part, totals)
                            for learner, part in zip(self.learners, parts)])
        else:
            outputs = [learner.update(part, totals) for learner, part in zip(self.learners, parts)]
        merged: dict[str, float] = {}
        for output in outputs:
            for key, value in output.items():
                if key in EXTREME_METRICS:
                    pick = min if key.endswith("_min") else max
                    merged[key] = pick(merged.get(key, value), value)
                else:
                    merged[key] = merged.get(key, 0.0) + value
        return merged

    def sync_weights(self, version: int) -> dict[str, torch.Tensor]:
        """Learner rank 0's weights into every rollout engine; returns them."""
        self._version = version
        if not self.use_ray:
            weights = self.learners[0].weights()
            self.rollout_workers[0].set_weights(weights, version)
            return weights
        import ray

        weights = _get(self.learners[0].weights.remote())
        self._weights_ref = ray.put(weights)
        from ray.exceptions import RayActorError

        for worker in list(self.rollout_workers):
            try:
                ray.get(worker.set_weights.remote(self._weights_ref, version))
            except RayActorError:
                self._replace_dead_worker(worker)
        return weights

    def _replace_dead_worker(self, worker: Any) -> Any:
        """Drop a dead rollout worker; start a replacement with the current weights while
        restarts are left (a replacement that fails to start uses up a restart too).
        Returns the replacement (or None)."""
        import ray
        from ray.exceptions import RayError

        self.rollout_workers.remove(worker)
        ray.kill(worker)  # an unreachable (not dead) worker would keep its resources
        replacement = None
        while replacement is None and self.restarts < self.config.rollout.max_worker_restarts:
            self.restarts += 1
            candidate = self._new_rollout_worker(self._search_url)
            try:
                ray.get(candidate.set_weights.remote(self._weights_ref, self._version))
                self.worker_names[candidate] = ray.get(candidate.ping.remote())
                replacement = candidate
            except RayError:
                ray.kill(candidate)
        if replacement is not None:
            self.rollout_workers.append(replacement)
        if not self.rollout_workers:
            raise RuntimeError("every rollout worker died and no restarts are left "
                               "(rollout.max_worker_restarts)")
        return replacement

    def save(self, directory: Path) -> None:
        self._on_learners("save", str(directory))

    def load(self, directory: Path) -> None:
        self._on_learners("load", str(directory))

    def _on_learners(self, verb: str, *args: Any) -> list[Any]:
        if self.use_ray:
            return _get([getattr(learner, verb).remote(*args) for learner in self.learners])
        return [getattr(learner, verb)(*args) for learner in self.learners]

    def close(self) -> None:
        """Release everything, even when a learner already died."""
        try:
            self._on_learners("close")
        finally:
            if self.use_ray:
                import ray

                for actor in [*self.learners, *self.rollout_workers,
                              *([self.search] if self.search else [])]:
                    ray.kill(actor)
            else:
                self.rollout_workers[0].group_env.close()


def _get(refs: Any) -> Any:
    import ray

    return ray.get(refs)


def _deal(batch_size: int, world_size: int) -> list[list[int]]:
    """Learner r gets rows r, r + W, r + 2W, ..."""
    return [list(range(r, batch_size, world_size)) for r in range(world_size)]


# --- checkpoints --------------------------------------------------------------------------
def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / f"checkpoint-{step:06d}"


def latest_rl_checkpoint(output_dir: str | Path) -> Path | None:
    found = sorted(p for p in Path(output_dir).glob("checkpoint-*")
                   if (p / DRIVER_STATE_FILE).is_file() and (p / LEARNER_STATE_FILE).is_file())
    return found[-1] if found else None


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


def to_batch(results: Sequence[RolloutResult], pad_token_id: int) -> tuple[Any, list[list[str]]]:
    """RolloutBatch of all groups (group id = position in the step) and gold answers."""
    records, answers = [], []
    for group, result in enumerate(results):
        for trajectory in result.trajectories:
            records.append(record_from_trajectory(trajectory, group_id=group))
            answers.append(list(trajectory.answers))
    return collate(records, pad_token_id=pad_token_id), answers


def train(config: RLConfig, *, stop_after: int | None = None,
          on_group_done: Callable[[RolloutResult, Workers], None] | None = None,
          keep_trajectories: bool = False) -> RunResult:
    """Run (or resume) the RL loop of `config`.

    stop_after: return after this many steps of this call (simulates a killed run in tests).
    on_group_done: called after every finished group (progress hooks, fault injection).
    keep_trajectories: return every step's trajectories (tests).
    """
    from trainers.rl.evaluation import evaluate_engine
    from trainers.rl.metrics import MetricsLogger, trajectory_stats

    config.validate()
    output_dir = Path(config.run.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if config.policy.threads:
        torch.set_num_threads(config.policy.threads)
    algorithm = config.algorithm.build()
    tokenizer, chat = load_tokenizer(config.policy.path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    workers = Workers(config, algorithm)
    result = RunResult(output_dir=output_dir)
    try:
        start_step = 0
        resume = config.run.resume
        if resume:
            directory = latest_rl_checkpoint(output_dir) if resume == "latest" else Path(resume)
            if directory is None:
                raise FileNotFoundError(f"run.resume='latest' but {output_dir} has no checkpoint")
            workers.load(directory)
            state = json.loads((directory / DRIVER_STATE_FILE).read_text())
            start_step = int(state["step"])
            # NaN (e.g. no correct trajectory to measure) is stored as null.
            result.before = {k: float("nan") if v is None else v
                             for k, v in state["before"].items()}
        weights = workers.sync_weights(start_step)
        num_tasks = workers.num_train_tasks()
        eval_engine = _EvalPolicy(config, weights)
        if start_step == 0 and config.eval.before:
            result.before = eval_engine.evaluate(evaluate_engine, chat)
        logger = MetricsLogger(output_dir, config.run.steps, start_step=start_step,
                               progress_bar=config.run.progress_bar,
                               tensorboard={"auto": "auto", "on": True, "off": False}[
                                   config.run.tensorboard],
                               wandb_project=config.run.wandb_project or None,
                               config=rl_config_to_dict(config))
        end = config.run.steps if stop_after is None else min(config.run.steps,
                                                              start_step + stop_after)
        with logger:
            for step in range(start_step, end):
                # 1-2. sample queries and roll out G environments for each
                started = time.perf_counter()
                jobs = step_jobs(config.run.seed, step, config.rollout.queries_per_step,
                                 num_tasks)
                results = workers.rollout(jobs, on_group_done)
                rollout_seconds = time.perf_counter() - started
                trajectories = [t for r in results for t in r.trajectories]
                # 3-4. one batch; old / reference log-probs and information-gain probe scores
                started = time.perf_counter()
                batch, answers = to_batch(results, pad_id)
                batch = workers.score(batch, answers)
                drift = _rollout_drift(batch)
                # 5. rewards -> advantages (a pure function of the batch)
                advantages = algorithm.advantages(batch)
                batch = batch.replace(advantages=advantages.tokens)
                # 6. learner updates: PPO epochs over mini-batches of whole trajectories
                update_metrics = _update(workers, batch, config)
                learner_seconds = time.perf_counter() - started
                # 7. the new weights go to the engines
                weights = workers.sync_weights(step + 1)
                # 8. metrics, samples, checkpoint
                generated = sum(r.stats.generated_tokens for r in results)
                metrics = {**update_metrics, **trajectory_stats(trajectories),
                           "reward": float(batch.outcome.mean()),
                           **advantages.metrics, **drift,
                           "rollout_s": rollout_seconds, "learner_s": learner_seconds,
                           "tokens_per_s": generated / max(rollout_seconds, 1e-9),
                           "generated_tokens": float(generated),
                           "worker_restarts": float(workers.restarts),
                           "retried_groups": float(workers.retried_groups)}
                if config.eval.every and (step + 1) % config.eval.every == 0:
                    eval_engine.load(weights)
                    held_out = eval_engine.evaluate(evaluate_engine, chat)
                    metrics.update({f"eval/{k}": v for k, v in held_out.items()})
                logger.log(step, metrics)
                logger.save_samples(step, trajectories, k=config.run.sample_trajectories)
                result.history.append({"step": step, **metrics})
                if keep_trajectories:
                    result.trajectories.append(trajectories)
                last = step + 1 == config.run.steps
                if (config.run.save_every and (step + 1) % config.run.save_every == 0) or last:
                    _save_checkpoint(workers, output_dir, step + 1, result.before,
                                     config.rollout.queries_per_step)
        if end == config.run.steps:
            eval_engine.load(weights)
            result.after = eval_engine.evaluate(evaluate_engine, chat)
            eval_engine.save_final(output_dir / "final", tokenizer)
            (output_dir / "eval.json").write_text(dumps_json(
                {"before": result.before, "after": result.after}, indent=2))
        result.weights = weights
        return result
    finally:
        workers.close()


def _rollout_drift(batch: Any) -> dict[str, float]:
    """|engine log-prob - learner log-prob| on policy tokens: ~0 when the engine runs the
    learner's current weights (a failed weight sync or a numerics mismatch shows up here)."""
    if batch.engine_logprobs is None or batch.old_logprobs is None:
        return {}
    diff = (batch.engine_logprobs - batch.old_logprobs).abs()[batch.loss_mask]
    if not len(diff):
        return {}
    return {"rollout_logprob_diff_mean": float(diff.mean()),
            "rollout_logprob_diff_max": float(diff.max())}


def _update(workers: Workers, batch: Any, config: RLConfig) -> dict[str, float]:
    """ppo_epochs passes, each over `mini_batches` mini-batches of whole trajectories (in
    batch order, so the run is reproducible); metrics averaged over the optimizer steps."""
    size = batch.batch_size
    chunks = [list(range(size))[i::config.learner.mini_batches]
              for i in range(config.learner.mini_batches)]
    chunks = [c for c in chunks if c]
    totals: dict[str, float] = {}
    count = 0
    for _ in range(config.learner.ppo_epochs):
        for rows in chunks:
            mini = batch.select(rows)
            step_metrics = workers.update(mini, LossTotals(tokens=int(mini.loss_mask.sum()),
                                                           sequences=policy_rows(mini)))
            for key, value in step_metrics.items():
                totals[key] = totals.get(key, 0.0) + value
            count += 1
    return {key: value / count for key, value in totals.items()}


def _save_checkpoint(workers: Workers, output_dir: Path, step: int,
                     before: dict[str, float], queries_per_step: int) -> Path:
    directory = checkpoint_dir(output_dir, step)
    # Learner rank 0 writes learner.pt here: on several nodes output_dir must be shared
    # storage (docs/rl.md).
    directory.mkdir(parents=True, exist_ok=True)
    workers.save(directory)
    # The driver state is written last: a checkpoint without it is incomplete and ignored.
    # The data position is implied by the step (step_jobs); it is written for inspection.
    (directory / DRIVER_STATE_FILE).write_text(dumps_json(
        {"step": step, "data_position": step * queries_per_step, "before": before}))
    return directory


class _EvalPolicy:
    """The driver's own engine for held-out evaluation (greedy, test split)."""

    def __init__(self, config: RLConfig, weights: dict[str, torch.Tensor]):
        from trainers.engines.hf import HFEngine

        self.config = config
        model, tokenizer, _ = load_policy(config.policy.path)
        self.engine = HFEngine(model, tokenizer)
        self.load(weights)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        self.engine.update_weights(weights)

    def evaluate(self, evaluate_engine: Callable[..., Any], chat: Any) -> dict[str, float]:
        config = self.config
        sampling = SamplingConfig(max_turn_tokens=config.eval.max_turn_tokens, temperature=0.0)
        env_kwargs = {**config.env.kwargs(), "token_counter": text_token_counter(chat)}
        result = evaluate_engine(self.engine, chat, env_kwargs,
                                 num_tasks=config.eval.num_tasks, k=1, sampling=sampling,
                                 max_context_tokens=config.rollout.max_context_tokens)
        return result.summary()

    def save_final(self, directory: Path, tokenizer: Any) -> None:
        self.engine.model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
