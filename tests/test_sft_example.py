"""The SFT recipe (trainers.sft.recipe, `venus-gym sft`) runs several configs in order, a
later pass starting from an earlier pass's final model (several passes as one command)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from trainers.sft import recipe


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
        tmp_path, capsys):
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first = write_config(tmp_path / "first.yaml", {}, {"output_dir": str(first_dir),
                                                         "lr": 1e-2})
    final = str(first_dir / "final")
    second = write_config(tmp_path / "second.yaml", {"name": final, "tokenizer": final},
                          {"output_dir": str(second_dir), "lr": 1e-7})
    assert recipe.main(["--config", str(first), str(second)]) == 0
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


def test_several_configs_refuse_a_flag_that_names_one_run(tmp_path, capsys):
    config = write_config(tmp_path / "a.yaml", {}, {"output_dir": str(tmp_path / "a")})
    with pytest.raises(SystemExit):
        recipe.main(["--config", str(config), str(config), "--resume", "latest"])
    assert "give them one --config" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_venus_gym_sft_hands_its_arguments_to_the_recipe(tmp_path, monkeypatch, capsys):
    """`venus-gym sft ...` is the recipe's own parser under the command's name."""
    from trainers.cli import main as venus_gym_main

    config = write_config(tmp_path / "a.yaml", {}, {"output_dir": str(tmp_path / "a")})
    with pytest.raises(SystemExit):
        venus_gym_main(["sft", "--config", str(config), str(config), "--eval-checkpoint", "c"])
    err = capsys.readouterr().err
    assert err.startswith("usage: venus-gym sft") and "give them one --config" in err
    seen = []
    monkeypatch.setattr(recipe, "evaluate_checkpoint",
                        lambda config, checkpoint: seen.append(
                            (config.eval.num_tasks, checkpoint)) or {"step": 7})
    assert venus_gym_main(["sft", "--config", str(config), "--eval-checkpoint", "ck",
                           "--eval-tasks", "3"]) == 0
    assert seen == [(3, "ck")] and "RESULT step=7" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        venus_gym_main(["sft"])  # --config is required: no default in the library
    assert "--config" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_eval_world_seed_flag_reaches_only_the_evaluation(tmp_path, monkeypatch):
    config_path = write_config(tmp_path / "a.yaml", {}, {"output_dir": str(tmp_path / "a")})
    seen = []
    monkeypatch.setattr(recipe, "evaluate_checkpoint",
                        lambda config, checkpoint: seen.append(
                            (config.eval_env_kwargs()["world_seed"],
                             config.env_kwargs()["world_seed"], checkpoint)) or {})
    recipe.main(["--config", str(config_path), "--eval-checkpoint", "ck",
                 "--eval-world-seed", "45"])
    assert seen == [(45, 0, "ck")]


def test_sampled_evaluation_pools_seeds_and_reports_each(tmp_path, monkeypatch):
    """eval.seeds: each seed plays every task with its own sampling stream; the result pools
    all episodes and names each seed's rates."""
    from trainers.sft.config import load_config
    from trainers.sft.pipeline import build_chat, build_model, build_tokenizer

    path = write_config(tmp_path / "a.yaml", {}, {"output_dir": str(tmp_path / "a")})
    config = load_config(path)
    config.eval = dataclasses.replace(config.eval, num_tasks=2, max_new_tokens=12,
                                      temperature=1.0, seeds=(3, 4), retries=1)
    tokenizer = build_tokenizer(config.model, config.env_kwargs(), config.data.world_seeds)
    chat = build_chat(tokenizer)
    model = build_model(config.model, tokenizer)
    evaluations = []
    original = recipe.evaluate

    def spy(engine, chat, env_kwargs, num_tasks, seeds, sampling, max_retries, progress):
        assert max_retries == 1  # eval.retries reaches the evaluation
        assert tuple(seeds) == (3, 4)
        assert sampling.temperature == 1.0 and sampling.max_turn_tokens == 12
        evaluation = original(engine, chat, env_kwargs, num_tasks=num_tasks, seeds=seeds,
                              sampling=sampling, max_retries=max_retries, progress=False)
        evaluations.append(evaluation)
        return evaluation

    monkeypatch.setattr(recipe, "evaluate", spy)
    results = recipe.evaluate_model(config, model, chat)
    (evaluation,) = evaluations
    played = [[t.input_ids for group, s in zip(evaluation.per_task, evaluation.seeds)
               if s == seed for t in group] for seed in (3, 4)]
    assert results["episodes"] == 4  # 2 tasks x 2 seeds
    assert set(results) >= {"format_valid_rate_seed3", "format_valid_rate_seed4",
                            "accuracy_seed3", "accuracy_seed4"}
    assert len(played) == 2 and played[0] != played[1]  # the seeds sampled differently
    turns = [turn.valid for t in evaluation.trajectories for turn in t.turns]
    # An untrained model's 12-token turns are malformed, so each turn was retried once, and
    # every discarded attempt counts as a malformed turn.
    discarded = sum(len(t.metadata["discarded_turns"]) for t in evaluation.trajectories)
    assert discarded == len(turns)
    assert results["format_valid_rate"] == pytest.approx(sum(turns) / (len(turns) + discarded))
    assert results["retried_turn_rate"] == pytest.approx(discarded / (len(turns) + discarded))


