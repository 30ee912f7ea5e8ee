"""The rollout workers as one: the driver's rollout verbs over RolloutWorker actors.

    rollouts = RolloutGroup(WorkerGroup(backend, [WorkerSpec(RolloutWorker, ...), ...]))
    rollouts.num_tasks()                               the env's train tasks
    rollouts.rollout(jobs, on_group_done, need=6)      each group once; past `need`, cut
    rollouts.rollout_many(calls, on_group_done)        several groups per call, shared batches
    rollouts.set_weights(weights, version)             every engine now and every replacement
    rollouts.set_weights_later(weights_of, version)    only replacements (after a broadcast)

A group's job runs on whichever worker is idle; a worker that dies has its job run again
elsewhere and is replaced (trainers.distributed.WorkerGroup.map), so no group is lost or
counted twice. `on_group_done(result, worker_group)` runs as each group finishes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from trainers.distributed import WorkerGroup
from trainers.rl.rollout_worker import RolloutJob, RolloutResult, RolloutWorker

GroupDone = Callable[[RolloutResult, WorkerGroup], None]


class RolloutGroup:
    """The run's rollout workers (RolloutWorker) behind the driver's verbs."""

    def __init__(self, group: WorkerGroup):
        self.group = group

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def restarts(self) -> int:
        """Replacement workers started so far."""
        return self.group.restarts

    @property
    def retried(self) -> int:
        """Groups played again because their worker died."""
        return self.group.retried

    @property
    def concurrent(self) -> bool:
        """Whether rollouts run while the driver does other work (Ray actors)."""
        return bool(self.group.backend.concurrent)

    def num_tasks(self) -> int:
        """Train tasks of the workers' environment."""
        return self.group.call_first(RolloutWorker.num_tasks)

    def rollout(self, jobs: Sequence[RolloutJob], on_group_done: GroupDone | None = None,
                need: int | None = None) -> list[RolloutResult | None]:
        """Every job's group, in job order; with `need` < len(jobs), once that many have
        finished the others are cancelled between turns and their results are None."""
        cut = need is not None and need < len(jobs)
        return self.group.map(RolloutWorker.rollout, list(jobs), on_group_done, need=need,
                              cancel=RolloutWorker.cancel if cut else None)

    def rollout_many(self, calls: Sequence[list[RolloutJob]],
                     on_group_done: GroupDone | None = None) -> list[RolloutResult]:
        """Each call's groups played at once by one worker (RolloutWorker.rollout_many), all
        results in job order."""
        def each_group(results: list[RolloutResult], group: WorkerGroup) -> None:
            for result in results:
                on_group_done(result, group)

        return [result for results in self.group.map(
            RolloutWorker.rollout_many, list(calls), each_group if on_group_done else None)
            for result in results]

    def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """`weights` into every engine (one copy in the object store on Ray), labelled
        `version`; a replacement started later loads them first."""
        self.group.call_sticky(RolloutWorker.set_weights, self.group.put(weights), version)

    def set_weights_later(self, weights_of: Callable[[], dict[str, torch.Tensor]],
                          version: int) -> None:
        """Only replacements started later load `weights_of()` (the live engines got
        `version` another way: the weight broadcast)."""
        group = self.group
        group.remember(RolloutWorker.set_weights, lambda: (group.put(weights_of()), version))

    def placements(self) -> list[Any]:
        """Where each live worker runs (trainers.backends.Placement), in worker order."""
        return self.group.placements()
