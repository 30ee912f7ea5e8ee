"""examples/compare_igpo_grpo.py reads a finished run back instead of training it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def compare():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / "compare_igpo_grpo.py"
    spec = importlib.util.spec_from_file_location("compare_igpo_grpo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFIG = {"policy": {"path": "runs/sft/final"}, "run": {"seed": 1, "steps": 5},
          "eval": {"before": True, "num_tasks": 0}}


def _write_run(run_dir: Path, eval_payload: dict | None, accuracies: list[float]) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(CONFIG))
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "accuracy": a}) + "\n" for i, a in enumerate(accuracies)))
    if eval_payload is not None:
        (run_dir / "eval.json").write_text(json.dumps(eval_payload))


def test_a_finished_run_is_read_back_with_its_training_accuracy(compare, tmp_path):
    _write_run(tmp_path / "igpo-seed1",
               {"before": {"pass@1": 0.1}, "after": {"pass@1": 0.25, "browse_ratio": 0.4}},
               [0.9, 0.0, 0.5, 1.0])
    before, after = compare.finished_run(tmp_path / "igpo-seed1")
    assert before == {"pass@1": 0.1}
    assert after["pass@1"] == 0.25 and after["browse_ratio"] == 0.4
    assert after["train_accuracy_last3"] == pytest.approx(0.5)  # the last three steps only


def test_a_run_without_a_finished_evaluation_is_trained_again(compare, tmp_path):
    _write_run(tmp_path / "killed", None, [0.1])
    _write_run(tmp_path / "no-after", {"before": {"pass@1": 0.1}, "after": {}}, [0.1])
    assert compare.finished_run(tmp_path / "killed") is None
    assert compare.finished_run(tmp_path / "no-after") is None
    assert compare.finished_run(tmp_path / "missing") is None


def test_a_finished_run_with_other_settings_is_refused_by_name(compare, tmp_path):
    _write_run(tmp_path / "run", {"before": {}, "after": {"pass@1": 0.2}}, [0.0])
    same_but_before = {**CONFIG, "eval": {"before": False, "num_tasks": 0}}
    assert compare.finished_run(tmp_path / "run", same_but_before)[1]["pass@1"] == 0.2
    other = {**CONFIG, "run": {"seed": 1, "steps": 50}, "policy": {"path": "elsewhere"}}
    with pytest.raises(SystemExit, match=r"policy\.path, run\.steps"):
        compare.finished_run(tmp_path / "run", other)


def test_a_setting_added_after_the_run_counts_as_its_default(compare, tmp_path):
    """Runs trained before env.prompt_style existed used the full prompt, its default."""
    _write_run(tmp_path / "run", {"before": {}, "after": {"pass@1": 0.2}}, [0.0])
    old_env = {"world_seed": 0, "search_top_k": 3}
    saved = {**CONFIG, "env": old_env}
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
    with_default = {**saved, "env": {**old_env, "prompt_style": "full"}}
    assert compare.finished_run(tmp_path / "run", with_default)[1]["pass@1"] == 0.2
    with pytest.raises(SystemExit, match=r"\(env\.prompt_style\)"):
        compare.finished_run(tmp_path / "run", {**saved, "env": {**old_env,
                                                                 "prompt_style": "compact"}})
