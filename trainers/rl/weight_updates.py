"""How the driver moves the learners' weights into the rollout engines after each update
(`sync.method`): through Ray's object store (the default) or by a bucketed broadcast over a
process group of their own (the collectives are trainers.rl.weight_sync).

    sync = WeightSync(learners, rollouts, method="object_store")
    sync.push(version)          # after every update; sync.push_bytes: what it sent
    weights = sync.current()    # the latest weights, for evaluation and saving
"""

from __future__ import annotations

from typing import Any

import torch

from trainers.distributed import WorkerGroup
from trainers.rl.learner import Learner
from trainers.rl.learner_group import LearnerGroup
from trainers.rl.rollout_group import RolloutGroup
from trainers.rl.rollout_worker import RolloutWorker
from trainers.rl.weight_sync import SyncPlan, state_bytes


class BroadcastSync:
    """The driver's side of `sync.method: broadcast`: learner rank 0 sends, every rollout
    worker receives, in the same collective (trainers.rl.learner.Learner.broadcast_weights,
    RolloutWorker.receive_weights).

    The group is (re)built whenever the rollout workers changed (a replacement cannot join
    a group of fixed size). A replacement started in the middle of a rollout phase gets its
    first weights from learner rank 0 through the object store (the fallback path), then
    joins the group at the next sync.
    """

    def __init__(self, learners: WorkerGroup, rollouts: WorkerGroup, bucket_bytes: int,
                 backend: str):
        self.learners, self.rollouts, self.backend = learners, rollouts, backend
        self.plan: SyncPlan = learners.call_first(Learner.weight_sync_plan, bucket_bytes)
        self.members: list[Any] | None = None
        self.bytes_sent = 0

    def _run(self, learner_call: tuple[Any, ...], worker_calls: list[tuple[Any, ...]]
             ) -> list[Any]:
        """learner rank 0's call and every worker's call at once; a dead worker is replaced
        and reported as the error."""
        runner = self.rollouts.backend
        learner = self.learners.workers[0]
        lead = self.learners.submit(learner, *learner_call)
        futures = [(worker, self.rollouts.submit(worker, *call))
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
        address = self.learners.call_first(Learner.weight_sync_address)
        size = self.rollouts.size + 1
        self._run((Learner.join_weight_sync, address, 0, size, self.backend),
                  [(RolloutWorker.join_weight_sync, address, rank + 1, size, self.backend)
                   for rank in range(self.rollouts.size)])
        self.members = list(self.rollouts.workers)

    def send(self, version: int, attempts: int = 3) -> None:
        """The learner's current weights into every engine, labelled `version`."""
        for attempt in range(attempts):
            try:
                if self.members != self.rollouts.workers:
                    self._connect()
                sent = self._run((Learner.broadcast_weights, self.plan, self.backend),
                                 [(RolloutWorker.receive_weights, self.plan, version,
                                   self.backend)]
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
    `push_bytes`: the bytes of weights the last push sent (object_store: the one copy put
    into the store, which Ray then copies once to every other node that runs an engine;
    broadcast: the buckets every engine receives). Logged per step as `sync_bytes`.
    """

    def __init__(self, learners: LearnerGroup, rollouts: RolloutGroup, *,
                 method: str = "object_store", backend: str = "auto",
                 bucket_bytes: int = 256 << 20, uses_gpus: bool = False,
                 to_engines: bool = True):
        self.learners, self.rollouts, self.to_engines = learners, rollouts, to_engines
        self.broadcast = None
        if method == "broadcast":
            if backend == "auto":
                backend = "nccl" if uses_gpus else "gloo"
            self.broadcast = BroadcastSync(learners.group, rollouts.group, bucket_bytes,
                                           backend)
        self._weights: dict[str, torch.Tensor] | None = None
        self.push_bytes = 0

    def push(self, version: int) -> None:
        """The learners' current weights, labelled `version`, into every engine."""
        if self.broadcast is not None:
            self.broadcast.send(version)
            self.push_bytes = sum(bucket.nbytes for bucket in self.broadcast.plan.buckets)
            self.rollouts.set_weights_later(self.learners.weights, version)
            self._weights = None
            return
        self._weights = self.learners.weights()
        if self.to_engines:
            self.rollouts.set_weights(self._weights, version)
            self.push_bytes = state_bytes(self._weights)

    def current(self) -> dict[str, torch.Tensor]:
        """The weights of the last push (fetched from learner rank 0 when the broadcast
        path kept none)."""
        if self._weights is None:
            self._weights = self.learners.weights()
        return self._weights
