"""Tests for trainers.run_log, trainers.evaluation.evaluate and trainers.evaluation.training_report.

Expected numbers are computed by hand from small hand-built trajectories (the comments show
the arithmetic); the evaluation test drives the real rollout with a scripted engine whose
answers per task and member are known, so pass@1 and pass@k are known in advance.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from envs.group import DeepResearchGroupEnv
from tests.helpers import check_group
from trainers.engines.base import Engine, GenerationRequest, GenerationResult
from trainers.engines.scripted import chatml_user_messages
from trainers.evaluation.evaluate import Evaluation
from trainers.evaluation.evaluate import evaluate as evaluate_engine
from trainers.evaluation.metrics import (
    FAILURE_MODES,
    failure_mode,
    question_spread,
    trajectory_stats,
)
from trainers.evaluation.training_report import standard_error_band, write_report
from trainers.modeling.models import build_chatml_tokenizer
from trainers.modeling.tokenization import ChatTokenizer
from trainers.run_log import MetricsLogger, read_metrics
from trainers.trajectory import Trajectory, Turn, read_trajectories
from venus_gym.protocol import (
    format_answer_turn,
    format_error_notice,
    format_tool_response,
    format_tool_turn,
)

TEXT = {
    "search": format_tool_turn("Look it up.", "search", {"query": ["Ada Lovelace"]}),
    "visit": format_tool_turn("Read it.", "visit", {"url": ["https://venus.world/wiki/Ada"],
                                                     "goal": "birthplace"}),
    "answer": format_answer_turn("Found it.", "London"),
    "invalid": "<think>\nno closing tag",
}
REPLY = {"search": format_tool_response("1. [Ada](https://venus.world/wiki/Ada)"),
         "visit": format_tool_response("Evidence: born in London."),
         "answer": "", "invalid": format_error_notice("no closing </think> tag")}


def make(trajectory_id: str, kinds: Sequence[str], outcome: float | None,
         n_tokens: int | None = None) -> Trajectory:
    """A text-only trajectory with these turn kinds (passes check_invariants)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"},
                                      {"role": "user", "content": "Where was Ada born?"}]
    turns = []
    for k, kind in enumerate(kinds):
        last = k == len(kinds) - 1
        reply = None if last else REPLY[kind]
        messages.append({"role": "assistant", "content": TEXT[kind]})
        if reply is not None:
            messages.append({"role": "user", "content": reply})
        turns.append(Turn(kind, kind != "invalid", TEXT[kind], reply,
                          format_reward=-1.0 if kind == "invalid" else None,
                          outcome_reward=(outcome or 0.0) if last else None))
    trajectory = Trajectory(id=trajectory_id, messages=messages, task_id="t",
                            question="Where was Ada born?", answers=["London"], turns=turns,
                            outcome=outcome)
    if n_tokens is not None:
        trajectory.input_ids = list(range(n_tokens))  # only its length matters here
    return trajectory


@pytest.fixture
def batch() -> list[Trajectory]:
    return [
        make("a", ["search", "visit", "visit", "answer"], 1.0, n_tokens=10),  # ratio 2/3
        make("b", ["search", "invalid", "answer"], 0.0, n_tokens=20),  # ratio 0/1
        make("c", ["invalid", "invalid"], None),  # no tool turn: ratio 0, unanswered
        make("d", ["search", "visit", "answer"], 0.5),  # ratio 1/2, correct at the threshold
    ]


# --- trajectory_stats --------------------------------------------------------------------
def test_trajectory_stats_hand_computed(batch: list[Trajectory]) -> None:
    stats = trajectory_stats(batch)
    expected = {
        "accuracy": (1.0 + 0.0 + 0.0 + 0.5) / 4,       # None counts 0
        "answer_rate": 3 / 4,                          # c ends on an invalid turn
        "format_error_rate": 3 / 12,                   # 1 + 2 invalid of 4 + 3 + 2 + 3 turns
        "format_error_repetition_rate": 0.0,           # no invalid turn loops
        "mean_turns": 12 / 4,
        "browse_ratio": (2 / 3 + 0 + 0 + 1 / 2) / 4,
        "browse_ratio_correct": (2 / 3 + 1 / 2) / 2,   # a and d
        "browse_ratio_wrong": (0 + 0) / 2,             # b and c
        "num_correct": 2.0,
        "num_wrong": 2.0,
        "mean_tokens": (10 + 20) / 2,                  # only a and b carry ids
    }
    assert stats.keys() == expected.keys()
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value), key
    assert all(isinstance(v, float) for v in stats.values())


