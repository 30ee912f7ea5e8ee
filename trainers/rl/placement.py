"""Where the RL run's actors go: `run.placement` turned into Ray placement groups.

    plan = placement_plan(config)       # groups to reserve, a bundle per learner and engine
    backend_for(..., placement=plan.groups); WorkerSpec(..., bundle=plan.learners[rank])

One bundle per learner and one per rollout worker (engine), each holding what that actor
reserves (`cpus_per_*`, `gpus_per_*`), so an actor never competes with another for its
share. The layouts:

* `none`: no placement group; Ray's default scheduler places each actor (as before).
* `colocated`: one STRICT_PACK group holding every learner and engine bundle: all on one
  node, so an engine can share a learner's GPU (fractional `gpus_per_*`, e.g. 0.5 each)
  and weights move within the node. The node must hold every bundle.
* `split`: learners and engines in groups of their own. Learners PACK (as few nodes as
  possible: their gradient all-reduce is fastest inside a node); engines SPREAD (over as
  many nodes as possible, so a lost node takes few of them). Each bundle holds its own
  share, so with whole GPUs no engine lands on a learner's GPU.

Custom resources (`learner.ray_resources`, `rollout.ray_resources`, e.g. {learner_node:
0.01}) go into each bundle and actor as well, so that learners and engines land only on the
nodes that declare them (`ray start --resources ...`), in any layout.

The shared search service reserves nothing and stays outside the groups. This module
imports no Ray; trainers.backends reserves the groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainers.backends import Bundle, PlacementGroupSpec
from trainers.rl.config import PLACEMENTS, RLConfig


@dataclass(frozen=True)
class PlacementPlan:
    """The groups to reserve and the bundle of each learner (by rank) and rollout worker
    (by index); all empty / None for `none`."""

    groups: tuple[PlacementGroupSpec, ...]
    learners: tuple[Bundle | None, ...]
    rollouts: tuple[Bundle | None, ...]


def rollout_actor_count(config: RLConfig) -> int:
    """Rollout actors a Ray run starts (num_workers 0 still means one actor on Ray)."""
    return max(1, config.rollout.num_workers)


def _bundle(cpus: float, gpus: float, custom: Mapping[str, float] | None = None
            ) -> dict[str, float]:
    # Zero entries are dropped: a bundle lists only what it reserves.
    return {name: float(value) for name, value in (("CPU", cpus), ("GPU", gpus),
                                                    *sorted((custom or {}).items()))
            if value > 0}


def actor_resources(cpus: float, gpus: float, custom: Mapping[str, float]
                    ) -> dict[str, Any]:
    """Ray actor options reserving what a learner or rollout worker's bundle holds."""
    options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": gpus}
    if custom:
        options["resources"] = {name: float(value) for name, value in sorted(custom.items())}
    return options


def placement_plan(config: RLConfig) -> PlacementPlan:
    """The placement groups and bundles of `config.run.placement` (module docstring)."""
    learner, rollout = config.learner, config.rollout
    n_learners, n_engines = learner.num_learners, rollout_actor_count(config)
    learner_bundle = _bundle(learner.cpus_per_learner, learner.gpus_per_learner,
                             learner.ray_resources)
    engine_bundle = _bundle(rollout.cpus_per_worker, rollout.gpus_per_worker,
                            rollout.ray_resources)
    if config.run.placement == "none":
        return PlacementPlan((), (None,) * n_learners, (None,) * n_engines)
    if config.run.placement == "colocated":
        group = PlacementGroupSpec(
            "colocated", (learner_bundle,) * n_learners + (engine_bundle,) * n_engines,
            "STRICT_PACK")
        return PlacementPlan(
            (group,), tuple(Bundle("colocated", r) for r in range(n_learners)),
            tuple(Bundle("colocated", n_learners + i) for i in range(n_engines)))
    if config.run.placement == "split":
        return PlacementPlan(
            (PlacementGroupSpec("learners", (learner_bundle,) * n_learners, "PACK"),
             PlacementGroupSpec("engines", (engine_bundle,) * n_engines, "SPREAD")),
            tuple(Bundle("learners", r) for r in range(n_learners)),
            tuple(Bundle("engines", i) for i in range(n_engines)))
    raise ValueError(f"run.placement must be one of {', '.join(PLACEMENTS)}, "
                     f"got {config.run.placement!r}")
