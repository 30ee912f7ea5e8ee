"""Bucketed weight sync: learner rank 0 broadcasts the policy's weights to the rollout
engines over a torch.distributed process group of its own (`sync.method: broadcast`). The
collectives live here (learner and rollout worker call them); the driver's side, which
starts them on both ends, is trainers.rl.weight_updates.

    plan = plan_buckets(state_dict, bucket_bytes=256 << 20)   # once: names, shapes, dtypes
    group = join_sync_group("10.0.0.1:29600", rank, world_size, "nccl")   # every member
    send_buckets(group, state_dict, plan)          # learner rank 0 (rank 0 of the group)
    received = receive_buckets(group, plan, device)  # each engine worker: name -> tensor

The default path (`sync.method: object_store`) puts the whole CPU state dict into Ray's
object store and every engine worker fetches it: a device -> host copy on the learner, a
copy into the store and one host -> device copy per worker, all of the model at once. The
broadcast path sends the weights as they are (on the learner's device with NCCL) in buckets
of about `bucket_bytes`: one collective per bucket rather than one per tensor (hundreds of
small tensors each pay a collective's fixed cost) and never a second whole copy of the
model in memory.

A bucket holds tensors of one dtype, flattened and concatenated; it travels as its bytes
(a uint8 view), so any dtype arrives bit for bit over any backend (gloo has no bfloat16
broadcast on every build). Tensors that share storage (tied input and output embeddings)
are sent once and the other names are filled from the same tensor on arrival.

The group is not the learners' default process group: engine workers are not learners, and a
process may hold only one default group, so this one is built from its own TCP store
(`join_sync_group`). NCCL needs every member on a different GPU; an engine colocated on
learner rank 0's GPU must use `sync.backend: gloo` (the buckets then go through host memory).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Slot:
    """One tensor's place in a bucket: elements [offset, offset + numel) of the flat bucket."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass(frozen=True)
class Bucket:
    dtype: torch.dtype
    numel: int
    slots: tuple[Slot, ...]

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class SyncPlan:
    """Where every tensor of a state dict travels; `aliases` maps a name to the name whose
    tensor it shares (tied weights), `names` keeps the state dict's order."""

    buckets: tuple[Bucket, ...]
    aliases: tuple[tuple[str, str], ...]
    names: tuple[str, ...]


def _storage_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
            tuple(tensor.shape), tensor.stride(), tensor.dtype)


def plan_buckets(state: Mapping[str, torch.Tensor], bucket_bytes: int) -> SyncPlan:
    """Group the tensors of `state` by dtype (in order of first appearance) and pack each
    group, in state-dict order, into buckets of at most `bucket_bytes` (a larger tensor gets
    a bucket of its own). Tensors sharing storage are planned once."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    first: dict[tuple[Any, ...], str] = {}
    aliases: list[tuple[str, str]] = []
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in state.items():
        key = _storage_key(tensor)
        if key in first:
            aliases.append((name, first[key]))
            continue
        first[key] = name
        by_dtype.setdefault(tensor.dtype, []).append((name, tensor))
    buckets: list[Bucket] = []
    for dtype, tensors in by_dtype.items():
        size = torch.empty((), dtype=dtype).element_size()
        slots: list[Slot] = []
        offset = 0
        for name, tensor in tensors:
            if slots and (offset + tensor.numel()) * size > bucket_bytes:
                buckets.append(Bucket(dtype, offset, tuple(slots)))
                slots, offset = [], 0
            slots.append(Slot(name, tuple(tensor.shape), offset, tensor.numel()))
            offset += tensor.numel()
        if slots:
            buckets.append(Bucket(dtype, offset, tuple(slots)))
    return SyncPlan(tuple(buckets), tuple(aliases), tuple(state))


def pack(state: Mapping[str, torch.Tensor], bucket: Bucket) -> torch.Tensor:
    """The bucket's tensors flattened into one contiguous tensor of its dtype."""
    return torch.cat([state[slot.name].detach().reshape(-1) for slot in bucket.slots])


def unpack(flat: torch.Tensor, bucket: Bucket) -> dict[str, torch.Tensor]:
    """Views of `flat` shaped as the bucket's tensors."""
    return {slot.name: flat[slot.offset:slot.offset + slot.numel].view(slot.shape)
            for slot in bucket.slots}


def join_sync_group(address: str, rank: int, world_size: int, backend: str,
                    timeout_s: float = 600.0) -> Any:
    """A process group of `world_size` members outside torch.distributed's default group;
    rank 0 hosts the TCP store at `address`. Blocks until every member has joined."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"sync backend must be 'gloo' or 'nccl', got {backend!r}")
    host, port = address.rsplit(":", 1)
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout)
    store = dist.PrefixStore("venus_weight_sync", store)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, world_size, options)


def _broadcast(group: Any, flat: torch.Tensor) -> None:
    group.broadcast([flat.view(torch.uint8)], _root_zero()).wait()


def _root_zero() -> Any:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    options.rootTensor = 0
    return options


def send_buckets(group: Any, state: Mapping[str, torch.Tensor], plan: SyncPlan,
                 device: torch.device | str | None = None) -> int:
    """Rank 0: broadcast every bucket of `state` (one at a time, so at most one bucket's
    copy is alive), each moved to `device` first when given (gloo: the CPU). Returns the
    bytes sent."""
    sent = 0
    for bucket in plan.buckets:
        flat = pack(state, bucket).contiguous()
        if device is not None:
            flat = flat.to(device)
        _broadcast(group, flat)
        sent += bucket.nbytes
    return sent


def receive_buckets(group: Any, plan: SyncPlan, device: torch.device | str = "cpu"
                    ) -> dict[str, torch.Tensor]:
    """Every other rank: the broadcast state dict (tensors on `device`, in the sender's
    state-dict order, aliases sharing their source's tensor)."""
    received: dict[str, torch.Tensor] = {}
    for bucket in plan.buckets:
        flat = torch.empty(bucket.numel, dtype=bucket.dtype, device=device)
        _broadcast(group, flat)
        received.update(unpack(flat, bucket))
    for name, source in plan.aliases:
        received[name] = received[source]
    return {name: received[name] for name in plan.names}


def state_bytes(state: Mapping[str, torch.Tensor]) -> int:
    """Bytes of a state dict's tensors, tied (storage-sharing) tensors counted once: what
    one copy of the weights weighs on the wire."""
    seen, total = set(), 0
    for tensor in state.values():
        key = _storage_key(tensor)
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total
