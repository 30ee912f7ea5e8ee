"""The main job (trainers.pipeline, `venus-gym demo`) end to end at toy size: every stage
writes its artefact, SFT continues the packaged warm start and RL the SFT policy (or, after
SFT from scratch, RL starts from the warm start), and the report compares the policies on
paired held-out tasks. Also: every shipped RL config loads and validates."""

from __future__ import annotations

import dataclasses
import json
from importlib.resources import files
from pathlib import Path

import pytest
import torch
import yaml

from trainers.modeling.models import WARM_START, load_causal_lm
from trainers.modeling.warm_start import warm_start_info
from trainers.pipeline import DEFAULT_RL_CONFIG, DEFAULT_SFT_CONFIG, run_pipeline
from trainers.rl.config import load_rl_config
from trainers.sft.config import load_config
from trainers.trajectory import read_trajectories

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "examples" / "configs"


def rl_config_paths() -> list[Path]:
    """The demo's RL config and every RL config under examples/configs and
    benchmarks/configs (the files with a `rollout` section)."""
    found = sorted(path for folder in (CONFIGS, REPO / "benchmarks" / "configs")
                   for path in folder.glob("*.yaml")
                   if "rollout" in (yaml.safe_load(path.read_text()) or {}))
    return [Path(DEFAULT_RL_CONFIG), *found]


RL_CONFIGS = rl_config_paths()


def test_the_example_rl_configs_are_all_found():
    names = {path.name for path in RL_CONFIGS}
    assert {"compare_rl.yaml", "cluster_igpo_vllm.yaml", "smollm2_igpo.yaml",
            "qwen3_igpo_gpu.yaml", "gpu_igpo_qwen3_0p5b.yaml", "learning_check_igpo.yaml",
            "fit_check_igpo.yaml", "learning_check_igpo_lora.yaml"} <= names


def test_the_lora_learning_check_differs_from_the_shipped_one_only_in_its_update():
    """The LoRA variant answers one question (does a low-rank update forget less?), so it
    must stay the shipped check in everything but the learner's LoRA settings and rate."""
    configs = REPO / "benchmarks" / "configs"
    shipped = yaml.safe_load((configs / "learning_check_igpo.yaml").read_text())
    lora = yaml.safe_load((configs / "learning_check_igpo_lora.yaml").read_text())
    assert {key: value for key, value in lora.items() if key != "learner"} == \
        {key: value for key, value in shipped.items() if key != "learner"}
    changed = {key for key in lora["learner"].keys() | shipped["learner"].keys()
               if lora["learner"].get(key) != shipped["learner"].get(key)}
    assert changed == {"lr", "lora_rank", "lora_alpha"}
    assert lora["learner"]["lora_rank"] > 0


@pytest.mark.parametrize("path", RL_CONFIGS, ids=lambda path: path.stem)
def test_shipped_rl_configs_load_and_validate(path):
    config = load_rl_config(path)
    config.policy.path = "somewhere"
    config.validate()
    text = Path(path).read_text()
    assert text.startswith("# ") and ("venus-gym" in text.splitlines()[0]
                                      or "python" in text.splitlines()[0])


def test_the_learning_check_samples_at_the_temperature_of_the_warm_start_card():
    """The warm start's card (trainers/warm_start/README.md) gives its held-out numbers at
    the temperature RL rolls it out at: the learning check's config and the card's
    warm_start.json must name the same one, or the card describes a policy RL never plays."""
    config = load_rl_config(REPO / "benchmarks" / "configs" / "learning_check_igpo.yaml")
    assert config.policy.path == "warm-start"
    card = warm_start_info()
    assert card is not None, "trainers/warm_start has no warm_start.json"
    assert card["eval"]["temperature"] == config.rollout.temperature, (
        f"the card was measured at temperature {card['eval']['temperature']}, the learning "
        f"check rolls out at {config.rollout.temperature}: repackage the card "
        "(scripts/package_warm_start.py --temperature) or change rollout.temperature")


def test_the_default_configs_are_package_data_named_by_their_command():
    """`venus-gym demo` reads its defaults from the installed package, not a checkout; each
    names the command that runs it on its first line."""
    shipped = files("trainers") / "configs"
    assert [DEFAULT_SFT_CONFIG, DEFAULT_RL_CONFIG] == [str(shipped / "demo_sft.yaml"),
                                                       str(shipped / "demo_igpo.yaml")]
    for path in (DEFAULT_SFT_CONFIG, DEFAULT_RL_CONFIG):
        assert Path(path).read_text().splitlines()[0].startswith("# venus-gym demo")
    assert load_config(DEFAULT_SFT_CONFIG).data.num_episodes > 0


def _small_configs(from_scratch: bool = False):
    """The demo's configs at toy size. The default SFT stage continues the packaged warm
    start; `from_scratch` trains a tiny model from nothing instead (with its own tokenizer)."""
    sft = load_config(DEFAULT_SFT_CONFIG)
    sft.env = dataclasses.replace(sft.env, world_size=300, world_seed=3, hops=(1,))
    sft.data = dataclasses.replace(sft.data, num_episodes=12, max_seq_len=4096,
                                   world_seeds=(37,))
    if from_scratch:
        sft.model = dataclasses.replace(sft.model, name="tiny", tokenizer="world",
                                        vocab_size=1024, hidden=64, layers=2, heads=2)
        sft.data = dataclasses.replace(sft.data, world_seeds=())
    sft.train = dataclasses.replace(sft.train, max_steps=3, save_every=0, log_every=1,
                                    progress_bar=False, threads_per_worker=1)
    rl = load_rl_config(DEFAULT_RL_CONFIG)
    rl.policy.threads = 1
    rl.env = dataclasses.replace(rl.env, max_turns=3, max_context_tokens=1500)
    rl.rollout = dataclasses.replace(rl.rollout, group_size=2, queries_per_step=1,
                                     max_turn_tokens=24, max_context_tokens=2048)
    rl.run = dataclasses.replace(rl.run, steps=1, progress_bar=False, tensorboard="off")
    rl.eval = dataclasses.replace(rl.eval, num_tasks=2, max_turn_tokens=24)
    rl.learner = dataclasses.replace(rl.learner, lr=0.0)
    return sft, rl


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].shape == b[k].shape and torch.equal(a[k], b[k])
                                        for k in a)


