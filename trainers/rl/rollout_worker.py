"""Rollout workers: an engine plus G environments each, and the shared search service.

    RolloutWorker.rollout(job)        -> RolloutResult  (G trajectories of one query)
    RolloutWorker.rollout_many(jobs)  -> [RolloutResult] (groups sharing engine calls)
    RolloutWorker.set_weights(state)                    (new policy weights into the engine)
    RolloutWorker.cancel(job)                           (abandon a straggler between turns)
    SearchService.url()               -> the run's one retrieval server (env.shared_search)

Plain Python classes; trainers.distributed.WorkerGroup runs them in this process or as Ray
actors, and trainers.rl.cluster starts them from an RLConfig.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from typing import Any

import torch

from trainers.modeling.models import load_policy, load_tokenizer, resolve_model_path
from trainers.rollout import (
    GroupPlay,
    RolloutCancelled,
    RolloutStats,
    SamplingConfig,
    rollout_groups,
    text_token_counter,
)
from trainers.trajectory import Trajectory


@dataclass
class RolloutJob:
    """One group to roll out: a train-split task, its group id in the batch and a seed."""

    task_index: int
    group_id: int
    seed: int


@dataclass
class RolloutResult:
    """One group's trajectories (all G, or none when `cancelled`), with the version of the
    weights that generated them (the step whose update they came from; -1 = never synced)."""

    job: RolloutJob
    trajectories: list[Trajectory]
    stats: RolloutStats
    worker: str = ""
    weights_version: int = -1
    cancelled: bool = False


def _openai_engine(base_url: str, model: str = "default", api_key_env: str = "") -> Any:
    """trainers.engines.openai_http.OpenAIHTTPEngine, its key read from `api_key_env`."""
    from trainers.engines.openai_http import OpenAIHTTPEngine

    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env, "").strip()
        if not api_key:
            raise ValueError(f"rollout.openai_api_key_env names {api_key_env}, which is not set "
                             f"in the environment (export {api_key_env}=...)")
    return OpenAIHTTPEngine(base_url, model=model, api_key=api_key)


class RolloutWorker:
    """An engine plus a group of G DeepResearch-v0 environments on the train split.

    Args:
        policy_path: model directory (its weights are replaced by set_weights later).
        env_kwargs: DeepResearch-v0 arguments (task_split is forced to "train").
        group_size, sampling, max_context_tokens: see trainers.rollout.rollout_group.
        engine: "hf", "vllm" or "openai".
        threads: torch threads in this process (0 = leave as is).
        search_url: a shared retrieval server (SearchService) to search instead of a local
            index.
        vllm_options: keyword arguments of trainers.engines.vllm_engine.VLLMEngine.
        openai_options: engine "openai": base_url, model and api_key_env (the variable
            holding the key) of trainers.engines.openai_http.OpenAIHTTPEngine.
        use_gpu: engine "hf" generates on CUDA when this process sees a GPU (a Ray actor
            sees one only when it reserved one: rollout.gpus_per_worker).
    """

    def __init__(self, policy_path: str, env_kwargs: dict[str, Any], group_size: int,
                 sampling: SamplingConfig, max_context_tokens: int, engine: str = "hf",
                 threads: int = 0, search_url: str | None = None,
                 vllm_options: dict[str, Any] | None = None,
                 openai_options: dict[str, Any] | None = None, use_gpu: bool = False):
        from envs.group import DeepResearchGroupEnv

        if threads:
            torch.set_num_threads(threads)
        if engine == "openai":
            # The served model generates; only the tokenizer is needed here (token ids in,
            # token ids out).
            _, self.chat = load_tokenizer(policy_path)
            self.engine = _openai_engine(**(openai_options or {}))
        elif engine == "hf":
            from trainers.engines.hf import HFEngine

            model, tokenizer, self.chat = load_policy(policy_path)
            if use_gpu and torch.cuda.is_available():
                model = model.to(f"cuda:{torch.cuda.current_device()}")
            self.engine = HFEngine(model, tokenizer)
        else:
            _, _, self.chat = load_policy(policy_path)
            from trainers.engines.vllm_engine import VLLMEngine

            # vLLM reads a directory: `warm-start` becomes the packaged policy's.
            self.engine = VLLMEngine(str(resolve_model_path(policy_path)),
                                     temperature=sampling.temperature, **(vllm_options or {}))
        kwargs = {**env_kwargs, "task_split": "train",
                  "token_counter": text_token_counter(self.chat)}
        if search_url:
            kwargs.update(search_backend="retrieval_server", retrieval_url=search_url)
        self.group_env = DeepResearchGroupEnv(group_size=group_size, **kwargs)
        # More groups for rollout_many (the world and its index are shared per process).
        self.group_size, self._env_kwargs = group_size, kwargs
        self._group_envs = [self.group_env]
        self.sampling = sampling
        self.max_context_tokens = max_context_tokens
        self.weights_version = -1
        self.name = f"pid{os.getpid()}"
        # A Ray actor with max_concurrency 2 (rollout.completion_cutoff < 1) may run `cancel`
        # while `rollout` runs; the lock keeps weight updates out of a running rollout.
        self._lock = threading.Lock()
        self._cancelled: set[tuple[int, int]] = set()
        self._weight_sync: Any = None

    def num_tasks(self) -> int:
        return len(self.group_env.tasks)

    def set_weights(self, state: dict[str, torch.Tensor], version: int) -> int:
        with self._lock:
            self.engine.update_weights(state)
            self.weights_version = version
        return version

    def rollout(self, job: RolloutJob) -> RolloutResult:
        """One group: G trajectories of the job's task."""
        return self.rollout_many([job])[0]

    def rollout_many(self, jobs: list[RolloutJob]) -> list[RolloutResult]:
        """Several groups played in lockstep, their turns sharing engine calls
        (trainers.rollout.rollout_groups; rollout.groups_per_call). The first result carries
        the call's engine / env time and generated tokens, the others empty stats, so the
        results' stats sum to the call's. A cancelled job cancels the whole call."""
        stats = RolloutStats()
        tokens = [(job.group_id, job.seed) for job in jobs]
        while len(self._group_envs) < len(jobs):
            from envs.group import DeepResearchGroupEnv

            self._group_envs.append(DeepResearchGroupEnv(group_size=self.group_size,
                                                         **self._env_kwargs))
        plays = [GroupPlay(group_env, seed=job.seed, options={"task_index": job.task_index},
                           sampling=dataclasses.replace(self.sampling, seed=job.seed),
                           trajectory_id_prefix=f"g{job.group_id}",
                           should_stop=lambda token=token: token in self._cancelled)
                 for job, group_env, token in zip(jobs, self._group_envs, tokens)]
        with self._lock:
            try:
                groups = rollout_groups(self.engine, plays, self.chat,
                                        max_context_tokens=self.max_context_tokens,
                                        stats=stats)
            except RolloutCancelled:
                return [RolloutResult(job, [], stats if k == 0 else RolloutStats(), self.name,
                                      self.weights_version, cancelled=True)
                        for k, job in enumerate(jobs)]
            finally:
                self._cancelled.difference_update(tokens)
        results = []
        for k, (job, trajectories) in enumerate(zip(jobs, groups)):
            for trajectory in trajectories:
                trajectory.metadata["weights_version"] = self.weights_version
            results.append(RolloutResult(job, trajectories, stats if k == 0 else RolloutStats(),
                                         self.name, self.weights_version))
        return results

    def join_weight_sync(self, address: str, rank: int, world_size: int, backend: str) -> None:
        """Join the weight-broadcast group (sync.method: broadcast; trainers.rl.weight_sync)."""
        from trainers.rl.weight_sync import join_sync_group

        self._weight_sync = join_sync_group(address, rank, world_size, backend)

    def receive_weights(self, plan: Any, version: int, backend: str) -> int:
        """Receive learner rank 0's broadcast (`plan`: trainers.rl.weight_sync.SyncPlan) and
        load it into the engine."""
        from trainers.rl.weight_sync import receive_buckets

        if self._weight_sync is None:
            raise RuntimeError("receive_weights before join_weight_sync")
        device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
        state = receive_buckets(self._weight_sync, plan, device)
        with self._lock:
            self.engine.update_weights(state)
            self.weights_version = version
        return version

    def cancel(self, job: RolloutJob) -> None:
        """Abandon `job` before its next turn (rollout.completion_cutoff). The driver waits
        for the job's result before it sends this worker anything else, so a late cancel
        (the job already finished) never reaches a later job."""
        self._cancelled.add((job.group_id, job.seed))

    def ping(self) -> str:
        return self.name

    def close(self) -> None:
        for group_env in self._group_envs:
            group_env.close()


