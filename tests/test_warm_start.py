"""The packaged warm start: `warm-start` names it wherever a policy path is accepted, the
packaging script copies, evaluates and describes a policy, and the package ships one that
is small, loads, and carries a model card with its numbers and the worlds it never saw."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

import trainers.modeling.models
from trainers.data.oracle_data import world_texts
from trainers.modeling.models import (
    WARM_START,
    build_chatml_tokenizer,
    build_tiny_causal_lm,
    load_policy,
    resolve_model_path,
    warm_start_dir,
)
from trainers.modeling.warm_start import warm_start_info
from trainers.sft.warm_start_package import MAX_MODEL_BYTES, copy_policy, package

WORLD = {"world_size": 300, "hops": [1], "search_top_k": 2}


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("policy")
    tokenizer = build_chatml_tokenizer(world_texts({**WORLD, "world_seed": 1}), vocab_size=1024)
    build_tiny_causal_lm(tokenizer, hidden=32, layers=1, heads=1, seed=0).save_pretrained(
        directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture()
def sft_config(tmp_path) -> str:
    path = tmp_path / "sft.yaml"
    path.write_text("# venus-gym sft --config sft.yaml\n" + yaml.safe_dump({
        "data": {"world_seeds": [1, 2]},
        "env": {**WORLD, "world_seed": 0, "prompt_style": "compact"},
        "eval": {"max_turns": 2}}))
    return str(path)


def test_other_paths_pass_through_and_an_empty_package_says_how_to_fill_it(tmp_path,
                                                                           monkeypatch):
    assert str(resolve_model_path("runs/x/final")) == "runs/x/final"
    monkeypatch.setattr(trainers.modeling.models, "warm_start_dir", lambda: tmp_path)
    with pytest.raises(FileNotFoundError, match="package_warm_start.py"):
        load_policy(WARM_START)


def test_package_copies_evaluates_and_describes_the_policy(policy_dir, sft_config, tmp_path,
                                                           monkeypatch):
    dest = tmp_path / "warm_start"
    dest.mkdir()
    (dest / "stale.bin").write_text("from an earlier policy")
    info = package(policy_dir, dest, sft_configs=(sft_config,), worlds=(3, 4), num_tasks=2,
                   k=2, max_turn_tokens=8, commit="abc1234")

    assert not (dest / "stale.bin").exists()
    assert {"config.json", "model.safetensors", "tokenizer.json", "warm_start.json",
            "README.md"} <= {p.name for p in dest.iterdir()}
    assert info["sft_world_seeds"] == [1, 2] and info["held_out_worlds"] == [3, 4]
    assert info["env"] == {"prompt_style": "compact", "hops": [1], "search_top_k": 2}
    assert set(info["results"]) == {"world 3 test", "world 4 test", "all"}
    assert info["results"]["all"]["tasks"] == 4
    for value, se in (info["results"]["all"][m]
                      for m in ("pass@1", "format_valid_rate", "answer_rate")):
        assert 0.0 <= value <= 1.0 and se >= 0.0
    card = (dest / "README.md").read_text()
    assert f"venus-gym sft --config {sft_config}" in card and "abc1234" in card
    assert "| world 3 test | 2 |" in card and "world seeds 1-2" in card
    assert json.loads((dest / "warm_start.json").read_text()) == info

    # `warm-start` now loads the copy, with the source's weights
    monkeypatch.setattr(trainers.modeling.models, "warm_start_dir", lambda: dest)
    packaged, _, _ = load_policy(WARM_START)
    source, _, _ = load_policy(policy_dir)
    assert all(torch.equal(a, b) for a, b in zip(packaged.state_dict().values(),
                                                  source.state_dict().values()))
    assert warm_start_info()["commit"] == "abc1234"


def test_package_refuses_training_worlds_and_oversized_models(policy_dir, sft_config,
                                                              tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"\[2\].*never saw"):
        package(policy_dir, tmp_path / "a", sft_configs=(sft_config,), worlds=(2, 3))
    monkeypatch.setattr("trainers.sft.warm_start_package.MAX_MODEL_BYTES", 1000)
    with pytest.raises(ValueError, match="MiB"):
        copy_policy(trainers.modeling.models.Path(policy_dir), tmp_path / "b")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        copy_policy(tmp_path, tmp_path / "c")


def test_the_package_ships_a_small_warm_start_with_its_model_card():
    directory = warm_start_dir()
    assert (directory / "model.safetensors").stat().st_size <= MAX_MODEL_BYTES
    info = warm_start_info()
    assert info is not None
    assert not set(info["held_out_worlds"]) & set(info["sft_world_seeds"])
    card = (directory / "README.md").read_text()
    assert info["command"] in card and info["commit"] in card
    for name in info["results"]:
        assert f"| {name} |" in card
    model, tokenizer, chat = load_policy(WARM_START)
    assert resolve_model_path(WARM_START) == directory
    assert model.config.vocab_size >= len(tokenizer)
