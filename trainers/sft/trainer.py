"""The masked SFT training loop: packing, accumulation, AdamW + warm-up/cosine, exact resume.

`SFTTrainer(model, samples, train_config, data_config, pad_id)` trains any transformers
causal LM on `SFTSample`s (ids + policy-token mask). One optimizer step consumes
`rows_per_micro_batch * grad_accum * world_size` rows (packed or padded, see
trainers.sft.packing). The loss is the mean cross-entropy over every trained (policy) token
of the step, across micro-batches and workers: each micro-batch backpropagates
sum(token losses) / (trained tokens of the whole step), and workers all-reduce (sum) their
gradients. That makes N workers compute exactly the gradient one worker computes on the
same global batch, and makes the loss independent of how rows fall into micro-batches.

Exact resume. The rows of every epoch are a pure function of (seed, epoch) and a step's
rows a pure function of the step number, so a checkpoint needs only the step besides the
model, optimizer, scheduler and RNG states (python, numpy, torch); resuming replays the
same batches in the same order and matches an uninterrupted run step for step (bitwise on
the same machine and thread count, as tested). Checkpoints are atomic (written to a scratch
directory, fsynced, renamed: trainers.checkpoint_files), and loading one drops the
metrics.jsonl lines of the steps that run again, so a run killed at any point resumes with
every step logged once.

Where we deviate from DR-Venus and why
* No separate learning-rate floor or batch-size schedule; warm-up + cosine as in the paper.
* bf16 is autocast (fp32 master weights, fp32 loss), not a bf16 model: safer for the tiny
  models trained from scratch here, and the same code path on CPU and GPU.
* Gradients are all-reduced by hand (one flattened buffer per step,
  trainers.distributed.all_reduce_gradients, shared with the RL learners) rather than
  through DDP, so accumulation needs no no_sync() and the reduction point is explicit.
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from trainers.checkpoint_files import (
    latest_complete,
    new_scratch,
    publish,
    remove_scratch,
    truncate_steps,
)
from trainers.distributed import all_reduce_gradients
from trainers.modeling.models import BOOLEAN_LOGITS_TO_KEEP
from trainers.modeling.varlen import packed_spans
from trainers.run_log import METRICS_FILE, MetricsLogger
from trainers.sft.config import DataConfig, TrainConfig
from trainers.sft.packing import (
    IGNORE_INDEX,
    Batch,
    SFTSample,
    collate,
    epoch_rows,
    masked_lm_loss_sum,
)

CHECKPOINT_PREFIX = "checkpoint-"
STATE_FILE = "trainer_state.pt"
# Bump when pack_samples changes: the same data would be packed into different rows, so a
# checkpoint from another packer cannot resume exactly.
PACKER = "subset-sum-v1"
# train.max_seconds re-plans the run from the mean time of this many first steps (the first
# step alone is slower: allocations and caches).
PLAN_AFTER_STEPS = 4


def warmup_cosine(step: int, total_steps: int, warmup_ratio: float, min_lr_ratio: float) -> float:
    """LR multiplier: linear warm-up over ceil(warmup_ratio * total) steps, then cosine from 1
    down to min_lr_ratio at the last step."""
    warmup = math.ceil(warmup_ratio * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `precision` on `device`, or None for plain fp32."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision == "auto":
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if cuda_bf16 else None
    raise ValueError(f"precision must be 'fp32', 'bf16' or 'auto', got {precision!r}")


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The complete checkpoint directory with the highest step in output_dir, if any
    (scratch directories of a save cut short are never returned)."""
    return latest_complete(output_dir, (STATE_FILE,))