def test_repetition_rate_counts_malformed_loops_only() -> None:
    # The metric uses the rollout's degeneration check (venus_gym.protocol.is_repetitive):
    # a turn counts when it is invalid and its last 50 characters recur more than 5 times.
    kinds = ["search", "invalid", "invalid", "invalid", "invalid", "answer"]
    trajectory = make("r", kinds, 0.0)
    texts = ["<think>\nA rule: " + "-" * 400 + "\n</think>",  # valid turn: never counted
             "<think>\nFound it: " + "8" * 300,              # a one-character loop
             "<think>\nno closing tag",                       # malformed, no loop
             "<think>\nThe city is " + "kavik " * 60,         # a six-character unit
             "<think>\nFound it: " + "8" * 40]                # too short to recur 6 times
    for turn, text in zip(trajectory.turns, texts):
        turn.assistant = text
    stats = trajectory_stats([trajectory])
    assert stats["format_error_rate"] == pytest.approx(4 / 6)
    assert stats["format_error_repetition_rate"] == pytest.approx(2 / 6)


def test_trajectory_stats_nan_on_an_empty_side(batch: list[Trajectory]) -> None:
    correct_only = trajectory_stats([batch[0], batch[3]])
    assert math.isnan(correct_only["browse_ratio_wrong"])
    assert correct_only["browse_ratio_correct"] == pytest.approx(7 / 12)
    wrong_only = trajectory_stats([batch[1], batch[2]])
    assert math.isnan(wrong_only["browse_ratio_correct"])
    assert math.isnan(wrong_only["mean_tokens"]) is False  # b has ids
    assert math.isnan(trajectory_stats([batch[2]])["mean_tokens"])
    with pytest.raises(ValueError, match="at least one trajectory"):
        trajectory_stats([])


def test_failure_mode_says_which_step_of_the_research_went_wrong() -> None:
    correct, no_answer, miscopied, astray = FAILURE_MODES
    assert failure_mode(make("a", ["search", "visit", "answer"], 1.0)) == correct
    # Its visit read "born in London", then it answered wrong: the last step failed.
    assert failure_mode(make("b", ["search", "visit", "answer"], 0.0)) == miscopied
    # Only the search results (no "London") were read before the wrong answer.
    assert failure_mode(make("c", ["search", "answer"], 0.0)) == astray
    assert failure_mode(make("d", ["search", "visit", "invalid"], 0.0)) == no_answer
    assert failure_mode(make("e", ["search", "visit"], None)) == no_answer
    # Golds match normalised and as whole words only.
    read = make("f", ["search", "visit", "answer"], 0.0)
    assert failure_mode(dataclasses.replace(read, answers=["LONDON."])) == miscopied
    assert failure_mode(dataclasses.replace(read, answers=["Lond"])) == astray
    assert failure_mode(dataclasses.replace(read, answers=["Paris", "london"])) == miscopied


def test_question_spread_is_the_standard_error_over_the_steps_questions(
        batch: list[Trajectory]) -> None:
    # Two questions: "p" holds a and b (accuracy 0.5, answered 2/2, 1 invalid of 7 turns),
    # "q" holds c and d (accuracy 0.25, answered 1/2, 2 invalid of 5 turns).
    for trajectory, task in zip(batch, "ppqq"):
        trajectory.task_id = task
    spread = question_spread(batch)
    # Two values x, y: the SE of their mean is |x - y| / 2.
    assert spread == pytest.approx({"accuracy_se": (0.5 - 0.25) / 2,
                                    "answer_rate_se": (1 - 0.5) / 2,
                                    "format_error_rate_se": (2 / 5 - 1 / 7) / 2})
    for trajectory, task in zip(batch, "pqrs"):  # four questions, one trajectory each
        trajectory.task_id = task
    outcomes = [1.0, 0.0, 0.0, 0.5]
    mean = sum(outcomes) / 4
    sd = math.sqrt(sum((o - mean) ** 2 for o in outcomes) / 3)
    assert question_spread(batch)["accuracy_se"] == pytest.approx(sd / 2)
    for trajectory in batch:  # one question: no spread to measure
        trajectory.task_id = "p"
    assert all(math.isnan(value) for value in question_spread(batch).values())


