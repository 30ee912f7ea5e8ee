"""Faults of an RL run: a driver killed with SIGKILL anywhere (between groups, inside a
checkpoint write; in-process and on Ray) resumes with `run.resume: latest` to the
uninterrupted run's final weights and metrics bit for bit; a learner killed mid-update
stops the run with a message naming it and the last complete checkpoint; the driver joins
an existing Ray cluster through `run.ray_address` or RAY_ADDRESS (what `ray job submit`
sets) without declaring resources.

The killed driver is a subprocess (tests/rl_killed_driver.py); the Ray tests share one
Ray cluster started by another process, as `ray start` or a job's cluster would be.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.test_rl_driver import small_config as driver_config
from trainers.distributed import WorkerGroup
from trainers.rl.checkpoint import DRIVER_STATE_FILE, latest_rl_checkpoint
from trainers.rl.config import RLConfig, rl_config_to_dict
from trainers.rl.driver import train
from trainers.rl.learner import LEARNER_STATE_FILE, Learner
from trainers.run_log import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TIMING = {"time", "rollout_s", "score_s", "update_s", "learner_s", "tokens_per_s"}  # wall clock


def small_config(policy_dir: str, output_dir: Path) -> RLConfig:
    """tests/test_rl_driver.py's 2-step run, checkpointing every step, without the
    evaluation of the starting policy (the same in every run here)."""
    config = driver_config(policy_dir, output_dir)
    config.eval.before = False
    return config


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def metric_rows(output_dir: Path) -> list[dict]:
    """metrics.jsonl without its timing fields (null stays None, so rows compare)."""
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def kill_driver(config: RLConfig, *point: str) -> None:
    """Run `config`'s driver in a subprocess that SIGKILLs itself at `point`."""
    path = Path(config.run.output_dir).with_suffix(".yaml")
    path.write_text(yaml.safe_dump(rl_config_to_dict(config)))
    run = subprocess.run([sys.executable, "-m", "tests.rl_killed_driver", str(path), *point],
                         cwd=ROOT, env=environment(), capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == -signal.SIGKILL, run.stderr[-3000:]


def resumed(config: RLConfig):
    config.run.resume = "latest"
    return train(config)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, policy_dir):
    output = tmp_path_factory.mktemp("uninterrupted")
    result = train(small_config(policy_dir, output))
    return result, metric_rows(output)


def assert_same_run(result, output: Path, uninterrupted) -> None:
    reference, rows = uninterrupted
    weights, expected = result.weights, reference.weights
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[k], expected[k]) for k in weights)  # bit for bit
    assert metric_rows(output) == rows  # every step once, same numbers
    read_metrics(output / "metrics.jsonl")  # every line valid
    assert not list(output.glob(".checkpoint-*"))  # scratch directories cleaned


def test_checkpoints_are_renamed_into_place_complete(tmp_path, policy_dir):
    """latest only returns complete checkpoint directories, never a scratch one."""
    from trainers.checkpoint_files import latest_complete, new_scratch, publish

    target = tmp_path / "checkpoint-000002"
    scratch = new_scratch(target)
    (scratch / "a").write_text("new")
    older = tmp_path / "checkpoint-000001"
    older.mkdir()
    (older / "a").write_text("old")
    (tmp_path / "checkpoint-000003").mkdir()  # written in place and cut short: no file
    assert latest_complete(tmp_path, ["a"]) == older
    publish(scratch, target)
    assert latest_complete(tmp_path, ["a"]) == target
    again = new_scratch(target)
    (again / "a").write_text("newer")
    publish(again, target)  # re-saving a step replaces it whole
    assert (target / "a").read_text() == "newer"
    assert not list(tmp_path.glob(".checkpoint-*"))