class SFTTrainer:
    """Masked SFT of a causal LM (see module docstring).

    Args:
        model: a transformers causal LM (anything whose forward takes input_ids,
            position_ids and attention_mask and returns .logits).
        samples: the training samples (every worker holds all of them; each takes its rows).
        train_config, data_config: see trainers.sft.config.
        pad_id: padding token id.
        config_record: the whole experiment config, stored in checkpoints and logged.
        log: where console lines go (default: tqdm.write / print).
    Distributed: if torch.distributed is initialised, rank and world size come from it and
    gradients and logged sums are all-reduced; only rank 0 writes files and logs.
    """

    def __init__(self, model: torch.nn.Module, samples: Sequence[SFTSample],
                 train_config: TrainConfig, data_config: DataConfig, pad_id: int,
                 config_record: dict[str, Any] | None = None,
                 log: Callable[[str], None] | None = None):
        if not samples:
            raise ValueError("no training samples")
        self.model = model
        self.samples = list(samples)
        self.cfg = train_config
        self.data_cfg = data_config
        self.pad_id = pad_id
        self.config_record = config_record or {}
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.is_main = self.rank == 0
        self._log = log
        self.device = next(model.parameters()).device
        self.autocast_dtype = resolve_precision(train_config.precision, self.device)
        self.output_dir = Path(train_config.output_dir)

        self.rows_per_step = data_config.rows_per_micro_batch * train_config.grad_accum \
            * self.world_size
        self._rows_cache: dict[int, list[list[int]]] = {}
        rows_per_epoch = len(self._epoch_rows(0))
        self.steps_per_epoch = max(1, math.ceil(rows_per_epoch / self.rows_per_step))
        self.total_steps = train_config.max_steps or max(
            1, math.ceil(train_config.epochs * self.steps_per_epoch))

        if train_config.gradient_checkpointing:
            # transformers 5 renamed the method; keep working with both spellings.
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable({"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False})
        decay, no_decay = [], []
        for name, parameter in model.named_parameters():
            if parameter.requires_grad:
                # Biases and norm gains are not decayed (the usual AdamW practice).
                (no_decay if parameter.ndim < 2 or "norm" in name else decay).append(parameter)
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": train_config.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=train_config.lr, betas=tuple(train_config.betas))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: warmup_cosine(step, self.total_steps,
                                                       train_config.warmup_ratio,
                                                       train_config.min_lr_ratio))
        self.step = 0
        self.history: list[dict[str, Any]] = []
        if self.distributed:
            self._broadcast_parameters()

    # --- data ---------------------------------------------------------------------
    def _epoch_rows(self, epoch: int) -> list[list[int]]:
        if epoch not in self._rows_cache:
            self._rows_cache = {epoch: epoch_rows(self.samples, self.data_cfg.max_seq_len,
                                                  self.data_cfg.packing, self.cfg.seed, epoch)}
        return self._rows_cache[epoch]

    def step_rows(self, step: int) -> list[list[int]]:
        """All workers' rows of optimizer step `step` (the global batch)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        rows = self._epoch_rows(epoch)
        return rows[within * self.rows_per_step:(within + 1) * self.rows_per_step]

    def micro_batches(self, step: int) -> tuple[list[Batch], int, int]:
        """(this worker's micro-batches, trained tokens of the global step, real tokens of
        the global step). Worker r takes every world_size-th row of the global batch."""
        global_rows = self.step_rows(step)
        trained = sum(self.samples[i].trained_tokens for row in global_rows for i in row)
        real = sum(len(self.samples[i]) for row in global_rows for i in row)
        mine = global_rows[self.rank::self.world_size]
        size = self.data_cfg.rows_per_micro_batch
        batches = [collate(self.samples, mine[k:k + size], self.pad_id, self.data_cfg.packing,
                           self.data_cfg.max_seq_len) for k in range(0, len(mine), size)]
        return batches, trained, real

    # --- one step -----------------------------------------------------------------
    def train_step(self) -> dict[str, Any]:
        """One optimizer step; returns its metrics."""
        started = time.perf_counter()
        self.model.train()
        batches, trained_tokens, real_tokens = self.micro_batches(self.step)
        loss_sum = torch.zeros((), dtype=torch.float64)
        mode = self.data_cfg.packed_attention if self.data_cfg.packing \
            else self.data_cfg.padded_attention
        use_varlen = mode == "varlen"
        for batch in batches:
            inputs = batch.model_inputs(with_mask=not use_varlen, device=self.device)
            labels = batch.labels.to(self.device)
            extra: dict[str, Any] = {}
            kept_trained = None
            if self.cfg.logits_on_trained_positions_only:
                # The LM head (vocab x hidden per position) is a large share of a small
                # model's cost; only positions with a label need logits. A [B, L] boolean
                # logits_to_keep (transformers >= 5.20) returns them flattened in row-major
                # order. Older 5.x take a 1-D index: the positions where any row has a
                # label (all of them at one row per micro-batch), then a mask of the rest.
                trained = labels != IGNORE_INDEX
                if BOOLEAN_LOGITS_TO_KEEP:
                    extra["logits_to_keep"] = trained
                else:
                    keep = trained.any(dim=0).nonzero().squeeze(1)
                    kept_trained = trained[:, keep]
                    extra["logits_to_keep"] = keep
                labels = labels[trained]
            attention = packed_spans(self.model, batch.spans) if use_varlen \
                else contextlib.nullcontext()
            # backward() stays inside the attention context: gradient checkpointing
            # recomputes the forward there and must see the same attention function.
            with attention:
                with torch.autocast(self.device.type,
                                    dtype=self.autocast_dtype or torch.float32,
                                    enabled=self.autocast_dtype is not None):
                    logits = self.model(**inputs, use_cache=False, **extra).logits
                if kept_trained is not None:
                    logits = logits[kept_trained]
                token_loss_sum = masked_lm_loss_sum(logits, labels)
                (token_loss_sum / max(1, trained_tokens)).backward()
            loss_sum += token_loss_sum.detach().double().cpu()
        if self.distributed:
            all_reduce_gradients(self.model.parameters())
            dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
        parameters = [p for p in self.model.parameters() if p.requires_grad]
        if self.cfg.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(parameters, self.cfg.grad_clip)
        else:
            grad_norm = torch.linalg.vector_norm(torch.stack(
                [p.grad.norm() for p in parameters if p.grad is not None]))
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        elapsed = time.perf_counter() - started
        metrics = {"step": self.step, "epoch": self.step / self.steps_per_epoch,
                   "loss": float(loss_sum) / max(1, trained_tokens), "lr": lr,
                   "grad_norm": float(grad_norm), "tokens": real_tokens,
                   "trained_tokens": trained_tokens, "tokens_per_s": real_tokens / elapsed,
                   "step_time_s": elapsed}
        self.history.append(metrics)
        return metrics

    def _broadcast_parameters(self) -> None:
        # Replicas start identical whatever each worker's initialisation did.
        with torch.no_grad():
            for tensor in list(self.model.parameters()) + list(self.model.buffers()):
                dist.broadcast(tensor, src=0)

    # --- the loop -----------------------------------------------------------------
    def train(self, max_steps: int | None = None) -> list[dict[str, Any]]:
        """Train until total_steps (or until step == max_steps); returns this call's metrics."""
        stop = self.total_steps if max_steps is None else min(max_steps, self.total_steps)
        if self.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self.log(f"training {self.total_steps} steps ({self.steps_per_epoch}/epoch, "
                     f"{self.rows_per_step} rows of {self.data_cfg.max_seq_len} tokens per "
                     f"step, packing={self.data_cfg.packing}, workers={self.world_size}, "
                     f"precision={self.autocast_dtype or torch.float32}) from step {self.step}")
        # The run logger (trainers.run_log, shared with RL) writes metrics.jsonl and shows the
        # bar; rank 0 only. Lines hold the step count after the update (step_base 1).
        logger = MetricsLogger(self.output_dir, max(stop, self.step), start_step=self.step, step_base=1,
                               progress_bar=True if self.cfg.progress_bar else None,
                               tensorboard=False, config=self.config_record or None,
                               console_keys=("loss", "tokens_per_s"), description="sft") \
            if self.is_main else contextlib.nullcontext()
        metrics_this_call = []
        budget = self.cfg.max_seconds
        started = time.perf_counter()
        with logger:
            while self.step < stop:
                metrics = self.train_step()
                metrics_this_call.append(metrics)
                if budget:
                    stop = self._fit_budget(budget, time.perf_counter() - started,
                                            len(metrics_this_call), stop, logger)
                if self.is_main:
                    logger.log(self.step, {k: v for k, v in metrics.items() if k != "step"})
                    if self.step % max(1, self.cfg.log_every) == 0 or self.step == stop:
                        self.log(f"step {self.step}/{self.total_steps} loss {metrics['loss']:.4f} "
                                 f"lr {metrics['lr']:.2e} grad_norm {metrics['grad_norm']:.3f} "
                                 f"tokens/s {metrics['tokens_per_s']:.0f}")
                if self.cfg.save_every and self.step % self.cfg.save_every == 0:
                    self.save_checkpoint()
        return metrics_this_call

    def _fit_budget(self, budget: float, spent: float, done: int, stop: int,
                    logger: Any) -> int:
        """train.max_seconds: the step this call stops at, given `spent` seconds for its
        `done` steps. After PLAN_AFTER_STEPS steps the run is re-planned once for the steps
        that fit at the measured speed (total_steps shrinks, and with it the warm-up and the
        cosine, which read it), so the schedule ends when the time does; the loop then stops
        early only if later steps run slower than the first ones did."""
        if spent >= budget:
            self.log(f"train.max_seconds={budget:g} spent after step {self.step}: stopping")
            return self.step
        if done == PLAN_AFTER_STEPS:
            fits = self.step + int((budget - spent) / (spent / done))
            if fits < self.total_steps:
                self.log(f"train.max_seconds={budget:g}: {spent / done:.2f} s a step, so "
                         f"{fits} steps fit (of {self.total_steps}); the schedule ends there")
                self.total_steps = max(self.step + 1, fits)
                if isinstance(logger, MetricsLogger):
                    logger.set_total_steps(self.total_steps)
                return min(stop, self.total_steps)
        return stop

    def log(self, line: str) -> None:
        if not self.is_main:
            return
        if self._log is not None:
            self._log(line)
        elif self.cfg.progress_bar:
            tqdm.write(line)
        else:
            print(line, flush=True)

    # --- checkpoints --------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything an exact resume needs."""
        return {
            "step": self.step, "total_steps": self.total_steps,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                    "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
            "data": self._data_record(),
            "config": self.config_record,
        }

    def _data_record(self) -> dict[str, Any]:
        """What fixes the rows of every step; a resume must match it exactly."""
        return {"seed": self.cfg.seed, "packing": self.data_cfg.packing, "packer": PACKER,
                "max_seq_len": self.data_cfg.max_seq_len, "samples": len(self.samples),
                "sample_tokens": sum(map(len, self.samples)), "rows_per_step": self.rows_per_step}

    def save_checkpoint(self, directory: str | Path | None = None) -> Path | None:
        """Save a resumable checkpoint (rank 0 only; replicas are identical). Written to a
        hidden scratch directory, fsynced and renamed (trainers.checkpoint_files), so a
        kill never leaves a half-written checkpoint where `latest_checkpoint` looks."""
        target = Path(directory) if directory is not None else \
            self.output_dir / f"{CHECKPOINT_PREFIX}{self.step:07d}"
        if self.is_main:
            remove_scratch(target.parent)  # a killed earlier save's leftovers
            scratch = new_scratch(target)
            try:
                torch.save(self.state(), scratch / STATE_FILE)
                publish(scratch, target)
            except BaseException:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
            self.log(f"saved checkpoint {target}")
        if self.distributed:
            dist.barrier()
        return target if self.is_main else None

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore a checkpoint written by save_checkpoint (any worker count with the same
        global batch; the data settings must match)."""
        state = torch.load(Path(directory) / STATE_FILE, map_location=self.device,
                           weights_only=False)
        expected = self._data_record()
        if state["data"] != expected:
            raise ValueError(f"checkpoint data settings {state['data']} differ from this run's "
                             f"{expected}; an exact resume needs the same data and batching")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        self.total_steps = int(state["total_steps"])
        if self.is_main:
            # The steps after the checkpoint run again: their lines (and a torn last line
            # of a killed write) leave metrics.jsonl, so none is logged twice. Lines hold
            # the step count after the update, so the checkpoint's own step stays.
            truncate_steps(self.output_dir / METRICS_FILE, self.step + 1)
            remove_scratch(self.output_dir)
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"].cpu())
        if state["rng"]["cuda"] and torch.cuda.is_available():
            # map_location put these on the GPU; generator states must be CPU byte tensors.
            torch.cuda.set_rng_state_all([rng.cpu() for rng in state["rng"]["cuda"]])
        self.log(f"resumed from {directory} at step {self.step}")
