"""examples/sft_tiny.py runs several configs in order, a later pass starting from an earlier
pass's final model (how the seventh session's three passes run as one command)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sft_tiny.py"


def load_example():
    spec = importlib.util.spec_from_file_location("sft_tiny_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_config(path: Path, model: dict, train: dict) -> Path:
    config = {
        "model": {"vocab_size": 512, "hidden": 32, "layers": 1, "heads": 1, **model},
        "data": {"num_episodes": 4, "mixture": "plain", "max_seq_len": 1024},
        "train": {"max_steps": 2, "progress_bar": False, "log_every": 1000, "save_every": 0,
                  **train},
        "env": {"world_size": 300, "hops": [1], "prompt_style": "compact"},
        "eval": {"num_tasks": 1, "max_new_tokens": 8, "max_turns": 1},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_configs_run_in_order_and_a_later_pass_starts_from_the_earlier_model(
        tmp_path, monkeypatch, capsys):
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first = write_config(tmp_path / "first.yaml", {}, {"output_dir": str(first_dir),
                                                         "lr": 1e-2})
    final = str(first_dir / "final")
    second = write_config(tmp_path / "second.yaml", {"name": final, "tokenizer": final},
                          {"output_dir": str(second_dir), "lr": 1e-7})
    monkeypatch.setattr(sys, "argv", ["sft_tiny.py", "--config", str(first), str(second)])
    load_example().main()
    out = capsys.readouterr().out
    assert out.index(f"== {first}") < out.index(f"== {second}")
    assert out.count("RESULT format_valid_rate=") == 2
    before = load_file(first_dir / "final" / "model.safetensors")
    after = load_file(second_dir / "final" / "model.safetensors")
    assert before.keys() == after.keys()
    # Two steps at lr 1e-7 move no weight by more than ~2e-7, while the first pass's two
    # steps at lr 1e-2 moved its weights ~1e-2 away from the seeded initialisation a second
    # pass would build if it ignored model.name.
    moved = max((after[k] - before[k]).abs().max().item() for k in before)
    assert moved < 1e-5


def test_several_configs_refuse_a_flag_that_names_one_run(tmp_path, monkeypatch, capsys):
    config = write_config(tmp_path / "a.yaml", {}, {"output_dir": str(tmp_path / "a")})
    monkeypatch.setattr(sys, "argv", ["sft_tiny.py", "--config", str(config), str(config),
                                      "--resume", "latest"])
    with pytest.raises(SystemExit):
        load_example().main()
    assert "give them one --config" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_eval_world_seed_flag_reaches_only_the_evaluation(tmp_path, monkeypatch):
    config_path = write_config(tmp_path / "a.yaml", {}, {"output_dir": str(tmp_path / "a")})
    example = load_example()
    seen = []
    monkeypatch.setattr(example, "evaluate_checkpoint",
                        lambda config, checkpoint: seen.append(
                            (config.eval_env_kwargs()["world_seed"],
                             config.env_kwargs()["world_seed"], checkpoint)) or {})
    monkeypatch.setattr(sys, "argv", ["sft_tiny.py", "--config", str(config_path),
                                      "--eval-checkpoint", "ck", "--eval-world-seed", "45"])
    example.main()
    assert seen == [(45, 0, "ck")]
