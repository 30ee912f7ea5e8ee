"""The learner: one data-parallel replica of the policy with its optimizer and algorithm.

Verbs (trainers.rl.learner_group.LearnerGroup calls them on every learner):

    Learner.score(batch, answers)     -> what the algorithm needs scored (Algorithm.score:
                                         old log-probs, IGPO's probe scores) + ref log-probs
    Learner.update(batch, totals)     -> metrics        (one optimizer step, grads reduced)
    Learner.weights() / save(path) / load(path)
    Learner.join(address)                               (the torch.distributed group)
    Learner.weight_sync_*, broadcast_weights            (sync.method: broadcast)

Learners are data parallel with torch.distributed (gloo on CPU, NCCL on GPU): every learner
gets every world_size-th trajectory of a mini-batch, scales its loss by its share of the
global loss units (tokens for token-mean, trajectories for seq-mean) and the gradients are
summed, so W learners compute exactly the one-learner update (tests/test_rl_driver.py). How
the replicas are held, reduced and saved (full replicas, LoRA adapters, FSDP2 shards) is the
strategy's business (trainers.rl.strategy).

Precision and memory (learner.dtype, autocast, gradient_checkpointing)
* Master weights are fp32 by default (`dtype: float32`) and `autocast: bfloat16` computes the
  forward and backward in bf16 over them (verl's mixed precision does the same). Training
  bf16 weights directly (`dtype: bfloat16`) loses small updates: an AdamW step moves each
  weight by about lr (1e-6 at DR-Venus's setting), while bf16 resolves only ~1/256 of a
  weight's magnitude, so the step rounds back to the old value. Engines get the fp32 master
  weights and cast them to their own dtype; accumulated updates then reach a bf16 engine.

Where we deviate from DR-Venus / verl and why
* What is scored before the rewards is the algorithm's (Algorithm.score): IGPO's probe pass
  also yields the old log-probs, so IGPO pays one fused forward per trajectory for both;
  other algorithms do a plain forward.
* Update metrics are returned as this learner's share (loss diagnostics weighted by its
  share of the loss units) plus the values every rank shares (grad_norm, lr); the learner
  group merges them (trainers.rl.learner_group.merge_metrics).
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainers.algorithms.registry import PolicyScoring
from trainers.batch import RolloutBatch
from trainers.modeling.logprobs import PackedRow, policy_token_logprobs
from trainers.modeling.lora import LoraSettings
from trainers.modeling.models import load_policy, resolve_dtype
from trainers.modeling.varlen import pack_lengths
from trainers.rl.sft_mix import SftMix
from trainers.rl.strategy import make_strategy

LEARNER_STATE_FILE = "learner.pt"
# Metrics whose merge over micro-batches and learners keeps the extreme, not the sum.
EXTREME_METRICS = ("ratio_min", "ratio_max")
# Metrics every rank computes alike (after the all-reduce): any one rank's value is the value.
SHARED_METRICS = ("grad_norm", "lr")


@dataclass
class LossTotals:
    """Global loss units of one mini-batch (over all learners): each learner scales its
    loss by its own units / these, so summed gradients equal the one-learner gradient."""

    tokens: int  # policy tokens (token-mean)
    sequences: int  # trajectories with at least one policy token (seq-mean)


def policy_rows(batch: RolloutBatch) -> int:
    """Trajectories with at least one policy token (what seq-mean averages over)."""
    return int((batch.loss_mask.sum(dim=1) > 0).sum())


def loss_share(micro: RolloutBatch, totals: LossTotals, aggregation: str) -> float:
    """This micro-batch's share of the mini-batch's loss units (see LossTotals)."""
    if aggregation == "token-mean":
        return int(micro.loss_mask.sum()) / max(1, totals.tokens)
    return policy_rows(micro) / max(1, totals.sequences)


def merge_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Metrics of several shares (micro-batches, or learners) as one: share-weighted values
    are summed, extremes kept as extremes, shared values taken from the first part."""
    merged: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            if key in EXTREME_METRICS:
                pick = min if key.endswith("_min") else max
                merged[key] = pick(merged.get(key, value), value)
            elif key in SHARED_METRICS:
                merged.setdefault(key, value)
            else:
                merged[key] = merged.get(key, 0.0) + value
    return merged


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Learner:
    """One data-parallel replica of the policy with its optimizer and algorithm.

    Args:
        policy_path: starting weights and tokenizer.
        algorithm: a trainers.algorithms.Algorithm.
        lr, betas, weight_decay, eps, grad_clip, warmup_steps: AdamW settings.
        packing: a micro-batch's trajectories in one packed row (trainers.modeling.logprobs
            .PackedRow), micro-batches of at most `micro_batch_tokens` tokens; False:
            padded micro-batches of `micro_batch_size` trajectories.
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
            (rank 0 = full fine-tuning; trainers.modeling.lora).
        sft_coef, sft_config, sft_samples_per_update, rl_world: an SFT loss on the oracle
            episodes of `sft_config` mixed into every update (trainers.rl.sft_mix; sft_coef
            0 = off); rl_world is the world RL plays, which the mix must not use.
    """

    def __init__(self, policy_path: str, algorithm: Any, *, lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), weight_decay: float = 0.0,
                 eps: float = 1e-8,
                 grad_clip: float = 1.0, warmup_steps: int = 0, micro_batch_size: int = 4,
                 packing: bool = False, micro_batch_tokens: int = 16384,
                 rank: int = 0, world_size: int = 1, master: str = "", backend: str = "auto",
                 strategy: str = "ddp", use_gpu: bool = True, threads: int = 0, seed: int = 0,
                 temperature: float = 1.0, dtype: str = "float32", autocast: str = "off",
                 gradient_checkpointing: bool = False, lora_rank: int = 0,
                 lora_alpha: float = 16.0, lora_dropout: float = 0.0,
                 lora_targets: tuple[str, ...] | None = None, sft_coef: float = 0.0,
                 sft_config: str = "", sft_samples_per_update: int = 2, rl_world: int = -1):
        if autocast not in ("off", "bfloat16"):
            raise ValueError(f"autocast must be 'off' or 'bfloat16', got {autocast!r}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (the rollout temperature; greedy "
                             f"rollouts have no policy gradient), got {temperature}")
        lora = None if not lora_rank else LoraSettings(
            rank=lora_rank, alpha=lora_alpha, dropout=lora_dropout,
            **({"targets": tuple(lora_targets)} if lora_targets else {}))
        self.strategy = make_strategy(strategy, world_size, lora)
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
        model, scorer = self.strategy.prepare(model)
        self.model = model.to(self.device)
        # The module that scores and whose weights go to the engines: the trained module
        # itself, or (fsdp) an unsharded copy refreshed after every update.
        self.scorer = scorer.to(self.device)
        self.algorithm = algorithm
        self.reference = None
        if algorithm.kl_coef > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer_settings = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay,
                                       eps=eps)
        self.optimizer = self.strategy.optimizer(self.model, self.optimizer_settings)
        self.lr, self.warmup_steps, self.grad_clip = lr, warmup_steps, grad_clip
        self.micro_batch_size = micro_batch_size
        self.packing, self.micro_batch_tokens = packing, micro_batch_tokens
        self.updates = 0
        self.sft_mix = None
        if sft_coef > 0:
            if not sft_config:
                raise ValueError("learner.sft_coef > 0 needs learner.sft_config (an SFT config "
                                 "whose data section gives the mixed-in oracle episodes)")
            self.sft_mix = SftMix.from_config(
                sft_config, self.chat, rl_world=rl_world, coef=sft_coef,
                samples_per_update=sft_samples_per_update, seed=seed, rank=rank,
                world_size=world_size, pad_id=self.tokenizer.pad_token_id or 0)
        self._weight_sync: Any = None  # the weight-broadcast group (sync.method: broadcast)
        if world_size > 1 and master:
            self.join(master)

    # --- verbs ----------------------------------------------------------------------
    def rendezvous_address(self) -> str:
        """"host:port" on this learner's node for torch.distributed's TCP store (rank 0
        hosts it, so the address must be rank 0's node, not the driver's)."""
        from trainers.backends import free_address, node_address

        return free_address(node_address())

    def join(self, master: str) -> None:
        """Join the process group (blocks until every rank has joined); fsdp then shards."""
        dist.init_process_group(self.backend, init_method=f"tcp://{master}", rank=self.rank,
                                world_size=self.world_size)
        optimizer = self.strategy.joined(self.model, self.optimizer_settings)
        if optimizer is not None:
            self.optimizer = optimizer

    def score(self, batch: RolloutBatch, answers: list[list[str]],
              distractors: list[list[str]] | None = None) -> dict[str, torch.Tensor]:
        """What the algorithm needs scored for every row of `batch` (Algorithm.score:
        old_logprobs, IGPO's boundary_scores), and ref_logprobs when there is a KL term
        (the learner group gives each learner a slice of rows).
        answers / distractors: per row, gold answers and wrong ones to probe (or None)."""
        with torch.no_grad():
            self.scorer.eval()  # no dropout in the behaviour log-probs
            out = dict(self.algorithm.score(self.scoring(), batch, answers, distractors))
            if self.reference is not None:
                out["ref_logprobs"] = self._logprobs(self.reference, batch, grad=False)[0]
        return out

    def scoring(self) -> PolicyScoring:
        """The scoring module, its tokenizer and this learner's forward, for Algorithm.score."""
        return PolicyScoring(
            model=self.scorer, tokenizer=self.tokenizer, chat=self.chat,
            temperature=self.temperature, autocast=self._autocast,
            logprobs=lambda batch: self._logprobs(self.scorer, batch, grad=False)[0])

    def update(self, batch: RolloutBatch | None, totals: LossTotals) -> dict[str, float]:
        """One optimizer step on this learner's rows of a mini-batch (gradients summed over
        the learners). `batch` is None for a learner that got no rows (it still joins the
        collectives). Returns this learner's share of the loss diagnostics and the shared
        grad_norm and lr (merge_metrics puts the learners' parts together)."""
        if self.optimizer is None:
            raise RuntimeError("an fsdp learner must join its process group before updating")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        parts: list[dict[str, float]] = []
        micro_batches = self._micro_batches(batch) if batch is not None else []
        for _ in range(self.strategy.extra_micro_batches(len(micro_batches), self.device)):
            self._zero_weighted_pass()
        aggregation = self.algorithm.loss_aggregation
        for rows in micro_batches:
            micro = batch.select(rows).to(self.device)
            # backward() inside the forward's context: gradient checkpointing recomputes
            # the forward there and must see the same (packed) attention.
            with self._forward_context(micro, self.model) as forward:
                logprobs, entropy = forward(grad=True)
                loss, micro_metrics = self.algorithm.loss(micro, logprobs, entropy)
                share = loss_share(micro, totals, aggregation)
                (loss * (share * self.strategy.loss_scale)).backward()
            # Diagnostics weighted by this micro-batch's share of the global loss units: the
            # learner group's sum over learners is the batch-weighted mean.
            parts.append({key: float(value) if key in EXTREME_METRICS else float(value) * share
                          for key, value in micro_metrics.items()})
        if self.sft_mix is not None:
            # This learner's share of the draw's mean token cross-entropy (shares sum to it).
            parts.append({"sft_loss": self.sft_mix.backward(
                self.model, self.updates, self.device, scale=self.strategy.loss_scale,
                autocast=self._autocast)})
        self.strategy.reduce_gradients(self.model)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self._trained_parameters(), self.grad_clip if self.grad_clip > 0 else float("inf"))
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr * min(1.0, (self.updates + 1) / max(1, self.warmup_steps))
        self.optimizer.step()
        self.updates += 1
        self.strategy.after_step(self.model, self.scorer)
        return {**merge_metrics(parts), "grad_norm": self.strategy.global_norm(grad_norm),
                "lr": self.optimizer.param_groups[0]["lr"]}

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's weights for the engines, on the CPU in the learner's dtype (the
        fp32 masters by default; an engine casts them to its own dtype). With LoRA: base +
        merged adapter delta, under the base model's names."""
        return self.strategy.weights(self.scorer)

    def weight_sync_plan(self, bucket_bytes: int) -> Any:
        """The bucket plan of this policy's weights (trainers.rl.weight_sync.plan_buckets)."""
        from trainers.rl.weight_sync import plan_buckets

        return plan_buckets(self.strategy.weights(self.scorer, to_cpu=False), bucket_bytes)

    def weight_sync_address(self) -> str:
        """A free "host:port" on this learner's node for the weight-broadcast group's store."""
        from trainers.backends import free_address

        return free_address(self.rendezvous_address().rsplit(":", 1)[0])

    def join_weight_sync(self, address: str, rank: int, world_size: int, backend: str) -> None:
        """Join the weight-broadcast group as its sender (rank 0)."""
        from trainers.rl.weight_sync import join_sync_group

        self._weight_sync = join_sync_group(address, rank, world_size, backend)

    def broadcast_weights(self, plan: Any, backend: str) -> int:
        """Send the current weights to the engines in buckets; returns the bytes sent."""
        from trainers.rl.weight_sync import send_buckets

        return send_buckets(self._weight_sync, self.strategy.weights(self.scorer, to_cpu=False),
                            plan, device="cpu" if backend == "gloo" else None)

    def save(self, directory: str | Path) -> None:
        """Write the learner state (rank 0 writes; every rank holds the same state, or with
        fsdp its shard of the optimizer state, which every rank must join to gather)."""
        model_state, optimizer_state = self.strategy.checkpoint(self.model, self.scorer,
                                                                self.optimizer)
        if self.rank != 0:
            return
        state = {"model": model_state, "optimizer": optimizer_state,
                 "strategy": self.strategy.name, "updates": self.updates,
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
        state = torch.load(Path(directory) / LEARNER_STATE_FILE, weights_only=False,
                           map_location=self.strategy.map_location or self.device)
        saved_strategy = state.get("strategy", "ddp")
        if saved_strategy != self.strategy.name:
            raise ValueError(f"{directory} was saved by {saved_strategy!r} learners; this run "
                             f"uses learner.strategy {self.strategy.name!r} (optimizer states "
                             "differ)")
        self.strategy.restore(self.model, self.scorer, self.optimizer, state)
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

    def _micro_batches(self, batch: RolloutBatch) -> list[list[int]]:
        """Rows of `batch` per micro-batch: packed by token budget, or micro_batch_size
        rows in batch order."""
        if self.packing:
            return pack_lengths([int(n) for n in batch.lengths], self.micro_batch_tokens)
        return [list(range(start, min(start + self.micro_batch_size, batch.batch_size)))
                for start in range(0, batch.batch_size, self.micro_batch_size)]

    @contextlib.contextmanager
    def _forward_context(self, micro: RolloutBatch, model: Any) -> Iterator[Any]:
        """`forward(grad)` -> aligned log-probs and entropies [B, L] of `micro`'s policy
        tokens under `model`, valid inside the context: one packed row (its attention
        switched for the context), or the padded micro-batch."""
        row = PackedRow(micro) if self.packing else None

        def forward(grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
            with torch.set_grad_enabled(grad), self._autocast():
                if row is not None:
                    return row.policy_token_logprobs(model, self.device, self.temperature)
                return policy_token_logprobs(model, micro, self.device, self.temperature)

        with row.attention(model) if row is not None else contextlib.nullcontext():
            yield forward

    def _logprobs(self, model: Any, batch: RolloutBatch, grad: bool
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Aligned log-probs and entropies [B, L] of the whole batch, on the CPU: packed
        micro-batches, or one padded forward."""
        if not self.packing:
            with self._forward_context(batch, model) as forward:
                logprobs, entropy = forward(grad)
            return logprobs.detach().cpu(), entropy.detach().cpu()
        logprobs = torch.zeros(batch.input_ids.shape)
        entropy = torch.zeros(batch.input_ids.shape)
        for rows in self._micro_batches(batch):
            micro = batch.select(rows)
            with self._forward_context(micro, model) as forward:
                values, entropies = forward(grad)
            width, index = micro.input_ids.shape[1], torch.as_tensor(rows)
            logprobs[index, :width] = values.detach().cpu()
            entropy[index, :width] = entropies.detach().cpu()
        return logprobs, entropy

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
