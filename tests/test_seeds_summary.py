"""benchmarks/seeds_summary.py: a run's row repeats the learning check's own paired numbers
(the same bootstrap, seeded with the check's seed), the pooled and across-runs estimates
match hand computation, and checks that cannot be pooled are refused with the reason."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import statistics
import sys
from pathlib import Path

import pytest

from trainers.evaluation.evaluate import Evaluation
from trainers.evaluation.paired import compare
from trainers.trajectory import Trajectory, Turn

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def summary():
    return _load("seeds_summary")


def _evaluation(outcomes: list[list[float]]) -> Evaluation:
    groups = [[Trajectory(id=f"t{i}-{j}", messages=[], task_id=f"task-{i}",
                          turns=[Turn(kind="answer", valid=True, assistant="a")],
                          outcome=value, metadata={"held_out": "world 0 test"})
               for j, value in enumerate(samples)] for i, samples in enumerate(outcomes)]
    return Evaluation(per_task=groups, k=len(outcomes[0]), seeds=[0] * len(outcomes))


def _write(path: Path, seed: int, tasks: list[str], outcomes: dict[str, list[list[float]]]):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"seed": seed, "per_task": {"tasks": tasks,
                                                            "outcomes": outcomes}}))
    return path


def test_a_runs_row_repeats_the_checks_paired_numbers(summary, tmp_path):
    rng = random.Random(7)
    start = [[float(rng.random() < 0.5) for _ in range(2)] for _ in range(40)]
    igpo = [[float(rng.random() < 0.6) for _ in range(2)] for _ in range(40)]
    evaluations = {"start": _evaluation(start), "igpo": _evaluation(igpo)}
    # What the check writes to results.json, from the same evaluations.
    outcomes = _load("rl_checks").task_outcomes(evaluations)
    path = _write(tmp_path / "seed3" / "results.json", 3, outcomes["tasks"],
                  outcomes["outcomes"])

    run = summary.load_run(path)
    row = summary.compare_runs([run], "start", "igpo")
    (label, change), = row["runs"]
    checks_own = compare(evaluations["start"], evaluations["igpo"], seed=3)["pass@1"]
    assert label == "seed3"
    assert (change.diff, change.se) == pytest.approx((checks_own.diff, checks_own.diff_se),
                                                     abs=1e-12)
    assert change.se > 0
    # One run: nothing to pool.
    assert row["pooled"] is None and row["across"] is None


def test_pooled_and_across_runs_estimates_match_hand_computation(summary, tmp_path):
    tasks = [f"w/task-{i}" for i in range(4)]
    # Run a: igpo solves task 0 where the start did not (+0.25 over 4 tasks); run b: igpo
    # loses half of task 1 (-0.125); run c: no change.
    runs = [
        _write(tmp_path / "a" / "results.json", 0, tasks,
               {"start": [[0, 0], [1, 1], [0, 1], [1, 0]], "igpo": [[1, 1], [1, 1], [0, 1], [1, 0]]}),
        _write(tmp_path / "b" / "results.json", 1, tasks,
               {"start": [[0, 0], [1, 1], [0, 1], [1, 0]], "igpo": [[0, 0], [1, 0], [0, 1], [1, 0]]}),
        _write(tmp_path / "c" / "results.json", 2, tasks,
               {"start": [[1, 0], [1, 1], [0, 0], [1, 1]], "igpo": [[1, 0], [1, 1], [0, 0], [1, 1]]}),
    ]
    loaded = [summary.load_run(path) for path in runs]
    row = summary.compare_runs(loaded, "start", "igpo")

    diffs = [change.diff for _, change in row["runs"]]
    assert diffs == [0.25, -0.125, 0.0]
    assert row["runs"][2][1].se == 0.0  # no task changed: nothing for the bootstrap to vary
    across = row["across"]
    assert across.diff == pytest.approx(0.125 / 3)
    assert across.se == pytest.approx(statistics.stdev(diffs) / math.sqrt(3))
    # Pooled: per task, the mean change over the runs (+1/3, -1/6, 0, 0), averaged.
    pooled = row["pooled"]
    assert pooled.diff == pytest.approx((1 / 3 - 1 / 6) / 4)
    assert 0 < pooled.se < 0.25


def test_the_report_lists_every_arm_and_the_result_lines(summary, tmp_path):
    tasks = ["w/t0", "w/t1", "w/t2"]
    both = {"start": [[0], [1], [0]], "igpo": [[1], [1], [0]], "placebo": [[0], [0], [0]]}
    one = _write(tmp_path / "s0" / "results.json", 0, tasks, {**both, "grpo": [[1], [1], [1]]})
    two = _write(tmp_path / "s1" / "results.json", 1, tasks, both)

    lines = summary.report([summary.load_run(one), summary.load_run(two)], samples=50)

    text = "\n".join(lines)
    grpo_row = next(line for line in lines if line.startswith("| grpo - start"))
    # GRPO was played in one run only: the other run's cell and the pooled ones are empty.
    assert grpo_row.count(" - |") == 3
    assert "| igpo - grpo |" in text and "| igpo - placebo |" in text
    assert "RESULT pooled_igpo_vs_start_pass1_z=" in text
    assert "RESULT across_igpo_vs_placebo_pass1_z=" in text
    # igpo - placebo is +2/3 in both runs: no spread, so its z is infinite.
    assert "RESULT across_igpo_vs_placebo_pass1_z=inf" in text


def test_checks_that_cannot_be_pooled_are_refused_with_the_reason(summary, tmp_path, capsys):
    first = _write(tmp_path / "s0" / "results.json", 0, ["w/t0", "w/t1"],
                   {"start": [[0], [1]], "igpo": [[1], [1]]})
    other_tasks = _write(tmp_path / "s1" / "results.json", 1, ["w/t0", "w/t9"],
                         {"start": [[0], [1]], "igpo": [[1], [1]]})
    assert summary.main([str(first), str(other_tasks)]) == 2
    error = capsys.readouterr().err
    assert "s1 played other tasks than s0" in error and "first difference at task 1" in error

    old = tmp_path / "old" / "results.json"
    old.parent.mkdir()
    old.write_text(json.dumps({"seed": 0, "tables": {}}))
    assert summary.main([str(first), str(old)]) == 2
    assert "no per_task outcomes" in capsys.readouterr().err

    short = _write(tmp_path / "short" / "results.json", 0, ["w/t0", "w/t1"],
                   {"start": [[0], [1]], "igpo": [[1]]})
    with pytest.raises(ValueError, match="arm 'igpo' has outcomes for 1 tasks"):
        summary.load_run(short)
    assert summary.main([str(tmp_path / "missing" / "results.json")]) == 2
    assert "no such file" in capsys.readouterr().err
