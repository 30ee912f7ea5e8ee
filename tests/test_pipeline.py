"""The main job (trainers.pipeline, `venus-gym demo`) end to end at toy size: every stage
writes its artefact and the report compares the SFT policy with the RL policy on held-out
tasks. Also: every shipped RL config loads and validates."""

from __future__ import annotations

import dataclasses
import json
from importlib.resources import files
from pathlib import Path

import pytest
import yaml

from trainers.pipeline import DEFAULT_RL_CONFIG, DEFAULT_SFT_CONFIG, run_pipeline
from trainers.rl.config import load_rl_config
from trainers.sft.config import load_config
from trainers.trajectory import read_trajectories

CONFIGS = Path(__file__).resolve().parents[1] / "examples" / "configs"


def rl_config_paths() -> list[Path]:
    """The demo's RL config and every RL config under examples/configs (the files with a
    `rollout` section)."""
    examples = sorted(path for path in CONFIGS.glob("*.yaml")
                      if "rollout" in (yaml.safe_load(path.read_text()) or {}))
    return [Path(DEFAULT_RL_CONFIG), *examples]


RL_CONFIGS = rl_config_paths()


def test_the_example_rl_configs_are_all_found():
    names = {path.name for path in RL_CONFIGS}
    assert {"compare_rl.yaml", "cluster_igpo_vllm.yaml", "smollm2_igpo.yaml",
            "qwen3_igpo_gpu.yaml", "gpu_igpo_qwen3_0p5b.yaml"} <= names


@pytest.mark.parametrize("path", RL_CONFIGS, ids=lambda path: path.stem)
def test_shipped_rl_configs_load_and_validate(path):
    config = load_rl_config(path)
    config.policy.path = "somewhere"
    config.validate()
    text = Path(path).read_text()
    assert text.startswith("# ") and ("venus-gym" in text.splitlines()[0]
                                      or "python" in text.splitlines()[0])


def test_the_default_configs_are_package_data_named_by_their_command():
    """`venus-gym demo` reads its defaults from the installed package, not a checkout; each
    names the command that runs it on its first line."""
    shipped = files("trainers") / "configs"
    assert [DEFAULT_SFT_CONFIG, DEFAULT_RL_CONFIG] == [str(shipped / "demo_sft.yaml"),
                                                       str(shipped / "demo_igpo.yaml")]
    for path in (DEFAULT_SFT_CONFIG, DEFAULT_RL_CONFIG):
        assert Path(path).read_text().splitlines()[0].startswith("# venus-gym demo")
    assert load_config(DEFAULT_SFT_CONFIG).data.num_episodes > 0


def test_pipeline_runs_every_stage_and_writes_the_report(tmp_path):
    sft = load_config(DEFAULT_SFT_CONFIG)
    sft.env = dataclasses.replace(sft.env, world_size=300, world_seed=3, hops=(1,))
    sft.model = dataclasses.replace(sft.model, vocab_size=1024, hidden=64, layers=2, heads=2)
    sft.data = dataclasses.replace(sft.data, num_episodes=12, max_seq_len=4096)
    sft.train = dataclasses.replace(sft.train, max_steps=3, save_every=0, log_every=1,
                                    progress_bar=False, threads_per_worker=1)
    rl = load_rl_config(DEFAULT_RL_CONFIG)
    rl.policy.threads = 1
    rl.env = dataclasses.replace(rl.env, max_turns=3, max_context_tokens=1500)
    rl.rollout = dataclasses.replace(rl.rollout, group_size=2, queries_per_step=1,
                                     max_turn_tokens=24, max_context_tokens=2048)
    rl.run = dataclasses.replace(rl.run, steps=1, progress_bar=False, tensorboard="off")
    rl.eval = dataclasses.replace(rl.eval, num_tasks=2, max_turn_tokens=24)

    result = run_pipeline(sft, rl, tmp_path, log=False)

    assert (tmp_path / "world" / "corpus.jsonl").is_file()
    data = read_trajectories(tmp_path / "sft_data.jsonl")
    assert len(data) == 12 and all(t.outcome == 1.0 for t in data)  # oracle, kept if correct
    assert (tmp_path / "sft" / "final" / "config.json").is_file()
    assert (tmp_path / "rl" / "final" / "config.json").is_file()
    assert len((tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()) == 1
    report = result.report.read_text()
    assert result.report == tmp_path / "report.md"
    assert "## Evaluation: before vs after RL" in report and "![training curves]" in report
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    numbers = json.loads((tmp_path / "report.json").read_text())
    assert numbers["before"]["tasks"] == 2 and numbers["after"]["tasks"] == 2
    assert numbers["before"]["pass@1"] == result.before["pass@1"]
    assert numbers["training"]["steps_logged"] == 1
    assert numbers["config"]["rl"]["policy"]["path"] == str(tmp_path / "sft" / "final")
    assert set(result.seconds) == {"world", "data", "sft", "rl", "report"}
