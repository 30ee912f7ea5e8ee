"""The RL run on a Ray cluster of several nodes, simulated on this machine with Ray's own
`ray.cluster_utils.Cluster` (a head and nodes with their own raylets and resources, added and
removed at will).

The cluster: a head that runs only the driver (0 CPUs, the dashboard for `ray job submit`),
one learner node and two rollout nodes (1 CPU each, custom resources `learner_node` /
`rollout_node` that `learner.ray_resources` / `rollout.ray_resources` ask for), and
`run.placement: split`. Checked, against the same run in this process:

* learners and engines start on the nodes their resources name (from the actors' own node
  ids), the engines spread over both rollout nodes; the weights reach engines on another
  node at every step; the seeded 2-step run's trajectories and metrics equal the in-process
  run's;
* a rollout node removed in the middle of a step: its groups run again on the other node,
  the step completes, every trajectory id once, the same trajectories as without the loss;
* the learner node removed in the middle of an update: the run stops at once with one line
  naming the lost node and what to do, and `run.resume: latest` on a new learner node
  continues from the last checkpoint to the uninterrupted run's weights and metrics bit
  for bit;
* `ray job submit` to the head runs `venus-gym rl --ray` with this layout to the end, its log
  streamed, the resolved config in the run directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.test_rl_driver import small_config
from tests.test_rl_faults import assert_same_run, metric_rows
from trainers.backends import free_address
from trainers.distributed import WorkerGroup
from trainers.modeling.models import load_causal_lm
from trainers.rl import driver
from trainers.rl.checkpoint import latest_rl_checkpoint
from trainers.rl.cluster import start_workers
from trainers.rl.config import RLConfig, rl_config_to_dict
from trainers.rl.learner import Learner

pytestmark = [pytest.mark.slow, pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[1]
LEARNER_NODE = {"num_cpus": 1, "resources": {"learner_node": 1}}
ROLLOUT_NODE = {"num_cpus": 1, "resources": {"rollout_node": 1}}


class SimulatedCluster:
    """A head (the driver, the dashboard) and learner / rollout nodes on this machine."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        self.dashboard = f"http://{free_address()}"
        port = int(self.dashboard.rsplit(":", 1)[1])
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": True, "dashboard_host": "127.0.0.1",
            "dashboard_port": port})
        self.nodes: dict[str, list] = {"learner": [], "rollout": []}
        self.add("learner")
        self.add("rollout")
        self.add("rollout")

    @property
    def address(self) -> str:
        return self.cluster.address

    def add(self, kind: str):
        node = self.cluster.add_node(**(LEARNER_NODE if kind == "learner" else ROLLOUT_NODE))
        self.nodes[kind].append(node)
        self.cluster.wait_for_nodes()
        return node

    def remove(self, node_id: str) -> str:
        """Remove the node with Ray id `node_id`; returns its kind."""
        for kind, nodes in self.nodes.items():
            for node in nodes:
                if node.node_id == node_id:
                    nodes.remove(node)
                    self.cluster.remove_node(node)
                    return kind
        raise AssertionError(f"no node {node_id} in the simulated cluster")

    def node_ids(self, kind: str) -> set[str]:
        return {node.node_id for node in self.nodes[kind]}

    def restore(self) -> None:
        """Back to one learner node and two rollout nodes."""
        for kind, count in (("learner", 1), ("rollout", 2)):
            while len(self.nodes[kind]) < count:
                self.add(kind)

    def shutdown(self) -> None:
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def cluster():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    simulated = SimulatedCluster()
    ray.init(address=simulated.address)
    try:
        yield simulated
    finally:
        ray.shutdown()
        simulated.shutdown()


def split_config(policy_dir: str, output_dir: Path) -> RLConfig:
    """tests/test_rl_driver.py's 2-step run on the cluster: 1 learner on the learner node, 2
    rollout workers over the rollout nodes (half a node each, so that one rollout node can
    hold both)."""
    config = small_config(policy_dir, output_dir)
    config.eval.before = False
    config.run = dataclasses.replace(config.run, use_ray=True, placement="split")
    config.learner = dataclasses.replace(config.learner, cpus_per_learner=0.5,
                                         ray_resources={"learner_node": 0.5})
    config.rollout = dataclasses.replace(config.rollout, num_workers=2, cpus_per_worker=0.5,
                                         ray_resources={"rollout_node": 0.5})
    return config


