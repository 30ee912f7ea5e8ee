"""The whole pipeline: run_pipeline, the report, and `venus-gym data ...` end to end."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from tests.test_data_fixtures import drvenus_record, long_record, search, visit, write_lines
from trainers.cli import main as venus_gym_main
from trainers.data.pipeline import (
    OUTPUT_NAMES,
    PipelineConfig,
    run_pipeline,
    run_stages,
    trajectory_record,
)
from trainers.trajectory import Trajectory, Turn, read_trajectories

PYTHON = ("python", {"code": "print(1)"})


def fixture_file(tmp_path: Path) -> Path:
    """Seven lines whose fate is worked out by hand in test_run_pipeline_counts_by_hand."""
    long_steps = [search(f"query {i}") for i in range(120)]
    for at in (10, 50, 90):
        long_steps.insert(at, PYTHON)
    return write_lines(tmp_path / "redsearcher.jsonl", [
        drvenus_record("short", [search("a"), PYTHON, visit("u1")], "Paris"),    # 4 turns
        drvenus_record("dup", [search("a"), search("a"), visit("u"), visit("u")], "Paris"),
        drvenus_record("wrong", [search("q")], "Lyon"),                            # 2 turns
        '{"id": "broken", "messages": [',                                          # line 4
        long_record("mid", 60),                                                    # 61 turns
        drvenus_record("long", long_steps, "paris"),                               # 124 turns
        drvenus_record("silent", [], None) | {"messages": drvenus_record(
            "silent", [search("q")], None)["messages"]},                           # no answer
    ])


def quiet(**overrides) -> PipelineConfig:
    return PipelineConfig(progress=False, **overrides)


def test_run_pipeline_counts_by_hand(tmp_path):
    source = fixture_file(tmp_path)
    report = run_pipeline([source], tmp_path / "out", quiet(skip_bad=True))
    flow = [(s.stage, s.inputs, s.outputs) for s in report.stages]
    assert flow == [("convert", 7, 6), ("prune", 6, 6), ("dedup", 6, 6), ("filter", 6, 4),
                    ("resample", 4, 9)]
    assert report.stage("convert").removed == {"bad line, skipped": 1}
    assert report.bad_lines[0].startswith(f"{source}:4: ")
    assert report.stage("prune").counts == {"turns pruned (all tools)": 4,
                                            "turns pruned (python)": 4, "trajectories changed": 2}
    assert report.stage("dedup").counts == {
        "duplicate interactions removed (all tools)": 2,
        "duplicate interactions removed (search)": 1,
        "duplicate interactions removed (visit)": 1, "trajectories changed": 1}
    assert report.stage("filter").removed == {"judged incorrect": 1, "no final answer": 1}
    assert report.stage("resample").counts == {"copies written (<=50 turns)": 2,
                                               "copies written (51-100 turns)": 2,
                                               "copies written (>100 turns)": 5}
    # Before: 4, 5, 2, 61, 124, 1 turns. After: 3, 3, 61 x2, 121 x5.
    before, after = report.turns_before, report.turns_after
    assert before.labels() == ["0-10", "11-20", "21-50", "51-100", "101-150", "151-200", ">200"]
    assert before.counts == [4, 0, 0, 1, 1, 0, 0]
    assert after.counts == [2, 0, 0, 2, 5, 0, 0]
    assert before.long_share == pytest.approx(1 / 6)
    assert after.long_share == pytest.approx(5 / 9)
    out = tmp_path / "out"
    final = read_trajectories(out / "resampled.jsonl")  # checks every invariant too
    assert [t.id for t in final] == ["short", "dup", "mid", "mid#copy1", "long"] + [
        f"long#copy{k}" for k in range(1, 5)]
    assert len(read_trajectories(out / "converted.jsonl")) == 6
    saved = json.loads((out / "report.json").read_text())
    assert set(saved["config"]) == {f.name for f in dataclasses.fields(PipelineConfig)}
    assert saved["turns_after"]["long_share"] == pytest.approx(5 / 9)
    text = (out / "report.txt").read_text()
    assert "share of >100-turn trajectories: 16.67% before, 55.56% after" in text
    assert f"skipped bad lines: 1\n  {source}:4: " in text


def test_cli_all_end_to_end_lists_bad_lines(tmp_path, capsys):
    source = fixture_file(tmp_path)
    out = tmp_path / "cli-out"
    status = venus_gym_main(["data", "all", str(source), "-o", str(out), "--skip-bad",
                             "--no-progress", "--judge", "f1", "--no-write-intermediate"])
    assert status == 0
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.txt",
                                                     "resampled.jsonl"]
    saved = json.loads((out / "report.json").read_text())
    assert saved["config"]["judge"] == "f1" and saved["config"]["skip_bad"] is True
    assert [line.split(": ")[0] for line in saved["bad_lines"]] == [f"{source}:4"]
    assert [s["outputs"] for s in saved["stages"]] == [6, 6, 6, 4, 9]
    assert "skipped bad lines: 1" in capsys.readouterr().out


def test_cli_stops_at_a_bad_line_naming_file_and_line(tmp_path, capsys):
    source = fixture_file(tmp_path)
    status = venus_gym_main(["data", "all", str(source), "-o", str(tmp_path / "o"),
                             "--no-progress"])
    assert status == 1
    assert f"{source}:4: " in capsys.readouterr().err


def test_stage_commands_in_sequence_equal_the_all_command(tmp_path):
    source = fixture_file(tmp_path)
    run_pipeline([source], tmp_path / "all", quiet(skip_bad=True))
    current = source
    for stage in ("convert", "prune", "dedup", "filter", "resample"):
        output = tmp_path / f"{stage}.jsonl"
        extra = ["--skip-bad"] if stage == "convert" else []
        assert venus_gym_main(["data", stage, str(current), "-o", str(output),
                               "--no-progress", *extra]) == 0
        assert output.read_bytes() == (tmp_path / "all" / OUTPUT_NAMES[stage]).read_bytes()
        current = output
    stage_report = json.loads((tmp_path / "resample.jsonl.report.json").read_text())
    assert [s["stage"] for s in stage_report["stages"]] == ["read", "resample"]
    assert stage_report["stages"][1]["outputs"] == 9


def test_report_command_prints_saved_reports_and_file_stats(tmp_path, capsys):
    source = fixture_file(tmp_path)
    run_pipeline([source], tmp_path / "out", quiet(skip_bad=True))
    capsys.readouterr()
    assert venus_gym_main(["data", "report", str(tmp_path / "out" / "report.json")]) == 0
    assert capsys.readouterr().out.strip() == (tmp_path / "out" / "report.txt").read_text().strip()
    assert venus_gym_main(["data", "report", str(tmp_path / "out" / "converted.jsonl"),
                           str(tmp_path / "out" / "resampled.jsonl"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "share of >100-turn trajectories: 16.67% before, 55.56% after" in printed
    (tmp_path / "other.json").write_text("{}")
    assert venus_gym_main(["data", "report", str(tmp_path / "other.json")]) == 1
    assert "is not a pipeline report" in capsys.readouterr().err


def test_config_file_flags_and_judge_errors_kept_and_reported(tmp_path):
    source = fixture_file(tmp_path)
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps({"judge": "llm", "llm_model": "m", "llm_retries": 0,
                                       "on_judge_error": "fail", "skip_bad": True}))
    out = tmp_path / "o"
    # Nothing listens on port 9: every judge call fails; "keep" (given as a flag, which
    # wins over the file) keeps the judgeable trajectories and lists each failure.
    assert venus_gym_main(["data", "all", str(source), "-o", str(out), "--config",
                           str(config_path), "--llm-base-url", "http://127.0.0.1:9/v1",
                           "--on-judge-error", "keep", "--no-progress"]) == 0
    saved = json.loads((out / "report.json").read_text())
    filter_stage = saved["stages"][3]
    assert filter_stage["counts"]["kept despite judge error"] == 5
    assert filter_stage["removed"] == {"no final answer": 1}
    assert sum("unreachable" in note for note in filter_stage["notes"]) == 5
    assert venus_gym_main(["data", "all", str(source), "-o", str(out), "--config",
                           str(config_path), "--llm-base-url", "http://127.0.0.1:9/v1",
                           "--no-progress"]) == 1


def test_unknown_options_and_bad_configs_are_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="judge must be one of"):
        PipelineConfig(judge="vibes")
    with pytest.raises(ValueError, match="unknown tool"):
        PipelineConfig(tools=("search", "python"))
    source = fixture_file(tmp_path)
    assert venus_gym_main(["data", "prune", str(source), "-o", str(tmp_path / "p.jsonl"),
                           "--turn-weights", "1", "2"]) == 1
    assert "2 threshold(s) need 3 weights" in capsys.readouterr().err


def test_data_command_without_training_extras_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trainers.data.cli", None)  # makes the import fail
    assert venus_gym_main(["data", "all", "x.jsonl", "-o", "y"]) == 2
    assert "pip install -e .[train]" in capsys.readouterr().err


def test_fast_writer_record_equals_to_json():
    trajectory = Trajectory(
        id="t", messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        turns=[Turn(kind="invalid", valid=False, assistant="a", reason="r", format_reward=-1.0)],
        input_ids=[1, 2, 3], loss_mask=[0, 1, 1], turn_spans=[(1, 3)], turn_boundaries=[3],
        question_end=1, metadata={"nested": {"k": [1, 2]}})
    assert json.dumps(trajectory_record(trajectory)) == json.dumps(trajectory.to_json())


def test_judge_none_and_fractional_weights_via_run_stages(tmp_path):
    source = fixture_file(tmp_path)
    run_pipeline([source], tmp_path / "out", quiet(skip_bad=True))
    converted = tmp_path / "out" / "converted.jsonl"
    config = quiet(judge="none", turn_thresholds=(10,), turn_weights=(1.0, 0.5))
    report = run_stages([converted], ["filter", "resample"],
                        {"resample": tmp_path / "r.jsonl"}, config)
    assert [(s.stage, s.inputs, s.outputs) for s in report.stages][:2] == [
        ("read", 6, 6), ("filter", 6, 6)]
    assert report.stage("filter").notes == ["judge 'none': every trajectory kept unjudged"]
    # 4 short trajectories are kept once; "mid" and "long" each survive with chance 1/2.
    resample = report.stage("resample")
    long_copies = resample.counts["copies written (>10 turns)"]
    assert resample.counts["copies written (<=10 turns)"] == 4
    assert resample.outputs == 4 + long_copies
    assert resample.removed.get("0 copies (weight 0 or fractional draw)", 0) == 2 - long_copies
    again = run_stages([converted], ["filter", "resample"], {}, config)
    assert again.stage("resample").counts == resample.counts