def test_the_demo_continues_the_warm_start_with_sft_then_rl_continues_the_sft_policy(tmp_path):
    """SFT continues `warm-start` on oracle episodes of its own worlds (not the RL world) and
    changes it; RL starts from the SFT policy (at lr 0 its final weights are the SFT
    stage's) with the SFT stage's env settings; the report plays all three policies on the
    same tasks and gives what each stage changed."""
    sft, rl = _small_configs()
    assert sft.model.name == WARM_START and rl.policy.path == WARM_START

    result = run_pipeline(sft, rl, tmp_path, log=False, eval_samples=2)

    data = read_trajectories(tmp_path / "sft_data.jsonl")
    assert len(data) == 12 and all(t.outcome == 1.0 for t in data)
    assert all(t.task_id.startswith("venus-s37-") for t in data)  # data.world_seeds, not 3
    sft_final = load_causal_lm(tmp_path / "sft" / "final").state_dict()
    assert not _same(sft_final, load_causal_lm(WARM_START).state_dict())
    assert _same(load_causal_lm(tmp_path / "rl" / "final").state_dict(), sft_final)

    assert result.start_policy == str(tmp_path / "sft" / "final")
    numbers = json.loads((tmp_path / "report.json").read_text())
    assert numbers["sft_continued"] == WARM_START
    rl_used = numbers["config"]["rl"]
    assert rl_used["policy"]["path"] == str(tmp_path / "sft" / "final")
    assert (rl_used["env"]["world_size"], rl_used["env"]["world_seed"]) == (300, 3)
    assert rl_used["env"]["prompt_style"] == sft.env.prompt_style == "compact"
    assert list(rl_used["env"]["hops"]) == [1]
    # lr 0: RL changed nothing, so "both stages" is exactly "the SFT stage", metric by metric
    stages = numbers["paired_by_stage"]
    assert set(stages) == {"sft", "sft+rl"}
    assert all(d["diff"] == 0 for d in numbers["paired"].values())
    for metric, d in stages["sft"].items():
        assert stages["sft+rl"][metric]["a"] == d["a"] and stages["sft+rl"][metric]["b"] == d["b"]
    report = result.report.read_text()
    assert "continuing `warm-start`" in report and "RL continues this run's SFT policy" in report
    assert "| metric | before SFT | after SFT |" in report
    assert "| metric | after SFT | after RL |" in report


def test_with_sft_from_scratch_rl_starts_from_the_packaged_warm_start(tmp_path):
    """SFT from scratch runs and saves its policy; RL loads the packaged warm start (at lr 0
    its final weights are the warm start's, not the SFT stage's), with the warm start's env
    settings; the report says so and compares start and RL policy with paired SEs."""
    sft, rl = _small_configs(from_scratch=True)
    assert rl.policy.path == WARM_START

    result = run_pipeline(sft, rl, tmp_path, log=False, eval_samples=2)

    assert (tmp_path / "world" / "corpus.jsonl").is_file()
    data = read_trajectories(tmp_path / "sft_data.jsonl")
    assert len(data) == 12 and all(t.outcome == 1.0 for t in data)  # oracle, kept if correct
    assert (tmp_path / "sft" / "final" / "config.json").is_file()
    assert len((tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()) == 1
    rl_final = load_causal_lm(tmp_path / "rl" / "final").state_dict()
    assert _same(rl_final, load_causal_lm(WARM_START).state_dict())
    assert not _same(rl_final, load_causal_lm(tmp_path / "sft" / "final").state_dict())

    assert result.start_policy == WARM_START
    report = result.report.read_text()
    assert result.report == tmp_path / "report.md"
    assert "RL started from `warm-start`" in report and "never answers correctly" in report
    assert "from scratch" in report and "before SFT" not in report
    assert "paired, sampled held-out evaluation" in report
    assert "## Evaluation: before vs after RL" in report and "![training curves]" in report
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    numbers = json.loads((tmp_path / "report.json").read_text())
    assert set(numbers["paired"]) == {"pass@1", "format_valid_rate", "answer_rate"}
    assert numbers["paired_by_stage"] == {} and numbers["sft_continued"] == ""
    # lr 0: the two policies are the same weights under the same seeds, so nothing changed
    assert all(d["diff"] == 0 and not d["worse"] for d in numbers["paired"].values())
    assert numbers["before"]["tasks"] == 2 and numbers["after"]["tasks"] == 2
    assert numbers["training"]["steps_logged"] == 1
    rl_used = numbers["config"]["rl"]
    assert rl_used["policy"]["path"] == WARM_START
    assert rl_used["env"]["prompt_style"] == warm_start_info()["env"]["prompt_style"]
    assert (rl_used["env"]["world_size"], rl_used["env"]["world_seed"]) == (300, 3)
    assert set(result.seconds) == {"world", "data", "sft", "rl", "eval", "report"}
