"""benchmarks/learning_check.py: --trained (policies an earlier check trained are played
instead of trained again, a wrong pair is refused with its reason) and the equal-time sft
arm (its worlds and budget checked before anything runs; at toy size, it continues the
start within its time, data included)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def learning_check():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its sibling rl_checks
    try:
        spec = importlib.util.spec_from_file_location("learning_check",
                                                      BENCHMARKS / "learning_check.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def _policy(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    return directory


def test_trained_arms_map_to_their_directories(learning_check, tmp_path):
    igpo = _policy(tmp_path / "igpo" / "final")
    placebo = _policy(tmp_path / "placebo" / "final")
    assert learning_check.parse_trained([f"igpo={igpo}", f"placebo={placebo}"], ["grpo"]) \
        == {"igpo": str(igpo), "placebo": str(placebo)}
    assert learning_check.parse_trained([], ["igpo"]) == {}


def test_an_arms_checkpoints_play_beside_it_under_their_step(learning_check, tmp_path):
    step16 = _policy(tmp_path / "igpo" / "checkpoint-000016" / "policy")
    step32 = _policy(tmp_path / "igpo" / "checkpoint-000032" / "policy")
    assert learning_check.parse_trained([f"igpo@16={step16}", f"igpo@32={step32}"], ["igpo"]) \
        == {"igpo@16": str(step16), "igpo@32": str(step32)}


@pytest.mark.parametrize("pair, arms, says", [
    ("ppo={p}", ["grpo"], "ARM one of"),          # not an arm of the check
    ("{p}", ["grpo"], "ARM one of"),              # no ARM=
    ("igpo={p}", ["igpo", "grpo"], "in --arms"),  # trained here as well
    ("igpo={p}/missing", ["grpo"], "not a saved policy"),
    ("igpo@last={p}", ["grpo"], "STEP a whole number"),
    ("igpo@={p}", ["grpo"], "STEP a whole number"),
    ("ppo@16={p}", ["grpo"], "ARM one of"),
])
def test_wrong_trained_pairs_are_refused_with_the_reason(learning_check, tmp_path, pair, arms,
                                                         says):
    policy = _policy(tmp_path / "final")
    with pytest.raises(SystemExit, match=says):
        learning_check.parse_trained([pair.format(p=policy)], arms)


def test_an_arm_given_twice_is_refused(learning_check, tmp_path):
    policy = _policy(tmp_path / "final")
    with pytest.raises(SystemExit, match="already given"):
        learning_check.parse_trained([f"igpo={policy}", f"igpo={policy}"], ["grpo"])


def test_an_sft_arm_policy_can_be_reused(learning_check, tmp_path):
    sft = _policy(tmp_path / "sft" / "final")
    assert learning_check.parse_trained([f"sft={sft}"], ["igpo"]) == {"sft": str(sft)}


def _sft_args(learning_check, tmp_path, *extra, worlds=None):
    config = learning_check.DEFAULT_SFT_CONFIG
    if worlds is not None:
        text = config.read_text().replace("world_seeds: [37, 38, 39, 40, 41, 42, 43, 44]",
                                          f"world_seeds: {worlds}")
        config = tmp_path / "sft.yaml"
        config.write_text(text)
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--sft-config", default=str(config))
    parser.add_argument("--sft-seconds", type=float, default=None)
    parser.add_argument("--validation-world", type=int, default=45)
    return parser.parse_args(list(extra))


@pytest.mark.parametrize("worlds, held_out_world, says", [
    ("[37, 0]", None, r"include \[0\]"), ("[45, 46]", None, r"include \[45\]"),
    ("[37, 0]", 50, r"include \[0\]"), ("[37, 50]", 50, r"include \[50\].*worlds \[45, 50\]")])
def test_an_sft_arm_on_a_world_rl_or_the_evaluation_plays_is_refused(learning_check, tmp_path,
                                                                     worlds, held_out_world,
                                                                     says):
    args = _sft_args(learning_check, tmp_path, worlds=worlds)
    with pytest.raises(SystemExit, match=says):
        learning_check.check_sft_arm(args, rl_world=0, igpo_trained_here=True,
                                     held_out_world=held_out_world)


def test_an_sft_loss_mixed_into_rl_from_a_played_world_is_refused(learning_check, tmp_path):
    """learner.sft_config's episodes must come from worlds neither RL nor the evaluation
    plays, like the sft arm's; the shipped mix's worlds 37-44 pass."""
    mix = str(learning_check.REPO / "benchmarks" / "configs" / "learning_check_sft_mix.yaml")
    learning_check.check_sft_worlds(mix, "the SFT loss mixed into RL", 0, 45)
    bad = _sft_args(learning_check, tmp_path, worlds="[37, 45]").sft_config
    with pytest.raises(SystemExit, match=r"the SFT loss mixed into RL's worlds .* include \[45\]"):
        learning_check.check_sft_worlds(bad, "the SFT loss mixed into RL", 0, 45)


def test_an_sft_arm_needs_a_budget(learning_check, tmp_path):
    learning_check.check_sft_arm(_sft_args(learning_check, tmp_path), 0, True)  # IGPO's time
    learning_check.check_sft_arm(_sft_args(learning_check, tmp_path, "--sft-seconds", "60"),
                                 0, False)
    with pytest.raises(SystemExit, match="give --sft-seconds"):
        learning_check.check_sft_arm(_sft_args(learning_check, tmp_path), 0, False)
    with pytest.raises(SystemExit, match="must be > 0"):
        learning_check.check_sft_arm(_sft_args(learning_check, tmp_path, "--sft-seconds", "0"),
                                     0, True)


@pytest.fixture
def toy_sft_config(learning_check, tmp_path):
    path = tmp_path / "toy_sft.yaml"
    path.write_text(learning_check.DEFAULT_SFT_CONFIG.read_text()
                    .replace("num_episodes: 4000", "num_episodes: 6"))
    return path


def test_the_sft_arm_continues_the_start_within_its_time(learning_check, tmp_path,
                                                         toy_sft_config):
    import json

    import torch
    from rl_checks import train_sft_arm
    from safetensors.torch import load_file

    from trainers.modeling.models import resolve_model_path
    from trainers.modeling.warm_start import policy_record

    threads = torch.get_num_threads()
    try:  # threads=1: what one RL arm had when two trained side by side on 2 cores
        final, spent, history = train_sft_arm("warm-start", toy_sft_config, 120.0, 3,
                                              tmp_path / "check", threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert Path(final) == tmp_path / "check" / "sft" / "final" and history
    record = policy_record(final)
    assert record["start"] == "warm-start"
    # the arm's worlds, added to those of the start's SFT (worlds 1-36)
    assert set(record["sft_world_seeds"]) == set(range(1, 45))
    logged = json.loads((tmp_path / "check" / "sft" / "config.json").read_text())
    # the budget less the data's time goes to the loop; the seeds follow the check's
    assert 0 < logged["train"]["max_seconds"] < 120.0
    assert logged["train"]["seed"] == 3 and logged["data"]["seed"] == 3
    assert logged["train"]["threads_per_worker"] == 1
    start = load_file(resolve_model_path("warm-start") / "model.safetensors")
    trained = load_file(Path(final) / "model.safetensors")
    assert any(not torch.equal(start[name], trained[name]) for name in start)


def test_an_sft_arm_whose_time_goes_on_its_data_is_refused(learning_check, tmp_path,
                                                           toy_sft_config):
    from rl_checks import train_sft_arm

    with pytest.raises(SystemExit, match="went on building its data"):
        train_sft_arm("warm-start", toy_sft_config, 1e-3, 0, tmp_path / "check")


def test_the_evaluation_temperature_defaults_to_the_rollouts(learning_check):
    assert learning_check.check_eval_temperature(None, 1.0) == 1.0
    assert learning_check.check_eval_temperature(0.5, 1.0) == 0.5


@pytest.mark.parametrize("value", [0.0, -0.5, float("nan"), float("inf")])
def test_a_bad_evaluation_temperature_is_refused(learning_check, value):
    with pytest.raises(SystemExit, match="--eval-temperature must be a finite number > 0"):
        learning_check.check_eval_temperature(value, 1.0)


def test_a_check_with_nothing_to_train_or_play_is_refused(learning_check, tmp_path):
    with pytest.raises(SystemExit, match="nothing to compare"):
        learning_check.main(["--arms", "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()  # refused before anything was written


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_check_reads_name_dir_pairs_the_same_way(learning_check, tmp_path):
    """transfer_check's positional policies and token_drift's --policies go through the same
    parser as --trained: pairs in order, a missing policy or a reused name refused."""
    a, b = _policy(tmp_path / "a"), _policy(tmp_path / "b")
    transfer = _script("transfer_check")
    assert list(transfer.parse_policies([f"igpo={b}", f"placebo={a}"])) == ["igpo", "placebo"]
    with pytest.raises(SystemExit, match="'start' is already the start's name"):
        transfer.parse_policies([f"start={a}"])
    with pytest.raises(SystemExit, match="not a saved policy"):
        transfer.parse_policies([f"igpo={tmp_path / 'nothing'}"])
    drift = _script("token_drift")
    with pytest.raises(SystemExit, match="--policies 'x=.*': name 'x' is already given"):
        drift.main(["--policies", f"x={a}", f"x={b}", "--trajectories", "none.jsonl"])
    with pytest.raises(SystemExit, match="--policies takes NAME=DIR, got 'x='"):
        drift.main(["--policies", "x=", "--trajectories", "none.jsonl"])


def _run(outcomes_by_task: dict[str, list[float | None]]):
    """A played run as the checks see it: per task, its samples (outcome, task id, split)."""
    from types import SimpleNamespace

    return SimpleNamespace(per_task=[
        [SimpleNamespace(task_id=task, outcome=o, metadata={"held_out": "world 0 test"})
         for o in samples] for task, samples in outcomes_by_task.items()])


def test_task_outcomes_keep_every_sample_in_the_shared_task_order(learning_check):
    from rl_checks import outcome_spread, task_outcomes

    runs = {"start": _run({"a": [1.0, 0.0], "b": [None, 0.0], "c": [1.0, 1.0]}),
            "igpo": _run({"a": [1.0, 1.0], "b": [0.0, 0.0], "c": [0.0, 1.0]})}
    table = task_outcomes(runs)
    assert table["tasks"] == ["world 0 test/a", "world 0 test/b", "world 0 test/c"]
    assert table["outcomes"]["start"] == [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]  # None -> 0
    assert outcome_spread(table["outcomes"]["start"]) == {"all": 1, "none": 1, "mixed": 1}
    assert outcome_spread(table["outcomes"]["igpo"]) == {"all": 1, "none": 1, "mixed": 1}
    assert outcome_spread([[0.6, 0.4, 0.5]]) == {"all": 0, "none": 0, "mixed": 1}


def test_task_outcomes_refuse_runs_that_played_other_tasks(learning_check):
    from rl_checks import task_outcomes

    runs = {"start": _run({"a": [1.0], "b": [0.0]}), "igpo": _run({"b": [0.0], "a": [1.0]})}
    with pytest.raises(ValueError, match="igpo played other tasks than start"):
        task_outcomes(runs)


def test_played_trajectories_are_saved_as_text_per_policy(learning_check, tmp_path):
    from types import SimpleNamespace

    from rl_checks import save_played

    from trainers.trajectory import Trajectory, read_trajectories

    def played(task: str, outcome: float) -> Trajectory:
        return Trajectory(id=f"{task}/0", task_id=task, outcome=outcome,
                          messages=[{"role": "user", "content": "q"},
                                    {"role": "assistant", "content": "<answer>a</answer>"}],
                          input_ids=[1, 2, 3], loss_mask=[0, 1, 1], question_end=1,
                          metadata={"held_out": "world 0 test"})

    runs = {"start": SimpleNamespace(per_task=[[played("a", 1.0)], [played("b", 0.0)]]),
            "igpo": SimpleNamespace(per_task=[[played("a", 0.0)], [played("b", 0.0)]])}
    files = save_played(runs, tmp_path / "played")
    assert sorted(p.name for p in (tmp_path / "played").iterdir()) == ["igpo.jsonl", "start.jsonl"]
    start = read_trajectories(files["start"])
    assert [(t.task_id, t.outcome) for t in start] == [("a", 1.0), ("b", 0.0)]
    assert all(t.input_ids is None and t.loss_mask is None and t.question_end is None
               for t in start)
    assert [t.outcome for t in read_trajectories(files["igpo"])] == [0.0, 0.0]


def test_failure_counts_tally_each_policys_episodes_by_where_they_went_wrong(learning_check):
    from types import SimpleNamespace

    from rl_checks import failure_counts, failure_lines

    from trainers.trajectory import Trajectory, Turn

    def played(outcome: float, replies: list[str], last: str = "answer") -> Trajectory:
        turns = [Turn("search", True, "s", reply) for reply in replies]
        turns.append(Turn(last, last != "invalid", "<answer>x</answer>"))
        return Trajectory(id="t/0", task_id="t", answers=["Ada"], outcome=outcome, turns=turns,
                          messages=[{"role": "user", "content": "q"}])

    runs = {"start": SimpleNamespace(per_task=[[played(1.0, ["Ada"]), played(0.0, ["Ada"])],
                                               [played(0.0, ["Bo"]), played(0.0, [], "invalid")]]),
            "igpo": SimpleNamespace(per_task=[[played(0.0, ["Bo"]), played(0.0, ["Bo"])],
                                              [played(1.0, ["Ada"]), played(1.0, ["Ada"])]])}
    counts = failure_counts(runs)
    assert counts == {
        "start": {"correct": 1, "no answer": 1, "read the gold, answered wrong": 1,
                  "never read the gold": 1},
        "igpo": {"correct": 2, "no answer": 0, "read the gold, answered wrong": 0,
                 "never read the gold": 2}}
    lines = failure_lines(counts)
    assert lines[0].startswith("| policy | correct | no answer |")
    assert lines[2] == "| start | 1 (0.25) | 1 (0.25) | 1 (0.25) | 1 (0.25) |"
    assert lines[3] == "| igpo | 2 (0.50) | 0 (0.00) | 0 (0.00) | 2 (0.50) |"


def _evaluation(outcomes_by_task: dict[tuple[str, str], list[float]]):
    """A played run with its tasks on named held-out splits: {(split, task): outcomes}."""
    from types import SimpleNamespace

    from trainers.evaluation.evaluate import Evaluation

    return Evaluation(per_task=[
        [SimpleNamespace(task_id=task, outcome=o, metadata={"held_out": split})
         for o in samples] for (split, task), samples in outcomes_by_task.items()], k=2)


def test_split_tables_compare_each_held_out_split_alone(learning_check):
    from rl_checks import split_lines, split_tables

    start = _evaluation({("world 0 test", "a"): [1.0, 1.0], ("world 0 test", "b"): [1.0, 0.0],
                         ("world 45 test", "c"): [0.0, 0.0], ("world 45 test", "d"): [1.0, 0.0]})
    igpo = _evaluation({("world 0 test", "a"): [0.0, 0.0], ("world 0 test", "b"): [1.0, 0.0],
                        ("world 45 test", "c"): [0.0, 0.0], ("world 45 test", "d"): [1.0, 0.0]})
    tables = split_tables({"start": start, "igpo": igpo}, ["igpo"], seed=0)
    assert list(tables) == ["world 0 test", "world 45 test"]
    rl_world, unseen = tables["world 0 test"]["igpo"], tables["world 45 test"]["igpo"]
    assert (rl_world.a, rl_world.b, rl_world.diff) == (0.75, 0.25, -0.5)
    assert (unseen.a, unseen.b, unseen.diff, unseen.diff_se) == (0.25, 0.25, 0.0, 0.0)
    lines = split_lines(tables)
    assert lines[-2].startswith("| world 0 test | 0.750 | 0.250 (-0.500 ± ")
    assert lines[-1].startswith("| world 45 test | 0.250 | 0.250 (+0.000 ± 0.000, z +0.00)")


def test_held_out_world_defaults_to_the_rl_world_and_refuses_trained_ones(learning_check):
    info = {"sft_world_seeds": [1, 2, 3]}
    assert learning_check.check_held_out_world(None, 0, 45, info) == 0
    assert learning_check.check_held_out_world(0, 46, 45, info) == 0
    with pytest.raises(SystemExit, match="--held-out-world 2 is one of the start's SFT worlds"):
        learning_check.check_held_out_world(2, 46, 45, info)
    with pytest.raises(SystemExit, match="--held-out-world 45 is the validation world too"):
        learning_check.check_held_out_world(45, 46, 45, info)


@pytest.mark.parametrize("argv, says", [
    (["--train-only", "--arms"], "nothing to compare"),
    (["--train-only", "--arms", "--trained", "igpo={p}"], "--train-only trains the --arms"),
    (["--train-only", "--arms", "placebo", "--trained", "igpo={p}"],
     "--train-only trains the --arms")])
def test_train_only_needs_arms_and_plays_nothing(learning_check, tmp_path, argv, says):
    policy = _policy(tmp_path / "final")
    with pytest.raises(SystemExit, match=says):
        learning_check.main([a.format(p=policy) for a in argv]
                            + ["--output", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_arms_trained_side_by_side_are_the_runs_trained_one_after_the_other(
        learning_check, tmp_path, policy_dir):
    from rl_checks import resolve_jobs, train_arms

    from tests.test_rl_driver import small_config

    base = small_config(policy_dir, tmp_path / "unused", steps=1)
    base.eval = dataclasses.replace(base.eval, before=False, after=False)
    # one process with 2 threads against two with 1 each
    base.policy = dataclasses.replace(base.policy, threads=2)
    runs = {}
    for jobs in (1, 2):
        finals, seconds, histories = train_arms(base, ["igpo", "placebo"], 3,
                                                tmp_path / f"jobs{jobs}", jobs=jobs)
        assert set(seconds) == {"igpo", "placebo"} and all(s > 0 for s in seconds.values())
        assert all((Path(final) / "config.json").is_file() for final in finals.values())
        runs[jobs] = histories
    for arm in ("igpo", "placebo"):
        for alone, beside in zip(runs[1][arm], runs[2][arm], strict=True):
            assert alone["accuracy"] == beside["accuracy"]  # the same sampled episodes
            # the learner's sums may round differently at one thread than at two
            for key in ("kl", "policy_loss", "entropy", "grad_norm"):
                assert beside[key] == pytest.approx(alone[key], rel=1e-3, abs=1e-9)
    # each process's printed output went to its own arm's log
    for arm, other in (("igpo", "placebo"), ("placebo", "igpo")):
        log = (tmp_path / "jobs2" / f"{arm}.log").read_text()
        assert "step 1/1" in log and f"jobs2/{arm}:" in log and f"/{other}" not in log
    assert resolve_jobs(3) == 3
    with pytest.raises(SystemExit, match="--jobs must be >= 1"):
        resolve_jobs(0)


def test_the_report_of_a_check_without_rl_arms_has_its_tables_and_no_training_section(
        learning_check):
    """An sft-only check (or one playing policies trained elsewhere, without their logs) has
    no RL histories: the report still holds every paired table."""
    from rl_checks import report_lines, step_table

    from trainers.evaluation.paired import Difference

    table = {"pass@1": Difference(0.5, 0.05, 0.55, 0.05, 0.05, 0.02)}
    lines = report_lines("t", "intro", {}, {"sft vs start": table})
    text = "\n".join(lines)
    assert "## sft vs start" in text and "+0.050 ± 0.020" in text
    assert "Training, step by step" not in text
    with_history = "\n".join(report_lines("t", "intro", {"igpo": [{"accuracy": 0.25}]},
                                          {"igpo vs start": table}))
    assert "Training, step by step" in with_history and "| 0 | 0.250 |" in with_history
    with pytest.raises(ValueError, match="at least one arm"):
        step_table({})
