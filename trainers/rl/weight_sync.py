"""Bucketed weight sync: learner rank 0 broadcasts the policy's weights to the rollout
engines over a torch.distributed process group of its own (`sync.method: broadcast`).

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


class BroadcastSync:
    """The driver's side of `sync.method: broadcast`: learner rank 0 sends, every rollout
    worker receives, in the same collective (trainers.rl.learner.Learner.broadcast_weights,
    RolloutWorker.receive_weights).

    The group is (re)built whenever the rollout workers changed (a replacement cannot join
    a group of fixed size). A replacement started in the middle of a rollout phase gets its
    first weights from learner rank 0 through the object store (the fallback path), then
    joins the group at the next sync.
    """

    def __init__(self, learners: Any, rollouts: Any, bucket_bytes: int, backend: str):
        self.learners, self.rollouts, self.backend = learners, rollouts, backend
        self.plan: SyncPlan = learners.call_first("weight_sync_plan", bucket_bytes)
        self.members: list[Any] | None = None
        self.bytes_sent = 0

    def _run(self, learner_call: tuple[Any, ...], worker_calls: list[tuple[Any, ...]]
             ) -> list[Any]:
        """learner rank 0's call and every worker's call at once; a dead worker is replaced
        and reported as the error."""
        runner = self.rollouts.backend
        learner = self.learners.workers[0]
        lead = runner.submit(learner, *learner_call)
        futures = [(worker, runner.submit(worker, *call))
                   for worker, call in zip(list(self.rollouts.workers), worker_calls)]
        dead = []
        for worker, future in futures:
            try:
                runner.get([future])
            except runner.dead_errors:
                dead.append(worker)
        if dead:
            try:  # the sender fails too (its peer is gone); wait for it before rebuilding
                runner.get([lead])
            except Exception:  # noqa: BLE001 - the dead worker is the error being handled
                pass
            for worker in dead:
                self.rollouts.replace(worker)
            raise _MembersChanged()
        return runner.get([lead])

    def _connect(self) -> None:
        address = self.learners.call_first("weight_sync_address")
        size = self.rollouts.size + 1
        self._run(("join_weight_sync", address, 0, size, self.backend),
                  [("join_weight_sync", address, rank + 1, size, self.backend)
                   for rank in range(self.rollouts.size)])
        self.members = list(self.rollouts.workers)

    def send(self, version: int, attempts: int = 3) -> None:
        """The learner's current weights into every engine, labelled `version`."""
        for attempt in range(attempts):
            try:
                if self.members != self.rollouts.workers:
                    self._connect()
                sent = self._run(("broadcast_weights", self.plan, self.backend),
                                 [("receive_weights", self.plan, version, self.backend)]
                                 * self.rollouts.size)
                self.bytes_sent += int(sent[0])
                return
            except _MembersChanged:
                self.members = None
                if attempt + 1 == attempts:
                    raise RuntimeError("rollout workers kept dying during the weight "
                                       f"broadcast ({attempts} attempts)") from None


class _MembersChanged(Exception):
    """A rollout worker died during a sync-group call: rebuild the group and try again."""


class WeightSync:
    """The learners' weights into the rollout engines after each update, as `sync.method`
    says, and the latest weights for evaluation and saving.

    object_store (default): learner rank 0's CPU weights go into the object store once and
    every engine loads them; every replacement engine started later loads them first.
    broadcast: the weights travel in buckets over a group of their own (BroadcastSync, with
    `sync.backend` auto: NCCL when the learners hold GPUs, else gloo); a replacement
    fetches them from learner rank 0 when it starts.
    to_engines False (rollout.sync_weights: false, a served model as a fixed behaviour
    policy): the engines are left alone.
    """

    def __init__(self, learners: Any, rollouts: Any, method: str = "object_store",
                 backend: str = "auto", bucket_bytes: int = 256 << 20,
                 uses_gpus: bool = False, to_engines: bool = True):
        self.learners, self.rollouts, self.to_engines = learners, rollouts, to_engines
        self.broadcast = None
        if method == "broadcast":
            if backend == "auto":
                backend = "nccl" if uses_gpus else "gloo"
            self.broadcast = BroadcastSync(learners.group, rollouts, bucket_bytes, backend)
        self._weights: dict[str, torch.Tensor] | None = None

    def push(self, version: int) -> None:
        """The learners' current weights, labelled `version`, into every engine."""
        if self.broadcast is not None:
            self.broadcast.send(version)
            learners, rollouts = self.learners, self.rollouts
            rollouts.remember("set_weights", lambda: (rollouts.put(learners.weights()), version))
            self._weights = None
            return
        self._weights = self.learners.weights()
        if self.to_engines:
            self.rollouts.call_sticky("set_weights", self.rollouts.put(self._weights), version)

    def current(self) -> dict[str, torch.Tensor]:
        """The weights of the last push (fetched from learner rank 0 when the broadcast
        path kept none)."""
        if self._weights is None:
            self._weights = self.learners.weights()
        return self._weights