def in_process(config: RLConfig) -> RLConfig:
    """The same run in this process: no actors, no placement, no resources."""
    config.run = dataclasses.replace(config.run, use_ray=False, placement="none")
    config.learner = dataclasses.replace(config.learner, ray_resources={})
    config.rollout = dataclasses.replace(config.rollout, num_workers=0, ray_resources={})
    return config


@pytest.fixture(scope="module")
def reference(tmp_path_factory, policy_dir):
    """The uninterrupted in-process run: result, metric rows, trajectories per step."""
    output = tmp_path_factory.mktemp("in_process")
    result = driver.train(in_process(split_config(policy_dir, output)), keep_trajectories=True)
    return result, metric_rows(output)


def trajectories_by_id(step_trajectories) -> dict[str, list[int]]:
    ids = [t.id for t in step_trajectories]
    assert len(ids) == len(set(ids)), f"a trajectory counted twice: {sorted(ids)}"
    return {t.id: list(t.input_ids) for t in step_trajectories}


def assert_same_trajectories(result, reference_result) -> None:
    assert len(result.trajectories) == len(reference_result.trajectories)
    for step, (got, expected) in enumerate(zip(result.trajectories,
                                               reference_result.trajectories)):
        assert trajectories_by_id(got) == trajectories_by_id(expected), f"step {step}"


def without_fault_counters(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in ("worker_restarts", "retried_groups")}
            for row in rows]


def test_split_placement_puts_actors_on_their_nodes_and_matches_the_in_process_run(
        tmp_path, policy_dir, cluster, reference, monkeypatch):
    seen = {}

    def start_and_look(config, algorithm):
        workers = start_workers(config, algorithm)
        seen["learners"] = workers.learners.group.placements()
        seen["rollouts"] = workers.rollouts.placements()
        return workers

    monkeypatch.setattr(driver, "start_workers", start_and_look)
    result = driver.train(split_config(policy_dir, tmp_path), keep_trajectories=True)
    [learner] = seen["learners"]
    assert learner.node in cluster.node_ids("learner")
    engine_nodes = [p.node for p in seen["rollouts"]]
    assert sorted(engine_nodes) == sorted(cluster.node_ids("rollout"))  # one engine per node
    # Weights reached the engines on the other nodes: after every update (step 1's
    # rollouts ran on the weights step 0 trained), engine and learner log-probs agree.
    assert [row["rollout_logprob_diff_max"] < 1e-4 for row in result.history] == [True, True]
    # One push: the weights in fp32, tied embeddings once (4 bytes a parameter).
    parameters = sum(p.numel() for p in load_causal_lm(policy_dir).parameters())
    assert [row["sync_bytes"] for row in result.history] == [4.0 * parameters] * 2
    assert_same_trajectories(result, reference[0])
    assert metric_rows(tmp_path) == reference[1]
    assert all(torch.equal(result.weights[k], reference[0].weights[k]) for k in result.weights)


def test_a_rollout_node_lost_mid_step_replays_its_groups_on_the_other(
        tmp_path, policy_dir, cluster, monkeypatch):
    """4 groups a step for 2 workers: when step 0's first group is back, the node of the
    other worker is removed; its group (running, or finished but not yet collected) or the
    next one it is given is lost with it and runs again on the surviving node."""
    seen: dict = {"removed": None}

    def start_and_look(config, algorithm):
        workers = start_workers(config, algorithm)
        rollouts = workers.rollouts.group
        seen["nodes"] = {rollouts.names[w]: p.node for w, p in zip(rollouts.workers,
                                                                   rollouts.placements())}
        return workers

    def lose_the_other_rollout_node(result, group: WorkerGroup) -> None:
        if seen["removed"] is None:
            [other] = [name for name in seen["nodes"] if name != result.worker]
            seen["removed"] = seen["nodes"][other]
            assert cluster.remove(seen["removed"]) == "rollout"

    def four_groups(config: RLConfig) -> RLConfig:
        config.rollout.queries_per_step = 4
        return config

    expected = driver.train(in_process(four_groups(split_config(
        policy_dir, tmp_path / "in_process"))), keep_trajectories=True)
    monkeypatch.setattr(driver, "start_workers", start_and_look)
    try:
        result = driver.train(four_groups(split_config(policy_dir, tmp_path / "lost")),
                              on_group_done=lose_the_other_rollout_node,
                              keep_trajectories=True)
    finally:
        cluster.restore()
    assert seen["removed"] is not None
    assert result.history[0]["retried_groups"] >= 1  # the lost node's group ran again
    assert result.history[-1]["worker_restarts"] >= 1  # a replacement on the other node
    assert [len(step) for step in result.trajectories] == [8, 8]  # 4 groups x G = 2
    assert_same_trajectories(result, expected)
    assert without_fault_counters(metric_rows(tmp_path / "lost")) == \
        without_fault_counters(metric_rows(tmp_path / "in_process"))


