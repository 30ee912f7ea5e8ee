"""The RL run's workers: learners, rollout workers and the optional shared search service,
started from an RLConfig in this process or as Ray actors (the run's one in-process / Ray
decision: `backend_for(config.run.use_ray, ...)`).

    workers = start_workers(config, algorithm)
    workers.learners.score(...); workers.rollouts.map("rollout", jobs)
    workers.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainers.distributed import WorkerGroup, WorkerSpec, backend_for
from trainers.rl.config import RLConfig
from trainers.rl.learner import Learner
from trainers.rl.learner_group import LearnerGroup
from trainers.rl.rollout_worker import RolloutWorker, SearchService
from trainers.rollout import SamplingConfig


@dataclass
class Workers:
    """The run's worker groups: learners, rollout workers and the optional search service."""

    learners: LearnerGroup
    rollouts: WorkerGroup
    search: WorkerGroup | None = None

    @property
    def concurrent(self) -> bool:
        """Whether calls on different groups run at the same time (Ray), so that rollouts
        can overlap the learners' update."""
        return bool(self.rollouts.backend.concurrent)

    def close(self) -> None:
        """Release everything, even when a learner died or raised."""
        try:
            self.learners.close()
        finally:
            for group in (self.rollouts, self.search):
                if group is not None:
                    group.shutdown()


def start_workers(config: RLConfig, algorithm: Any) -> Workers:
    """Learners (joined by torch.distributed when several), rollout workers with their
    engines and, with env.shared_search, one retrieval service they all search."""
    backend = backend_for(config.run.use_ray, config.run.ray_address)
    learner, rollout = config.learner, config.rollout
    search = WorkerGroup(backend, [WorkerSpec(
        SearchService, (config.env.kwargs(),),
        resources={"num_cpus": 0})], role="search service") if config.env.shared_search else None
    settings = dict(lr=learner.lr, betas=tuple(learner.betas), weight_decay=learner.weight_decay,
                    grad_clip=learner.grad_clip, warmup_steps=learner.warmup_steps,
                    micro_batch_size=learner.micro_batch_size, backend=learner.backend,
                    strategy=learner.strategy, threads=config.policy.threads,
                    use_gpu=backend.uses_gpu(learner.gpus_per_learner), seed=config.run.seed,
                    world_size=learner.num_learners, temperature=rollout.temperature,
                    **learner.model_settings())
    learners = LearnerGroup(WorkerGroup(backend, [WorkerSpec(
        Learner, (config.policy.path, algorithm), {**settings, "rank": rank},
        {"num_cpus": learner.cpus_per_learner, "num_gpus": learner.gpus_per_learner})
        for rank in range(learner.num_learners)], role="learner"))
    learners.join()
    sampling = SamplingConfig(max_turn_tokens=rollout.max_turn_tokens,
                              temperature=rollout.temperature, top_p=rollout.top_p)
    worker = WorkerSpec(RolloutWorker, (
        config.policy.path, config.env.kwargs(), rollout.group_size, sampling,
        rollout.max_context_tokens, rollout.engine, config.policy.threads,
        search.call_first("url") if search else None, dict(rollout.vllm_options),
        {"base_url": rollout.openai_url, "model": rollout.openai_model,
         "api_key_env": rollout.openai_api_key_env},
        backend.uses_gpu(rollout.gpus_per_worker)),
        resources={"num_cpus": rollout.cpus_per_worker, "num_gpus": rollout.gpus_per_worker,
                   "max_restarts": 0,
                   # A straggler's `cancel` must run while its `rollout` runs.
                   **({"max_concurrency": 2} if rollout.completion_cutoff < 1 else {})})
    rollouts = WorkerGroup(backend, [worker] * max(1, rollout.num_workers),
                           max_restarts=rollout.max_worker_restarts, role="rollout worker",
                           restarts_field="rollout.max_worker_restarts")
    return Workers(learners, rollouts, search)
