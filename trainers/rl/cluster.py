"""The RL run's workers: learners, rollout workers and the optional shared search service,
started from an RLConfig in this process or as Ray actors (the run's one in-process / Ray
decision: `backend_for(config.run.use_ray, ...)`), in the placement groups of
`run.placement` (trainers.rl.placement) when it is not 'none'.

    workers = start_workers(config, algorithm)
    workers.learners.score(...); workers.rollouts.rollout(jobs)
    workers.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from trainers.backends import Backend, WorkerSpec, backend_for
from trainers.distributed import WorkerGroup
from trainers.rl.config import RLConfig
from trainers.rl.learner import Learner
from trainers.rl.learner_group import LearnerGroup
from trainers.rl.placement import PlacementPlan, actor_resources, placement_plan
from trainers.rl.rollout_group import RolloutGroup
from trainers.rl.rollout_worker import RolloutWorker, SearchService
from trainers.rollout import SamplingConfig


@dataclass
class Workers:
    """The run's worker groups: learners, rollout workers and the optional search service."""

    learners: LearnerGroup
    rollouts: RolloutGroup
    search: WorkerGroup | None = None

    def close(self) -> None:
        """Release everything, even when a learner died or raised: the actors, then the
        placement groups they ran in."""
        try:
            self.learners.close()
        finally:
            try:
                for group in (self.rollouts.group, self.search):
                    if group is not None:
                        group.shutdown()
            finally:
                self.rollouts.group.backend.close()


def start_workers(config: RLConfig, algorithm: Any) -> Workers:
    """Learners (joined by torch.distributed when several), rollout workers with their
    engines and, with env.shared_search, one retrieval service they all search. With
    run.placement the placement groups are reserved first and each learner and rollout
    worker starts in its own bundle (a replacement worker in the dead one's)."""
    plan = placement_plan(config)
    backend = backend_for(config.run.use_ray, config.run.ray_address, placement=plan.groups)
    try:
        return _start(config, algorithm, backend, plan)
    except BaseException:
        backend.close()  # actors that did start die with their placement group
        raise


def _start(config: RLConfig, algorithm: Any, backend: Backend, plan: PlacementPlan
           ) -> Workers:
    learner, rollout = config.learner, config.rollout
    search = WorkerGroup(backend, [WorkerSpec(
        SearchService, (config.env.kwargs(),),
        resources={"num_cpus": 0})], role="search service") if config.env.shared_search else None
    settings = dict(**learner.optimizer_settings(), backend=learner.backend,
                    strategy=learner.strategy, threads=config.policy.threads,
                    use_gpu=backend.uses_gpu(learner.gpus_per_learner), seed=config.run.seed,
                    world_size=learner.num_learners, temperature=rollout.temperature,
                    # The synthetic world RL plays, which the SFT mix must not use (-1:
                    # RL plays a QA set or corpus, where world seeds mean nothing).
                    rl_world=config.env.world_seed if config.env.world == "synthetic" else -1,
                    **learner.model_settings())
    learners = LearnerGroup(WorkerGroup(backend, [WorkerSpec(
        Learner, (config.policy.path, algorithm), {**settings, "rank": rank},
        actor_resources(learner.cpus_per_learner, learner.gpus_per_learner,
                        learner.ray_resources),
        plan.learners[rank]) for rank in range(learner.num_learners)], role="learner"))
    learners.join()
    sampling = SamplingConfig(max_turn_tokens=rollout.max_turn_tokens,
                              temperature=rollout.temperature, top_p=rollout.top_p)
    worker = partial(WorkerSpec, RolloutWorker, (
        config.policy.path, config.env.kwargs(), rollout.group_size, sampling,
        rollout.max_context_tokens, rollout.engine, config.policy.threads,
        search.call_first(SearchService.url) if search else None, dict(rollout.vllm_options),
        {"base_url": rollout.openai_url, "model": rollout.openai_model,
         "api_key_env": rollout.openai_api_key_env},
        backend.uses_gpu(rollout.gpus_per_worker)),
        resources={**actor_resources(rollout.cpus_per_worker, rollout.gpus_per_worker,
                                     rollout.ray_resources),
                   "max_restarts": 0,
                   # A straggler's `cancel` must run while its `rollout` runs.
                   **({"max_concurrency": 2} if rollout.completion_cutoff < 1 else {})})
    rollouts = RolloutGroup(WorkerGroup(
        backend, [worker(bundle=bundle) for bundle in plan.rollouts],
        max_restarts=rollout.max_worker_restarts, role="rollout worker",
        restarts_field="rollout.max_worker_restarts"))
    return Workers(learners, rollouts, search)