def test_curves_band_only_the_steps_that_logged_a_standard_error() -> None:
    rows = [{"step": 0, "accuracy": 0.5, "accuracy_se": 0.1},
            {"step": 1, "accuracy": 0.25},                       # no SE: no band there
            {"step": 2, "accuracy": 0.75, "accuracy_se": math.nan},
            {"step": 3, "accuracy": 0.5, "accuracy_se": 0.2, "kl": 0.1}]
    steps, low, high = standard_error_band(rows, "accuracy")
    assert steps == [0, 3]
    assert low == pytest.approx([0.4, 0.3]) and high == pytest.approx([0.6, 0.7])
    assert standard_error_band(rows, "kl") is None


# --- MetricsLogger -------------------------------------------------------------------------
def _strict_lines(path: Path) -> list[dict[str, Any]]:
    """Parse JSONL rejecting NaN / Infinity (Python's json accepts them by default)."""
    def reject(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name} in {path}")

    return [json.loads(line, parse_constant=reject)
            for line in path.read_text().splitlines()]


def test_logger_jsonl_round_trip_non_finite_and_console(tmp_path: Path, capsys) -> None:
    np = pytest.importorskip("numpy")
    config = {"lr": 1e-6, "algo": "igpo", "path": Path("/x"), "bad": math.inf}
    with MetricsLogger(tmp_path, total_steps=3, progress_bar=False, tensorboard=False,
                       config=config) as logger:
        logger.log(0, {"reward": 1.5, "kl": math.nan, "accuracy": np.float32(0.25),
                       "loss": -math.inf, "entropy": 2})
        logger.log(1, {"reward": -0.5})
    lines = _strict_lines(tmp_path / "metrics.jsonl")
    assert [line["step"] for line in lines] == [0, 1]
    assert lines[0]["kl"] is None and lines[0]["loss"] is None
    assert lines[0]["reward"] == 1.5 and lines[0]["accuracy"] == 0.25
    assert lines[0]["time"] <= lines[1]["time"]
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert math.isnan(rows[0]["kl"]) and rows[0]["entropy"] == 2.0 and rows[1]["reward"] == -0.5
    assert json.loads((tmp_path / "config.json").read_text()) == {
        "lr": 1e-6, "algo": "igpo", "path": "/x", "bad": None}
    printed = capsys.readouterr().out.splitlines()
    # console keys in their order, only those present; NaN shown as nan
    assert printed == ["step 1/3 reward=1.5 accuracy=0.25 kl=nan", "step 2/3 reward=-0.5"]


def test_logger_rejects_bad_input(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, total_steps=5, progress_bar=False,
                       tensorboard=False) as logger:
        with pytest.raises(TypeError, match="'reward' must be a real number"):
            logger.log(0, {"reward": "high"})
        with pytest.raises(ValueError, match="reserved"):
            logger.log(0, {"step": 1.0})
        logger.log(2, {"reward": 1.0})
        logger.log(2, {"eval_accuracy": 0.5})  # same step twice is allowed
        with pytest.raises(ValueError, match="goes backwards"):
            logger.log(1, {"reward": 1.0})
    with pytest.raises(RuntimeError, match="after close"):
        logger.log(3, {"reward": 1.0})
    with pytest.raises(ValueError, match="start_step"):
        MetricsLogger(tmp_path, total_steps=5, start_step=6, progress_bar=False,
                      tensorboard=False)