def test_greedy_evaluation_refuses_several_seeds(tmp_path, capsys):
    from trainers.sft.config import EvalConfig, from_dict

    with pytest.raises(ValueError, match="greedy decoding plays the same episodes"):
        EvalConfig(temperature=0.0, seeds=(0, 1))
    with pytest.raises(ValueError, match="eval.seeds is empty"):
        EvalConfig(temperature=0.5, seeds=())
    with pytest.raises(ValueError, match=r"eval.seeds\[1\] must be int, got 'a'"):
        from_dict(EvalConfig, {"temperature": 0.5, "seeds": [0, "a"]}, where="eval")
    with pytest.raises(ValueError, match="eval.seeds must be distinct, got \\[1, 1\\]"):
        EvalConfig(temperature=0.5, seeds=(1, 1))
    with pytest.raises(ValueError, match="eval.temperature must be >= 0"):
        EvalConfig(temperature=float("nan"))
    with pytest.raises(ValueError, match="eval.temperature must be >= 0"):
        EvalConfig(temperature=-0.1)
    with pytest.raises(ValueError, match="a greedy retry generates the same turn again"):
        EvalConfig(temperature=0.0, retries=2)
    with pytest.raises(ValueError, match="eval.retries must be >= 0"):
        EvalConfig(temperature=0.5, retries=-1)
    assert EvalConfig(temperature=0.5, retries=5).retries == 5
    config = write_config(tmp_path / "a.yaml", {}, {"output_dir": str(tmp_path / "a")})
    for flags, message in ((["--eval-seeds", "0", "1"], "greedy decoding plays the same episodes"),
                           (["--eval-retries", "3"], "a greedy retry generates the same turn")):
        with pytest.raises(SystemExit):
            recipe.main(["--config", str(config), *flags])
        assert message in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_eval_checkpoint_takes_a_saved_model_directory(tmp_path, monkeypatch):
    """--eval-checkpoint runs/<run>/final evaluates that model's weights, not the config's
    starting model."""
    import torch

    from trainers.sft.config import load_config
    from trainers.sft.pipeline import build_model, build_tokenizer

    config = load_config(write_config(tmp_path / "a.yaml", {}, {"output_dir": str(tmp_path),
                                                                 "device": "cpu"}))
    tokenizer = build_tokenizer(config.model, config.env_kwargs(), config.data.world_seeds)
    saved = build_model(config.model, tokenizer)
    with torch.no_grad():
        for parameter in saved.parameters():
            parameter.add_(1.0)
    saved.save_pretrained(tmp_path / "final")
    seen = {}
    monkeypatch.setattr(recipe, "evaluate_model",
                        lambda config, model, chat: seen.update(model.state_dict()) or {})
    assert recipe.evaluate_checkpoint(config, str(tmp_path / "final")) == {"step": "final"}
    for name, value in saved.state_dict().items():
        assert torch.equal(seen[name], value), name
    with pytest.raises(FileNotFoundError, match="neither a training checkpoint"):
        recipe.evaluate_checkpoint(config, str(tmp_path))
    config.model.grow_layers_after = (0,)  # the saved 1-layer model does not fit a grown one
    with pytest.raises(ValueError, match=r"do not fit the model the config builds .*"
                                         r"grow_layers_after \[0\]"):
        recipe.evaluate_checkpoint(config, str(tmp_path / "final"))


def test_a_missed_warmup_target_ends_the_run_before_any_data_with_the_advice(
        tmp_path, capsys):
    config = write_config(tmp_path / "a.yaml", {}, {
        "output_dir": str(tmp_path / "a"), "induction_warmup_steps": 12,
        "induction_warmup_batch_size": 2, "induction_warmup_target_loss": 0.01})
    with pytest.raises(SystemExit) as stopped:
        recipe.main(["--config", str(config)])
    message = str(stopped.value.code)
    assert message.startswith(f"{config}: the induction warm-up did not teach the model")
    assert "train.induction_warmup_steps" in message
    assert not (tmp_path / "a" / "final").exists()  # SFT never ran
    assert "data:" not in capsys.readouterr().out  # nor was any data built