@pytest.mark.parametrize("point", ["after-group", "in-checkpoint"])
def test_in_process_driver_killed_resumes_to_the_same_weights_and_metrics(
        tmp_path, policy_dir, uninterrupted, point):
    config = small_config(policy_dir, tmp_path / "run")
    output = Path(config.run.output_dir)
    if point == "after-group":
        # A seeded point in step 1 (2 groups a step): checkpoint-000001 exists.
        kill_driver(config, "after-group", str(random.Random(0).choice([3, 4])))
        # As if the kill also tore a metrics line in the middle of its write.
        with (output / "metrics.jsonl").open("a") as handle:
            handle.write('{"step": 1, "loss')
    else:
        # Every file of checkpoint-000002 written, the rename not done: the step-1 metrics
        # line is logged but the newest checkpoint is step 1, so step 1 runs again.
        kill_driver(config, "in-checkpoint", "2", "rename")
        scratch = list(output.glob(".checkpoint-000002.tmp-*"))
        assert scratch and (scratch[0] / DRIVER_STATE_FILE).is_file()
        assert [row["step"] for row in metric_rows(output)] == [0, 1]
    assert latest_rl_checkpoint(output).name == "checkpoint-000001"
    with pytest.warns(RuntimeWarning, match="unreadable last line") if \
            point == "after-group" else _no_warning():
        result = resumed(small_config(policy_dir, output))
    assert [h["step"] for h in result.history] == [1]
    assert_same_run(result, output, uninterrupted)


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --- on Ray ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    """A 2-CPU Ray cluster owned by another process; yields its address."""
    head = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, ray; ray.init(num_cpus=2, include_dashboard=False); "
         "print(ray.get_runtime_context().gcs_address, flush=True); sys.stdin.read(); "
         "ray.shutdown()"],
        cwd=ROOT, env=environment(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True)
    try:
        address = head.stdout.readline().strip()
        assert address, "the Ray head did not start"
        yield address
    finally:
        head.stdin.close()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()


def on_ray(config: RLConfig, learners: int = 1) -> RLConfig:
    config.run.use_ray = True
    config.rollout = dataclasses.replace(config.rollout, num_workers=1, cpus_per_worker=0.5)
    config.learner = dataclasses.replace(config.learner, num_learners=learners,
                                         cpus_per_learner=0.5)
    return config


@pytest.mark.ray
@pytest.mark.slow
def test_ray_driver_killed_during_a_checkpoint_resumes_through_ray_address(
        tmp_path, policy_dir, uninterrupted, ray_cluster, monkeypatch):
    """The driver joins the cluster by run.ray_address, is killed after its learner wrote
    checkpoint-000002's state; the resumed driver joins by RAY_ADDRESS (as under
    `ray job submit`) with run.ray_address empty."""
    import ray

    config = on_ray(small_config(policy_dir, tmp_path / "run"))
    config.run.ray_address = ray_cluster
    kill_driver(config, "in-checkpoint", "2", "learner")
    output = Path(config.run.output_dir)
    scratch = list(output.glob(".checkpoint-000002.tmp-*"))
    assert scratch and (scratch[0] / LEARNER_STATE_FILE).is_file()
    assert not (scratch[0] / DRIVER_STATE_FILE).exists()
    assert latest_rl_checkpoint(output).name == "checkpoint-000001"
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster)
    try:
        result = resumed(on_ray(small_config(policy_dir, output)))
        assert ray.get_runtime_context().gcs_address == ray_cluster  # joined, not started
    finally:
        ray.shutdown()
    assert_same_run(result, output, uninterrupted)


@pytest.mark.ray
@pytest.mark.slow
def test_ray_learner_killed_mid_update_stops_the_run_naming_it_and_the_checkpoint(
        tmp_path, policy_dir, ray_cluster, monkeypatch):
    """Two learners; learner 1 is killed right after step 1's update reached both (its
    peer then waits in, or fails out of, the gradient all-reduce)."""
    import ray

    config = on_ray(small_config(policy_dir, tmp_path / "run"), learners=2)
    updates = []
    call_each = WorkerGroup.call_each
    per_step = config.learner.mini_batches * config.learner.ppo_epochs  # optimizer steps

    def kill_learner_1_in_step_1(group, verb, args):
        if group.role == "learner" and verb is Learner.update:
            updates.append(verb)
            if len(updates) == per_step + 1:  # step 1's first optimizer step
                collect = group._collect

                def kill_then_collect(calls):
                    ray.kill(group.workers[1])
                    return collect(calls)

                group._collect = kill_then_collect
        return call_each(group, verb, args)

    monkeypatch.setattr(WorkerGroup, "call_each", kill_learner_1_in_step_1)
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster)
    try:
        with pytest.raises(RuntimeError) as raised:
            train(config)
    finally:
        ray.shutdown()
    message = str(raised.value)
    assert "learner 1 died" in message
    assert "checkpoint-000001" in message and "run.resume: latest" in message
    assert "nothing was saved" in message
    assert latest_rl_checkpoint(tmp_path / "run").name == "checkpoint-000001"
    assert [row["step"] for row in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [0]