class SearchService:
    """One full-text index of the run's world (env.world: generated, hotpotqa, a QA JSONL or
    a saved world), served over the Search-R1 retrieval protocol
    (venus_gym.tools.retrieval_server) so that every rollout worker shares it.

    Args:
        env_kwargs: the run's DeepResearch-v0 keywords (the world is built as the
            environment builds it: envs.resources.world_and_index).
        host: address to serve on (None: this Ray node's).
    """

    def __init__(self, env_kwargs: dict[str, Any], host: str | None = None):
        from envs.config import DeepResearchConfig
        from envs.resources import world_and_index
        from venus_gym.tools.index import LocalSearchIndex
        from venus_gym.tools.retrieval_server import serve_index

        config = DeepResearchConfig.from_kwargs(**{**env_kwargs, "token_counter": None})
        if config.backend != "corpus" or config.search_backend != "local":
            raise ValueError("SearchService indexes the world's own pages: it needs "
                             "backend='corpus' and search_backend='local'")
        world, index = world_and_index(config)
        self.world_name = world.name
        if host is None:
            import ray

            host = ray.util.get_node_ip_address()
        self._server, _, self._url = serve_index(index or LocalSearchIndex(world.corpus),
                                                 host=host)

    def url(self) -> str:
        return self._url

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