def test_logger_resume_drops_steps_to_be_rerun(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, total_steps=6, progress_bar=False, tensorboard=False) as log:
        for step in range(4):
            log.log(step, {"reward": float(step)})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "rew')  # a run killed mid-write
    with pytest.warns(RuntimeWarning, match="unreadable last line"):
        resumed = MetricsLogger(tmp_path, total_steps=6, start_step=2, progress_bar=False,
                                tensorboard=False)
    assert [row["step"] for row in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1]
    with resumed:
        with pytest.raises(ValueError, match="goes backwards"):
            resumed.log(1, {"reward": 9.0})
        resumed.log(2, {"reward": 20.0})
        resumed.log(3, {"reward": 30.0})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["reward"]) for r in rows] == [(0, 0.0), (1, 1.0), (2, 20.0), (3, 30.0)]
    # a fresh run (start_step 0) in the same directory starts an empty file
    MetricsLogger(tmp_path, total_steps=6, progress_bar=False, tensorboard=False).close()
    assert read_metrics(tmp_path / "metrics.jsonl") == []


def test_logger_progress_bar_counts_steps_once(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, total_steps=10, start_step=3, tensorboard=False) as logger:
        assert logger._bar.n == 3
        logger.log(3, {"reward": 1.0, "kl": 0.01, "other": 5.0})
        logger.log(3, {"accuracy": 0.5})
        assert logger._bar.n == 4
        # the latest value of each console key, in console_keys order; "other" not shown
        assert logger._bar.postfix.replace(" ", "") == "reward=1,accuracy=0.5,kl=0.01"


def test_a_replanned_run_length_moves_the_bar_total_and_the_printed_count(
        tmp_path: Path, capsys) -> None:
    with MetricsLogger(tmp_path / "bar", total_steps=100, tensorboard=False) as logger:
        logger.log(0, {"reward": 1.0})
        logger.set_total_steps(10)
        assert logger._bar.total == 10 and logger._bar.n == 1
        with pytest.raises(ValueError, match="total_steps must be an int >= 0"):
            logger.set_total_steps(-1)
    with MetricsLogger(tmp_path / "lines", total_steps=100, progress_bar=False,
                       tensorboard=False) as logger:
        logger.set_total_steps(10)
        logger.log(0, {"reward": 1.0})
    assert "step 1/10 " in capsys.readouterr().out


def test_save_samples_readable(tmp_path: Path, batch: list[Trajectory]) -> None:
    # The batch's input_ids are stand-ins (lengths only); samples must pass the invariants.
    batch = [dataclasses.replace(t, input_ids=None) for t in batch]
    with MetricsLogger(tmp_path, total_steps=1, progress_bar=False,
                       tensorboard=False) as logger:
        path = logger.save_samples(7, batch, k=2)
        with pytest.raises(ValueError, match="k must be"):
            logger.save_samples(7, batch, k=0)
    assert path == tmp_path / "samples" / "step-000007.jsonl"
    back = read_trajectories(path)
    assert [t.id for t in back] == ["a", "b"]
    assert back[0].turn_kinds == ["search", "visit", "visit", "answer"]


def test_tensorboard_events_written(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, total_steps=2, progress_bar=False, tensorboard=True,
                       config={"lr": 0.1}) as logger:
        logger.log(0, {"reward": 0.5, "kl": 0.01})
        logger.log(1, {"reward": 0.75, "kl": math.nan})
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    accumulator = EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars("reward")] == [(0, 0.5), (1, 0.75)]
    assert [e.step for e in accumulator.Scalars("kl")] == [0]  # NaN is not written


def test_missing_optional_packages_give_clear_errors(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "tensorboard", None)
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)
    old_run = '{"step": 0, "time": 1.0, "reward": 1.0}\n'
    (tmp_path / "metrics.jsonl").write_text(old_run)
    with pytest.raises(ImportError, match="pip install tensorboard"):
        MetricsLogger(tmp_path, total_steps=1, progress_bar=False, tensorboard=True)
    with pytest.raises(ImportError, match="pip install wandb"):
        MetricsLogger(tmp_path, total_steps=1, progress_bar=False, tensorboard=False,
                      wandb_project="venus")
    assert (tmp_path / "metrics.jsonl").read_text() == old_run  # the failed start changed nothing
    # "auto" quietly goes without
    MetricsLogger(tmp_path, total_steps=1, progress_bar=False, tensorboard="auto").close()
    assert not (tmp_path / "tensorboard").exists()


