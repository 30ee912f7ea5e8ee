"""The learners as one: a batch's rows dealt over them, their answers put back together.

    learners = LearnerGroup(WorkerGroup(backend, [WorkerSpec(Learner, ...)] * W))
    batch = learners.score(batch, answers)       # old / ref log-probs, IG probe scores
    metrics = learners.update(mini_batch)        # one optimizer step over all learners
    weights = learners.weights()                 # rank 0's (every rank holds the same)
    learners.save(path); learners.load(path)

The driver never sees the learners one by one. Learner r scores and trains rows r, r + W,
r + 2W, ... of what it is given; every learner scales its loss by its share of the
mini-batch's loss units (`LossTotals`), so their summed gradients are the one-learner
gradient, and `merge_metrics` turns their shares of the diagnostics into the batch's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trainers.batch import RolloutBatch
from trainers.distributed import WorkerGroup
from trainers.rl.learner import Learner, LossTotals, merge_metrics, policy_rows


def deal_rows(batch_size: int, world_size: int) -> list[list[int]]:
    """Learner r gets rows r, r + W, r + 2W, ..."""
    return [list(range(r, batch_size, world_size)) for r in range(world_size)]


def merge_scores(batch: RolloutBatch, shards: list[list[int]],
                 outputs: list[dict[str, torch.Tensor] | None]) -> RolloutBatch:
    """The batch with every learner's scores (Learner.score of its
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


class LearnerGroup:
    """The run's learners (trainers.rl.learner.Learner workers) behind the driver's verbs."""

    def __init__(self, group: WorkerGroup):
        self.group = group

    @property
    def size(self) -> int:
        return self.group.size

    def join(self) -> None:
        """Join the learners' process group. Rank 0 hosts the rendezvous, so its node's
        address is used; every rank joins at once (init_process_group blocks until all
        have)."""
        if self.size > 1:
            self.group.call(Learner.join, self.group.call_first(Learner.rendezvous_address))

    def score(self, batch: RolloutBatch, answers: list[list[str]],
              distractors: list[list[str]] | None = None) -> RolloutBatch:
        """Old / reference log-probs and probe scores of every row.
        distractors: per row, wrong answers for contrastive IG (Algorithm.probe_distractors)."""
        shards = deal_rows(batch.batch_size, self.size)
        outputs = self.group.call_each(Learner.score, [
            (batch.select(rows), [answers[i] for i in rows],
             None if distractors is None else [distractors[i] for i in rows])
            if rows else None for rows in shards])
        return merge_scores(batch, shards, outputs)

    def update(self, mini: RolloutBatch) -> dict[str, float]:
        """One optimizer step on `mini` (its rows dealt over the learners) and its metrics.
        A learner without rows still joins the gradient reduction (batch None)."""
        totals = LossTotals(tokens=int(mini.loss_mask.sum()), sequences=policy_rows(mini))
        outputs = self.group.call_each(Learner.update, [
            (mini.select(part) if part else None, totals)
            for part in deal_rows(mini.batch_size, self.size)])
        return merge_metrics(outputs)

    def weights(self) -> dict[str, torch.Tensor]:
        return self.group.call_first(Learner.weights)

    def save(self, directory: str | Path) -> None:
        """Every learner takes part (fsdp gathers its optimizer shards); rank 0 writes."""
        self.group.call(Learner.save, str(directory))

    def load(self, directory: str | Path) -> int:
        """Every learner loads `directory`; returns the updates it holds."""
        return self.group.call(Learner.load, str(directory))[0]

    def close(self) -> None:
        """Leave the process group, unless a call failed (then a learner may be stuck in a
        collective and `close` would queue behind it: the group is only shut down)."""
        try:
            if not self.group.broken:
                self.group.call(Learner.close)
        finally:
            self.group.shutdown()

