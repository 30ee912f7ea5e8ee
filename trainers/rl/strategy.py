"""How a learner holds, reduces and saves its replica of the policy: the one place where data
parallelism with full replicas (DDP), with LoRA adapters, and sharded (FSDP2) differ.

    strategy = make_strategy("ddp", world_size, lora=None)      # or "fsdp"
    model, scorer = strategy.prepare(model)                     # adapters / scoring copy
    optimizer = strategy.optimizer(model, settings)             # None until sharded (fsdp)
    ...  micro-batches: loss * share * strategy.loss_scale, backward ...
    strategy.reduce_gradients(model)                            # ddp: one flat all-reduce
    strategy.after_step(model, scorer)                          # fsdp: refresh the scorer
    strategy.weights(scorer)                                    # what engines load

Every learner scales its loss by its share of the global loss units, so the gradients of all
learners are *summed* to the one-learner gradient (trainers.distributed.all_reduce_gradients).

* `DataParallel` ("ddp"): every learner holds the whole model and optimizer; gradients are
  all-reduced by hand (the helper SFT uses too).
* `LoraDataParallel` ("ddp" with learner.lora_rank > 0): DataParallel over a model with
  peft adapters; only they train. Engines and saved policies get merged weights under the
  base model's names (trainers.modeling.lora), checkpoints the module with its adapters.
* `FullyShardedDataParallel` ("fsdp"): torch FSDP2 (`fully_shard` per decoder layer, then
  the root): parameters, gradients and AdamW state are sharded over the learners and
  gradients reduce-scattered. Every forward of a sharded module is a collective, so a rank
  with fewer micro-batches runs zero-weighted ones, and each learner keeps an unsharded,
  gradient-free copy of the weights (refreshed after every update with one all-gather) for
  scoring and weight sync: the information-gain probe pass runs a data-dependent number of
  forwards per learner, which sharded modules cannot do.

Where we deviate from verl and why: verl scores with the sharded module; the FSDP scoring
copy here costs one model of memory per learner (no gradients or optimizer state).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
import transformers

from trainers.distributed import all_reduce_gradients
from trainers.modeling.lora import LoraSettings, apply_lora, merged_state_dict
from trainers.modeling.models import BOOLEAN_LOGITS_TO_KEEP, cpu_state_copy

STRATEGIES = ("ddp", "fsdp")


class DataParallel:
    """Full replicas; gradients summed with one flat all-reduce."""

    name = "ddp"

    def __init__(self, world_size: int):
        self.world_size = world_size

    def prepare(self, model: Any) -> tuple[Any, Any]:
        """(the trained module, the module that scores and whose weights the engines get)."""
        return model, model

    def optimizer(self, model: Any, settings: dict[str, Any]) -> torch.optim.Optimizer | None:
        return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **settings)

    def joined(self, model: Any, settings: dict[str, Any]) -> torch.optim.Optimizer | None:
        """Called once the process group exists; a new optimizer, or None to keep it."""
        return None

    def extra_micro_batches(self, count: int, device: torch.device) -> int:
        """Zero-weighted passes this rank must add to its `count` micro-batches."""
        return 0

    @property
    def loss_scale(self) -> float:
        """Factor on each micro-batch's loss share before backward."""
        return 1.0

    def reduce_gradients(self, model: Any) -> None:
        if self.world_size > 1:
            all_reduce_gradients(model.parameters())

    def global_norm(self, grad_norm: Any) -> float:
        return float(grad_norm)

    def after_step(self, model: Any, scorer: Any) -> None:
        return None

    def weights(self, scorer: Any, to_cpu: bool = True) -> dict[str, torch.Tensor]:
        """The policy's weights for the engines (on the CPU: copies; else where they live)."""
        if to_cpu:
            return cpu_state_copy(scorer.state_dict())  # tied weights stay one tensor
        return {name: t.detach() for name, t in scorer.state_dict().items()}

    def checkpoint(self, model: Any, scorer: Any, optimizer: Any) -> tuple[Any, Any]:
        """(module state, optimizer state) to save; every rank calls it (fsdp gathers)."""
        return self.weights(scorer), optimizer.state_dict()

    def restore(self, model: Any, scorer: Any, optimizer: Any, state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    @property
    def map_location(self) -> str | None:
        """Where a saved state is loaded before `restore` (None: the learner's device)."""
        return None


class LoraDataParallel(DataParallel):
    """DataParallel over a model with LoRA adapters (only they train)."""

    def __init__(self, world_size: int, lora: LoraSettings):
        super().__init__(world_size)
        self.lora = lora

    def prepare(self, model: Any) -> tuple[Any, Any]:
        model = apply_lora(model, self.lora)
        return model, model

    def weights(self, scorer: Any, to_cpu: bool = True) -> dict[str, torch.Tensor]:
        return merged_state_dict(scorer)  # base + merged delta, under the base model's names

    def checkpoint(self, model: Any, scorer: Any, optimizer: Any) -> tuple[Any, Any]:
        # The module's own state (base + adapters), which restore() loads back.
        return ({name: t.detach().cpu().clone() for name, t in model.state_dict().items()},
                optimizer.state_dict())


class FullyShardedDataParallel(DataParallel):
    """FSDP2 over the learners, with an unsharded scoring copy (module header)."""

    name = "fsdp"

    def __init__(self, world_size: int):
        if world_size < 2:
            raise ValueError("strategy 'fsdp' shards over learners: it needs world_size >= 2")
        super().__init__(world_size)

    def prepare(self, model: Any) -> tuple[Any, Any]:
        # An unsharded, gradient-free copy scores; the model is sharded once the group exists.
        return model, copy.deepcopy(model).requires_grad_(False)

    def optimizer(self, model: Any, settings: dict[str, Any]) -> torch.optim.Optimizer | None:
        return None

    def joined(self, model: Any, settings: dict[str, Any]) -> torch.optim.Optimizer | None:
        """Shard each decoder layer, then the rest (embeddings, final norm, head); the
        optimizer is built over the shards."""
        from torch.distributed.fsdp import fully_shard

        if not BOOLEAN_LOGITS_TO_KEEP:
            raise RuntimeError("learner.strategy fsdp needs transformers >= 5.20 (a boolean "
                               f"logits_to_keep); installed: {transformers.__version__}")
        decoder = getattr(model, "model", None)
        for layer in getattr(decoder, "layers", []):
            fully_shard(layer)
        fully_shard(model)
        return torch.optim.AdamW(model.parameters(), **settings)

    def extra_micro_batches(self, count: int, device: torch.device) -> int:
        # Every forward of a sharded module is a collective: all ranks must run the same
        # number of them; a rank with fewer micro-batches runs zero-weighted ones.
        most = torch.tensor([count], device=device)  # NCCL: on the GPU
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most) - count

    @property
    def loss_scale(self) -> float:
        # Shares sum to 1 over all ranks, so gradients must be summed: FSDP's reduce-scatter
        # averages (a divide factor of 1 needs NCCL's PREMUL_SUM, which gloo lacks).
        return float(self.world_size)

    def reduce_gradients(self, model: Any) -> None:
        return None  # reduce-scattered during backward

    def global_norm(self, grad_norm: Any) -> float:
        if hasattr(grad_norm, "full_tensor"):  # a DTensor of the global norm
            grad_norm = grad_norm.full_tensor()
        return float(grad_norm)

    def after_step(self, model: Any, scorer: Any) -> None:
        """All-gather the updated shards into the unsharded scoring copy (collective)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        scorer.load_state_dict(get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True)))

    def checkpoint(self, model: Any, scorer: Any, optimizer: Any) -> tuple[Any, Any]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        # Collective: every rank takes part; with cpu_offload only rank 0 gets the data.
        optimizer_state = get_optimizer_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.weights(scorer), optimizer_state

    def restore(self, model: Any, scorer: Any, optimizer: Any, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        # set_model_state_dict replaces the dict's tensors by shards: the scorer first.
        scorer.load_state_dict(state["model"])
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, dict(state["model"]), options=options)
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)

    @property
    def map_location(self) -> str | None:
        return "cpu"  # the full state stays on the CPU; only the shards move over


def make_strategy(name: str, world_size: int, lora: LoraSettings | None = None
                  ) -> DataParallel:
    """The strategy called `name` ("ddp" or "fsdp"); LoRA settings make ddp a
    LoraDataParallel."""
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r}")
    if lora is not None and name != "ddp":
        raise ValueError("LoRA (lora_rank > 0) needs strategy 'ddp'")
    if name == "fsdp":
        return FullyShardedDataParallel(world_size)
    return DataParallel(world_size) if lora is None else LoraDataParallel(world_size, lora)