# --- evaluate_engine -----------------------------------------------------------------------
WORLD = {"world_size": 300, "world_seed": 3}
WRONG = format_answer_turn("A guess.", "zzqx wrong")
# Per test-split task index, per member: the script of turns ("search", "right", "wrong").
SCRIPT = {0: [["search", "right"], ["wrong"]],
          1: [["search", "wrong"], ["wrong"]],
          2: [["right"], ["search", "right"]]}


class ScriptByMember(Engine):
    """Plays SCRIPT. The member is read from the request seed (rollout: seed + 1000 * turn +
    member), which also checks that evaluate_engine seeds sampling for k > 1."""

    def __init__(self, chat: ChatTokenizer, tasks: list[Any]):
        self.chat = chat
        self.index = {task.question: i for i, task in enumerate(tasks)}
        self.answers = [task.answers[0] for task in tasks]
        self.requests: list[GenerationRequest] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        results = []
        for request in requests:
            self.requests.append(request)
            tokenizer = self.chat.tokenizer
            prompt = tokenizer.decode(request.prompt_ids, skip_special_tokens=False)
            observations = chatml_user_messages(prompt)
            task = self.index[observations[0]]
            member = 0 if request.seed is None else request.seed % 1000
            step = SCRIPT[task][member][len(observations) - 1]
            text = {"search": TEXT["search"], "wrong": WRONG,
                    "right": format_answer_turn("Got it.", self.answers[task])}[step]
            ids = [*tokenizer.encode(text, add_special_tokens=False), self.chat.end_of_turn_id]
            results.append(GenerationResult(ids, [0.0] * len(ids), "stop"))
        return results


@pytest.fixture(scope="module")
def eval_setup() -> tuple[ChatTokenizer, list[Any]]:
    group = DeepResearchGroupEnv(group_size=1, task_split="test", **WORLD)
    tasks, system_prompt = list(group.tasks[:3]), group.system_prompt
    group.close()
    assert len({task.question for task in tasks}) == 3
    texts = [system_prompt, TEXT["search"], WRONG] + [t.question for t in tasks]
    return ChatTokenizer(build_chatml_tokenizer(texts, vocab_size=400)), tasks


