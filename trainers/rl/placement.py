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

The shared search service reserves nothing and stays outside the groups. This module
imports no Ray; trainers.distributed reserves the groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainers.distributed import Bundle, PlacementGroupSpec

if TYPE_CHECKING:
    from trainers.rl.config import RLConfig

PLACEMENTS = ("none", "colocated", "split")


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


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    # Zero entries are dropped: a bundle lists only what it reserves.
    return {name: float(value) for name, value in (("CPU", cpus), ("GPU", gpus)) if value > 0}


def placement_plan(config: RLConfig) -> PlacementPlan:
    """The placement groups and bundles of `config.run.placement` (module docstring)."""
    learner, rollout = config.learner, config.rollout
    n_learners, n_engines = learner.num_learners, rollout_actor_count(config)
    learner_bundle = _bundle(learner.cpus_per_learner, learner.gpus_per_learner)
    engine_bundle = _bundle(rollout.cpus_per_worker, rollout.gpus_per_worker)
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


def placement_problems(config: RLConfig) -> list[tuple[bool, str]]:
    """(ok, message) checks of run.placement for RLConfig.validate."""
    placement = config.run.placement
    placed = placement != "none"
    learner, rollout = config.learner, config.rollout
    return [
        (placement in PLACEMENTS,
         f"run.placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}"),
        (not placed or config.run.use_ray,
         f"run.placement {placement} places Ray actors: it needs run.use_ray: true (an "
         "in-process run has no actors to place)"),
        (not placed or bool(_bundle(learner.cpus_per_learner, learner.gpus_per_learner)),
         f"run.placement {placement} gives every learner a bundle of what it reserves, and "
         "Ray refuses an empty bundle: set learner.cpus_per_learner or "
         "learner.gpus_per_learner > 0"),
        (not placed or bool(_bundle(rollout.cpus_per_worker, rollout.gpus_per_worker)),
         f"run.placement {placement} gives every rollout worker a bundle of what it "
         "reserves, and Ray refuses an empty bundle: set rollout.cpus_per_worker or "
         "rollout.gpus_per_worker > 0"),
    ]
