"""Paired held-out evaluation (trainers.evaluation.paired): the statistics of a paired comparison
on hand-built trajectories, and that two policies meet the same tasks under the same random
numbers (the same weights give the same episodes; another seed gives others)."""

from __future__ import annotations

import math

import pytest

from trainers.data.oracle_data import world_texts
from trainers.evaluation.evaluate import Evaluation
from trainers.evaluation.paired import HeldOut, compare, comparison_lines, paired_evaluate
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.trajectory import Trajectory, Turn

# No tool timeout: on a loaded machine a timed-out search would make two plays differ.
WORLD = {"world_size": 300, "world_seed": 3, "hops": (1,), "search_top_k": 2, "max_turns": 2,
         "max_context_tokens": 1500, "tool_timeout_s": None}


def _trajectory(task: int, correct: bool, valid_turns: int, invalid_turns: int,
                answered: bool = True) -> Trajectory:
    turns = [Turn(kind="invalid", valid=False, assistant="x") for _ in range(invalid_turns)]
    turns += [Turn(kind="search", valid=True, assistant="s")
              for _ in range(valid_turns - int(answered))]
    if answered:
        turns.append(Turn(kind="answer", valid=True, assistant="a"))
    return Trajectory(id=f"t{task}", messages=[], task_id=f"task-{task}", turns=turns,
                      outcome=1.0 if correct else 0.0, metadata={"held_out": "w"})


def _evaluation(groups: list[list[Trajectory]]) -> Evaluation:
    return Evaluation(per_task=groups, k=len(groups[0]), seeds=[0] * len(groups))


def test_paired_differences_match_hand_computed_values_and_flag_what_got_worse():
    # 8 tasks of mixed difficulty; b solves one more task than a and answers as often, but
    # half of its turns are malformed where a's were all valid.
    solved_a = [1, 1, 0, 0, 1, 0, 1, 0]
    solved_b = [1, 1, 1, 0, 1, 0, 1, 0]
    a = _evaluation([[_trajectory(i, bool(s), 2, 0)] for i, s in enumerate(solved_a)])
    b = _evaluation([[_trajectory(i, bool(s), 2, 2)] for i, s in enumerate(solved_b)])

    table = compare(a, b, samples=400)

    p = table["pass@1"]
    assert (p.a, p.b, p.diff) == (0.5, 0.625, 0.125)
    # Paired: the task's difficulty cancels, so the SE of the difference is far below the
    # unpaired sqrt(SE_a^2 + SE_b^2).
    assert 0 < p.diff_se < 0.6 * math.hypot(p.a_se, p.b_se)
    f = table["format_valid_rate"]
    assert (f.a, f.b, f.diff) == (1.0, 0.5, -0.5)
    assert f.diff_se == 0.0 and f.z == -math.inf and f.worse  # every task lost half
    r = table["answer_rate"]
    assert (r.a, r.b, r.diff, r.diff_se, r.z, r.worse) == (1.0, 1.0, 0.0, 0.0, 0.0, False)
    assert not p.worse
    lines = comparison_lines(table, "start", "after RL")
    assert sum("worse beyond noise" in line for line in lines) == 1
    assert "+0.125" in next(line for line in lines if line.startswith("| pass@1"))


def test_compare_refuses_evaluations_of_different_tasks():
    a = _evaluation([[_trajectory(0, True, 1, 0)], [_trajectory(1, True, 1, 0)]])
    b = _evaluation([[_trajectory(1, True, 1, 0)], [_trajectory(0, True, 1, 0)]])
    with pytest.raises(ValueError, match="same tasks"):
        compare(a, b)
    with pytest.raises(ValueError, match="unknown metrics"):
        compare(a, a, metrics=("pass@2",))


@pytest.fixture(scope="module")
def policy_dirs(tmp_path_factory) -> tuple[str, str]:
    tokenizer = build_chatml_tokenizer(world_texts({**WORLD, "tool_timeout_s": 30.0}),
                                       vocab_size=1024)
    paths = []
    for seed in (0, 1):
        directory = tmp_path_factory.mktemp(f"policy{seed}")
        build_tiny_causal_lm(tokenizer, hidden=32, layers=1, heads=1, seed=seed
                             ).save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        paths.append(str(directory))
    return paths[0], paths[1]


def test_policies_meet_the_same_tasks_under_the_same_random_numbers(policy_dirs):
    first, second = policy_dirs
    held_out = [HeldOut("w3", dict(WORLD), "test", num_tasks=2)]

    def play(policies, seed):
        return paired_evaluate(policies, held_out, k=2, seed=seed, max_turn_tokens=12,
                               max_context_tokens=2048, log=None)

    runs = play({"a": first, "b": first, "other": second}, seed=0)
    texts = {name: [[t.messages[-1]["content"] for t in g] for g in run.per_task]
             for name, run in runs.items()}
    assert texts["a"] == texts["b"]  # same weights, same seeds: the same episodes
    assert texts["a"] != texts["other"]
    assert [g[0].metadata["held_out"] for g in runs["a"].per_task] == ["w3", "w3"]
    assert len({t.task_id for g in runs["a"].per_task for t in g}) == 2
    same = compare(runs["a"], runs["b"], samples=50)
    assert all(d.diff == 0 and d.diff_se == 0 and not d.worse for d in same.values())
    reseeded = play({"a": first}, seed=1)["a"]
    assert [[t.messages[-1]["content"] for t in g] for g in reseeded.per_task] != texts["a"]


def test_processes_that_deal_out_the_tasks_play_the_same_episodes(policy_dirs, capfd):
    first, second = policy_dirs
    held_out = [HeldOut("w3", dict(WORLD), "test", num_tasks=3),
                HeldOut("w3 again", dict(WORLD), "test", num_tasks=2)]

    def play(jobs, log=None):
        return paired_evaluate({"a": first, "b": second}, held_out, k=2, seed=4,
                               max_turn_tokens=12, max_context_tokens=2048, log=log,
                               groups_per_call=2, threads=2, jobs=jobs)

    alone = play(1)
    capfd.readouterr()
    dealt = play(2, log=print)
    printed = capfd.readouterr().out
    # both processes played (3 tasks and 2 of the 5), each with its own progress lines
    assert "a shard 1/2" in printed and "3 tasks x 2" in printed
    assert "b shard 2/2" in printed and "2 tasks x 2" in printed
    for name in ("a", "b"):
        assert [g[0].metadata["held_out"] for g in dealt[name].per_task] == [
            "w3", "w3", "w3", "w3 again", "w3 again"]
        assert ([[t.input_ids for t in g] for g in dealt[name].per_task]
                == [[t.input_ids for t in g] for g in alone[name].per_task])
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        play(0)


def test_shards_that_cannot_come_from_one_dealt_list_are_refused():
    from trainers.evaluation.paired import interleave_shards

    groups = [[_trajectory(task, True, 1, 0)] for task in range(5)]
    dealt = [_evaluation(groups[0::2]), _evaluation(groups[1::2])]
    assert [g[0].task_id for g in interleave_shards(dealt).per_task] == [
        g[0].task_id for g in groups]
    with pytest.raises(ValueError, match="do not deal out one list of 5"):
        interleave_shards([dealt[1], dealt[0]])
    # more processes than tasks: the last shards are empty
    one = interleave_shards([_evaluation(groups[:1]), Evaluation(k=1), Evaluation(k=1)])
    assert [g[0].task_id for g in one.per_task] == ["task-0"]