def test_evaluate_engine_pass_at_1_and_k(eval_setup) -> None:
    chat, tasks = eval_setup
    engine = ScriptByMember(chat, tasks)
    result = evaluate_engine(engine, chat, {**WORLD, "task_split": "train"}, num_tasks=3, k=2)
    assert isinstance(result, Evaluation) and len(result.per_task) == 3
    assert [t.task_id for t in result.trajectories] == [t.id for t in tasks for _ in range(2)]
    check_group(result.trajectories, chat)
    assert [[t.outcome for t in group] for group in result.per_task] == [
        [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    assert all(r.temperature == 1.0 and r.seed is not None for r in engine.requests)
    summary = result.summary()
    assert summary["pass@1"] == pytest.approx(3 / 6)
    assert summary["pass@k"] == pytest.approx(2 / 3)  # tasks 0 and 2 have a correct member
    assert summary["k"] == 2.0 and summary["tasks"] == 3.0
    assert summary["accuracy"] == summary["pass@1"]
    assert summary["mean_turns"] == pytest.approx((2 + 1 + 2 + 1 + 1 + 2) / 6)
    assert summary["answer_rate"] == 1.0 and summary["format_error_rate"] == 0.0
    assert summary["browse_ratio"] == 0.0  # searches only


def test_evaluate_engine_greedy_single_sample(eval_setup) -> None:
    chat, tasks = eval_setup
    engine = ScriptByMember(chat, tasks)
    result = evaluate_engine(engine, chat, dict(WORLD), num_tasks=2, progress=True)
    assert all(r.temperature == 0.0 and r.seed is None for r in engine.requests)
    summary = result.summary()
    assert "pass@k" not in summary
    assert summary["pass@1"] == pytest.approx(1 / 2)  # member 0: task 0 right, task 1 wrong
    assert summary["tasks"] == 2.0
    with pytest.raises(ValueError, match="k must be"):
        evaluate_engine(engine, chat, dict(WORLD), k=0)
    with pytest.raises(ValueError, match="group_size"):
        evaluate_engine(engine, chat, {**WORLD, "group_size": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(RuntimeWarning, match="only"):
            evaluate_engine(engine, chat, dict(WORLD), num_tasks=10_000)


# --- write_report --------------------------------------------------------------------------
def test_write_report_png_md_json(tmp_path: Path, batch: list[Trajectory]) -> None:
    pytest.importorskip("matplotlib")
    with MetricsLogger(tmp_path, total_steps=3, progress_bar=False,
                       tensorboard=False) as logger:
        for step in range(3):
            logger.log(step, {"reward": 0.1 * step, "kl": 0.01 * step, "loss": 1.0})
    before = {"pass@1": 0.25, "format_error_rate": 0.125, "browse_ratio_correct": 0.5,
              "browse_ratio_wrong": math.nan, "mean_turns": 3.0, "tasks": 8.0}
    after = {**trajectory_stats(batch), "pass@1": 0.375, "tasks": 8.0}
    path = write_report(tmp_path / "report", metrics_path=tmp_path / "metrics.jsonl",
                        before=before, after=after, config={"algo": "igpo"}, title="tiny")
    assert path == tmp_path / "report" / "report.md"
    text = path.read_text()
    assert text.startswith("# tiny")
    assert "| pass@1 accuracy | 0.2500 | 0.3750 | +0.1250 |" in text
    assert "| format-error rate | 0.1250 | 0.2500 | +0.1250 |" in text
    assert "| browse ratio (correct) | 0.5000 | 0.5833 | +0.0833 |" in text
    assert "| browse ratio (wrong) | n/a | 0 | n/a |" in text
    assert "| mean turns | 3 | 3 | +0 |" in text
    assert "(step 2)" in text and "| reward | 0.2000 |" in text and "| kl | 0.0200 |" in text
    assert '"algo": "igpo"' in text
    png = (tmp_path / "report" / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["training"]["curves"] == ["reward", "kl"]  # loss is not a curve key
    assert report["comparison"]["pass@1 accuracy"] == {"before": 0.25, "after": 0.375}
    assert report["comparison"]["browse ratio (wrong)"]["before"] is None
    assert report["training"]["last_step"]["reward"] == pytest.approx(0.2)
    with pytest.raises(FileNotFoundError):
        write_report(tmp_path, metrics_path=tmp_path / "nope.jsonl", before={}, after={})


def test_wandb_gets_config_finite_metrics_and_keeps_its_run_id(tmp_path: Path,
                                                               monkeypatch) -> None:
    """A stand-in `wandb` module records the calls (the real one needs an account)."""
    import types

    calls: list[tuple[str, Any]] = []
    fake = types.ModuleType("wandb")
    run = types.SimpleNamespace(log=lambda data, step: calls.append(("log", (step, data))),
                                finish=lambda: calls.append(("finish", None)))
    fake.init = lambda **kwargs: calls.append(("init", kwargs)) or run  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "wandb", fake)
    with MetricsLogger(tmp_path, total_steps=4, progress_bar=False, tensorboard=False,
                       wandb_project="venus", config={"lr": math.nan}) as logger:
        logger.log(0, {"reward": 1.0, "kl": math.nan})
    with MetricsLogger(tmp_path, total_steps=4, start_step=1, progress_bar=False,
                       tensorboard=False, wandb_project="venus"):
        pass
    inits = [kwargs for name, kwargs in calls if name == "init"]
    run_id = (tmp_path / "wandb_run_id.txt").read_text().strip()
    assert len(run_id) == 8 and run_id.isalnum() and run_id.lower() == run_id
    # the resumed logger continues the same W&B run
    assert [(k["project"], k["id"], k["resume"]) for k in inits] == [
        ("venus", run_id, "allow")] * 2
    assert inits[0]["config"] == {"lr": None}
    assert ("log", (0, {"reward": 1.0})) in calls
    assert [name for name, _ in calls].count("finish") == 2
