"""Statistics of finished episodes, shared by training logs and evaluation.

    stats = trajectory_stats(trajectories)   # accuracy, format errors, browse ratio, ...
    spread = question_spread(trajectories)   # their standard errors over the questions

The browse ratio follows DR-Venus: trajectories that end correct browse (visit pages) more
than wrong ones, and RL raises the browse ratio, so it is reported over all trajectories and
separately over correct and wrong ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from trainers.trajectory import Trajectory
from venus_gym.protocol import is_repetitive
from venus_gym.scoring import normalize_answer

# An outcome at or above this counts as correct (judge 1/0 scores, or F1 >= 0.5).
CORRECT_THRESHOLD = 0.5


def trajectory_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Aggregate numbers over finished episodes (one dict of floats).

    accuracy:             mean of `trajectory.outcome`, an unscored (None) outcome counted 0.
    answer_rate:          share of trajectories whose last turn is a valid "answer" turn.
    format_error_rate:    invalid turns / all turns, pooled over trajectories (a turn is
                          invalid when `turn.valid` is False); 0.0 when there are no turns.
    format_error_repetition_rate:
                          invalid turns that the rollout's degeneration check flags
                          (venus_gym.protocol.is_repetitive: the turn's last 50 characters
                          recur more than 5 times) / all turns: the part of format_error_rate
                          that is a repetition loop rather than a broken tag or JSON body.
    mean_turns:           mean number of assistant turns per trajectory.
    browse_ratio:         per trajectory, visit turns / (search + visit turns), 0 for a
                          trajectory with no tool turn; averaged over trajectories.
    browse_ratio_correct: the same average over trajectories with outcome >= 0.5;
    browse_ratio_wrong:   ... and over those with outcome < 0.5 (None counted as 0).
                          Either is NaN when its set of trajectories is empty (e.g. a batch
                          with no correct episode): an average over nothing is undefined,
                          and 0 would read as "correct episodes never browse".
    num_correct, num_wrong: how many trajectories have outcome >= 0.5 / < 0.5.
    mean_tokens:          mean len(input_ids) over trajectories that carry token ids (the
                          whole episode: prompt, turns and environment replies); NaN when
                          none does.

    Raises:
        ValueError: no trajectories (every average would be undefined).
    """
    if len(trajectories) == 0:
        raise ValueError("trajectory_stats needs at least one trajectory")
    outcomes = [outcome(t) for t in trajectories]
    ratios = [browse_ratio(t) for t in trajectories]
    correct = [r for r, o in zip(ratios, outcomes) if o >= CORRECT_THRESHOLD]
    wrong = [r for r, o in zip(ratios, outcomes) if o < CORRECT_THRESHOLD]
    total_turns = sum(len(t.turns) for t in trajectories)
    invalid_turns = sum(not turn.valid for t in trajectories for turn in t.turns)
    looping_turns = sum(not turn.valid and is_repetitive(turn.assistant)
                        for t in trajectories for turn in t.turns)
    answers = sum(map(answered, trajectories))
    token_counts = [len(t.input_ids) for t in trajectories if t.input_ids is not None]
    n = len(trajectories)
    return {
        "accuracy": sum(outcomes) / n,
        "answer_rate": answers / n,
        "format_error_rate": invalid_turns / total_turns if total_turns else 0.0,
        "format_error_repetition_rate": looping_turns / total_turns if total_turns else 0.0,
        "mean_turns": total_turns / n,
        "browse_ratio": sum(ratios) / n,
        "browse_ratio_correct": _mean(correct),
        "browse_ratio_wrong": _mean(wrong),
        "num_correct": float(len(correct)),
        "num_wrong": float(len(wrong)),
        "mean_tokens": _mean(token_counts),
    }


def question_spread(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Standard errors of a training step's accuracy, answer rate and format-error rate over
    the questions it drew: `accuracy_se`, `answer_rate_se`, `format_error_rate_se`.

    Each is the standard deviation of the per-question values (a question's trajectories
    pooled, as trajectory_stats pools a step's) over sqrt(number of questions), so a step
    that drew easy questions reads as noise on the curves rather than as a trend. The
    questions are the trajectories' task_ids; NaN with fewer than two of them.
    """
    by_task: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        by_task.setdefault(trajectory.task_id, []).append(trajectory)
    per_question = [trajectory_stats(group) for group in by_task.values()]
    return {f"{key}_se": _standard_error([row[key] for row in per_question])
            for key in ("accuracy", "answer_rate", "format_error_rate")}


def _standard_error(values: Sequence[float]) -> float:
    n = len(values)
    if n < 2:
        return math.nan
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def outcome(trajectory: Trajectory) -> float:
    """The trajectory's outcome, an unscored (None) one counted 0."""
    return 0.0 if trajectory.outcome is None else float(trajectory.outcome)


def is_correct(trajectory: Trajectory) -> bool:
    return outcome(trajectory) >= CORRECT_THRESHOLD


def answered(trajectory: Trajectory) -> bool:
    """Whether the last turn is a valid answer."""
    return bool(trajectory.turns) and trajectory.turns[-1].kind == "answer" \
        and trajectory.turns[-1].valid


def browse_ratio(trajectory: Trajectory) -> float:
    kinds = trajectory.turn_kinds
    visits, searches = kinds.count("visit"), kinds.count("search")
    return visits / (visits + searches) if visits + searches else 0.0


FAILURE_MODES = ("correct", "no answer", "read the gold, answered wrong",
                 "never read the gold")


def failure_mode(trajectory: Trajectory) -> str:
    """Where an episode went wrong, one of FAILURE_MODES, from its text alone: correct;
    no answer (its last turn is not a valid answer); answered wrong although a gold answer
    appeared in a tool response it read (a copy or choice error at the end); answered wrong
    and no tool response held a gold answer (a search, a page or a bridge entity went
    astray on the way). Gold and responses are compared SQuAD-normalised (`15,700,000` and
    `15700000` match)."""
    if is_correct(trajectory):
        return FAILURE_MODES[0]
    if not answered(trajectory):
        return FAILURE_MODES[1]
    read = normalize_answer(" ".join(turn.env_reply or "" for turn in trajectory.turns))
    golds = [normalize_answer(gold) for gold in trajectory.answers]
    if any(gold and f" {gold} " in f" {read} " for gold in golds):
        return FAILURE_MODES[2]
    return FAILURE_MODES[3]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan
