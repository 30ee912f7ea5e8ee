"""Placement groups (run.placement, trainers/rl/placement.py, trainers.distributed): the
config refuses layouts that cannot work; on a local Ray with CPU bundles each learner and
rollout worker reports the placement group and bundle Ray actually gave it (colocated: one
STRICT_PACK group; split: a PACK group of learners and a SPREAD group of engines), a run
completes a step in that layout and the groups are removed on close; a replacement worker
starts in the dead worker's bundle; a layout the cluster cannot hold fails with its reason.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.echo_worker import Echo
from tests.test_rl_driver import small_config
from trainers.backends import (
    Bundle,
    InProcess,
    PlacementGroupSpec,
    RayActors,
    WorkerSpec,
    backend_for,
)
from trainers.distributed import WorkerGroup
from trainers.rl import driver
from trainers.rl.cluster import start_workers
from trainers.rl.placement import actor_resources, placement_plan


def placed_config(policy_dir, output_dir, placement: str):
    """1 learner + 1 rollout worker on Ray, half a CPU each, one short step."""
    config = small_config(policy_dir, output_dir, steps=1)
    config.run = dataclasses.replace(config.run, use_ray=True, placement=placement,
                                     sample_trajectories=0)
    config.rollout = dataclasses.replace(config.rollout, num_workers=1, queries_per_step=1,
                                         cpus_per_worker=0.5)
    config.learner = dataclasses.replace(config.learner, cpus_per_learner=0.5)
    config.eval = dataclasses.replace(config.eval, before=False, after=False)
    return config


def test_placement_settings_that_cannot_work_are_refused_by_name(tmp_path, policy_dir):
    config = placed_config(policy_dir, tmp_path, "colocated")
    config.validate()
    config.run.use_ray, config.rollout.num_workers = False, 0  # only the placement needs Ray
    with pytest.raises(ValueError, match="run.placement colocated .* needs run.use_ray"):
        config.validate()
    config = placed_config(policy_dir, tmp_path, "packed")
    with pytest.raises(ValueError, match="run.placement must be one of none, colocated, split"):
        config.validate()
    config = placed_config(policy_dir, tmp_path, "split")
    config.rollout.cpus_per_worker = 0
    with pytest.raises(ValueError, match="rollout.cpus_per_worker or rollout.gpus_per_worker"):
        config.validate()
    config = placed_config(policy_dir, tmp_path, "split")
    config.learner.cpus_per_learner = 0
    with pytest.raises(ValueError, match="learner.cpus_per_learner or learner.gpus_per_learner"):
        config.validate()
    with pytest.raises(ValueError, match="placement groups need Ray"):
        backend_for(False, placement=[PlacementGroupSpec("g", ({"CPU": 1},), "PACK")])
    with pytest.raises(ValueError, match="placement groups need Ray"):
        InProcess().start(WorkerSpec(dict, bundle=Bundle("g", 0)))


@pytest.mark.parametrize("resources, message", [
    ({"CPU": 1}, r"rollout.ray_resources: 'CPU' is one of Ray's own resources"),
    ({"memory": 1}, r"rollout.ray_resources: 'memory' is one of Ray's own resources"),
    ({"rollout_node": "many"}, r"rollout.ray_resources.rollout_node must be a number > 0, "
                               r"got 'many'"),
    ({"rollout_node": 0}, r"rollout.ray_resources.rollout_node must be a number > 0, got 0"),
    ({"rollout_node": True}, r"must be a number > 0, got True"),
    ({"rollout_node": float("inf")}, r"must be a number > 0, got inf"),
    ({"": 1}, r"a resource name must be a non-empty string, got ''"),
    (["rollout_node"], r"rollout.ray_resources must be a mapping of resource name to amount"),
])
def test_custom_resources_that_cannot_work_are_refused_by_name(tmp_path, policy_dir,
                                                               resources, message):
    config = placed_config(policy_dir, tmp_path, "split")
    config.rollout.ray_resources = resources
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_custom_resources_need_ray_and_reach_bundles_and_actors(tmp_path, policy_dir):
    config = placed_config(policy_dir, tmp_path, "split")
    config.learner.ray_resources = {"learner_node": 0.5}
    config.rollout.ray_resources = {"rollout_node": 0.25, "fast_disk": 1}
    config.validate()
    plan = placement_plan(config)
    assert [g.bundles for g in plan.groups] == [
        ({"CPU": 0.5, "learner_node": 0.5},),
        ({"CPU": 0.5, "fast_disk": 1.0, "rollout_node": 0.25},)]
    assert actor_resources(0.5, 0.0, {"rollout_node": 0.25}) == {
        "num_cpus": 0.5, "num_gpus": 0.0, "resources": {"rollout_node": 0.25}}
    assert actor_resources(1.0, 1.0, {}) == {"num_cpus": 1.0, "num_gpus": 1.0}
    config.run.use_ray, config.run.placement, config.rollout.num_workers = False, "none", 0
    with pytest.raises(ValueError, match=r"learner.ray_resources and rollout.ray_resources "
                                         r"reserve Ray resources: they need run.use_ray"):
        config.validate()


@pytest.mark.ray
def test_plans_give_each_learner_and_engine_its_own_bundle(tmp_path, policy_dir):
    config = placed_config(policy_dir, tmp_path, "colocated")
    config.learner.num_learners, config.learner.gpus_per_learner = 2, 0.5
    config.rollout.num_workers, config.rollout.gpus_per_worker = 3, 0.5
    plan = placement_plan(config)
    assert [(g.name, g.strategy) for g in plan.groups] == [("colocated", "STRICT_PACK")]
    assert plan.groups[0].bundles == (({"CPU": 0.5, "GPU": 0.5},) * 5)
    assert plan.learners == (Bundle("colocated", 0), Bundle("colocated", 1))
    assert plan.rollouts == tuple(Bundle("colocated", i) for i in (2, 3, 4))
    config.run.placement = "split"
    config.rollout.cpus_per_worker = 0  # a GPU-only bundle lists the GPU only
    plan = placement_plan(config)
    assert [(g.name, g.strategy, g.bundles) for g in plan.groups] == [
        ("learners", "PACK", ({"CPU": 0.5, "GPU": 0.5},) * 2),
        ("engines", "SPREAD", ({"GPU": 0.5},) * 3)]
    assert plan.rollouts == tuple(Bundle("engines", i) for i in range(3))
    config.run.placement = "none"
    plan = placement_plan(config)
    assert plan.groups == () and plan.learners == (None, None)
    assert plan.rollouts == (None,) * 3


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False)
    yield ray
    ray.shutdown()


def group_state(ray, group_id: str) -> tuple[str, str]:
    from ray.util.placement_group import placement_group_table

    row = placement_group_table()[group_id]
    return row["strategy"], row["state"]


@pytest.mark.parametrize("placement, learner_group, engine_group, strategies", [
    ("colocated", "colocated", "colocated", {"colocated": "STRICT_PACK"}),
    ("split", "learners", "engines", {"learners": "PACK", "engines": "SPREAD"})])
@pytest.mark.ray
def test_actors_run_in_their_bundles_and_the_step_completes(
        tmp_path, policy_dir, local_ray, monkeypatch, placement, learner_group, engine_group,
        strategies):
    seen = {}

    def start_and_look(config, algorithm):
        workers = start_workers(config, algorithm)
        seen["groups"] = {name: g.id.hex() for name, g in workers.rollouts.group.backend.groups.items()}
        seen["learners"] = workers.learners.group.placements()
        seen["rollouts"] = workers.rollouts.placements()
        return workers

    monkeypatch.setattr(driver, "start_workers", start_and_look)
    result = driver.train(placed_config(policy_dir, tmp_path / placement, placement))
    assert len(result.history) == 1
    assert result.history[0]["rollout_logprob_diff_max"] < 1e-4  # the engine got the weights
    groups = seen["groups"]
    assert {name: group_state(local_ray, gid)[0] for name, gid in groups.items()} == strategies
    [learner], [engine] = seen["learners"], seen["rollouts"]
    assert (learner.placement_group, learner.bundle_index) == (groups[learner_group], 0)
    assert (engine.placement_group, engine.bundle_index) == (
        groups[engine_group], 1 if placement == "colocated" else 0)
    assert learner.node == engine.node is not None
    # close() removed the groups (and so released their reserved CPUs).
    assert {group_state(local_ray, gid)[1] for gid in groups.values()} == {"REMOVED"}


@pytest.mark.ray
def test_a_replacement_starts_in_the_dead_workers_bundle(local_ray):
    backend = RayActors(placement=[PlacementGroupSpec("pair", ({"CPU": 0.25},) * 2, "PACK")])
    try:
        group = WorkerGroup(backend, [WorkerSpec(Echo, resources={"num_cpus": 0.25},
                                                 bundle=Bundle("pair", i)) for i in (0, 1)],
                            max_restarts=1)
        pair = backend.groups["pair"].id.hex()
        assert [(p.placement_group, p.bundle_index) for p in group.placements()] == [
            (pair, 0), (pair, 1)]
        local_ray.kill(group.workers[0])
        assert group.map(Echo.square, [1, 2, 3, 4]) == [1, 4, 9, 16]
        assert group.restarts == 1
        # The survivor is bundle 1; the replacement took the freed bundle 0.
        assert sorted(p.bundle_index for p in group.placements()) == [0, 1]
    finally:
        backend.close()
    assert group_state(local_ray, pair)[1] == "REMOVED"


@pytest.mark.ray
def test_a_layout_the_cluster_cannot_hold_fails_with_its_reason(local_ray):
    from ray.util.placement_group import placement_group_table

    before = set(placement_group_table())
    with pytest.raises(RuntimeError, match=r"placement group 'big' \(STRICT_PACK, bundles "
                                           r"\[\{'CPU': 8\.0\}\]\) could not be reserved"):
        RayActors(placement=[PlacementGroupSpec("big", ({"CPU": 8.0},), "STRICT_PACK")],
                  placement_timeout_s=2)
    new = set(placement_group_table()) - before
    assert {group_state(local_ray, gid)[1] for gid in new} == {"REMOVED"}