def test_the_learner_node_lost_mid_update_stops_the_run_and_it_resumes_exactly(
        tmp_path, policy_dir, cluster, reference, monkeypatch):
    """Step 1's first update is under way when the learner node is removed: one line names
    the node, the last checkpoint (step 1) and run.resume; a new learner node joins and the
    resumed run ends where the uninterrupted one did."""
    import ray

    config = split_config(policy_dir, tmp_path / "run")
    updates = []
    call_each = WorkerGroup.call_each
    per_step = config.learner.mini_batches * config.learner.ppo_epochs

    def lose_the_learner_node_in_step_1(group, verb, args):
        if group.role == "learner" and verb is Learner.update:
            updates.append(verb)
            if len(updates) == per_step + 1:
                collect = group._collect

                def remove_then_collect(calls):
                    group._collect = collect  # once
                    [node] = group.nodes.values()  # recorded when the learner started
                    seen["node"] = node
                    assert cluster.remove(node) == "learner"
                    return collect(calls)

                group._collect = remove_then_collect
        return call_each(group, verb, args)

    seen: dict = {}
    monkeypatch.setattr(WorkerGroup, "call_each", lose_the_learner_node_in_step_1)
    try:
        with pytest.raises(RuntimeError) as raised:
            driver.train(config)
    finally:
        monkeypatch.undo()
        cluster.restore()
    message = str(raised.value)
    assert "\n" not in message
    assert "learner 0 died (its node " in message and seen["node"][:12] in message
    assert "left the cluster" in message
    assert "checkpoint-000001" in message and "run.resume: latest" in message
    assert latest_rl_checkpoint(tmp_path / "run").name == "checkpoint-000001"
    assert ray.is_initialized()  # the driver stays connected; the resumed run reuses it
    config = split_config(policy_dir, tmp_path / "run")
    config.run.resume = "latest"
    result = driver.train(config)
    assert [h["step"] for h in result.history] == [1]
    assert_same_run(result, tmp_path / "run", reference[:1] + (reference[1],))


def test_ray_job_submit_runs_the_split_layout_to_the_end(tmp_path, policy_dir,
                                                         cluster):
    """What a cluster user runs: `ray job submit` to the head's dashboard, the driver
    started there with RAY_ADDRESS, `venus-gym rl --ray` with the split layout."""
    output = tmp_path / "job"
    config = split_config(policy_dir, output)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(rl_config_to_dict(config)))
    env_vars = {"PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    ray_cli = Path(sys.executable).parent / "ray"
    job = subprocess.run(
        [str(ray_cli), "job", "submit", "--address", cluster.dashboard,
         "--runtime-env-json", json.dumps({"env_vars": env_vars}), "--",
         sys.executable, "-m", "trainers.cli", "rl", "--ray", "--config", str(path)],
        capture_output=True, text=True, timeout=600, env={**os.environ, **env_vars})
    log = job.stdout + job.stderr
    assert job.returncode == 0, log[-4000:]
    assert "succeeded" in log
    assert "step 2/2" in log  # the driver's progress lines, streamed back
    assert [row["step"] for row in metric_rows(output)] == [0, 1]
    written = json.loads((output / "config.json").read_text())
    assert written["run"]["placement"] == "split"
    assert written["learner"]["ray_resources"] == {"learner_node": 0.5}
    assert (output / "final" / "model.safetensors").is_file()
