"""A saved policy carries the env settings it was trained with (warm_start.json), and
`eval`, `chat` and `rl` play it with them unless told otherwise
(trainers.modeling.warm_start.policy_env, trainers.evaluation.run.with_policy_defaults)."""

from __future__ import annotations

import json

import yaml

from trainers.cli import main as cli_main
from trainers.evaluation.run import EvalRunConfig, with_policy_defaults
from trainers.modeling.warm_start import policy_env, policy_record, write_policy_record
from trainers.sft.config import SFTExperimentConfig
from trainers.sft.pipeline import write_sft_record


def _policy(tmp_path, name="policy", **env):
    directory = tmp_path / name
    directory.mkdir()
    write_policy_record(directory, env or {"prompt_style": "compact", "hops": (1, 2),
                                           "search_top_k": 3},
                        stage="sft", sft_world_seeds=[1, 2], world_size=500)
    return directory


def test_an_sft_run_records_its_env_and_the_worlds_of_its_whole_chain(tmp_path):
    start = _policy(tmp_path, "start")
    config = SFTExperimentConfig()
    config.model.name = str(start)
    config.env.prompt_style = "compact"
    config.env.search_top_k = 4
    config.env.hops = (2,)
    config.data.world_seeds = (13, 14)
    final = tmp_path / "final"
    final.mkdir()
    write_sft_record(config, final)
    record = json.loads((final / "warm_start.json").read_text())
    assert record["env"] == {"prompt_style": "compact", "search_top_k": 4, "hops": [2]}
    assert record["sft_world_seeds"] == [1, 2, 13, 14]  # the start's worlds and its own
    assert record["start"] == str(start) and record["stage"] == "sft"
    assert policy_env(final) == {"prompt_style": "compact", "hops": (2,), "search_top_k": 4}
    assert "hops" not in policy_env(final, generated_world=False)


def test_a_policy_without_a_record_has_no_env_settings(tmp_path):
    assert policy_record(tmp_path) == {} and policy_env(tmp_path) == {}
    assert policy_record(tmp_path / "missing") == {}


def test_eval_plays_a_policy_with_its_recorded_env_and_world_unless_told(tmp_path):
    policy = _policy(tmp_path)
    lines = []
    config = with_policy_defaults(EvalRunConfig(out="o", policy=str(policy)), lines.append)
    assert config.benchmark == "generated" and config.world_size == 500
    assert config.env == {"prompt_style": "compact", "hops": (1, 2), "search_top_k": 3}
    assert "prompt_style=compact" in lines[0] and str(policy) in lines[0]
    # The user's settings win; a real QA set gets no generated-world question mix.
    told = with_policy_defaults(EvalRunConfig(out="o", policy=str(policy), benchmark="hotpotqa",
                                              world_size=900, env={"prompt_style": "full"}))
    assert told.benchmark == "hotpotqa" and told.world_size == 900
    assert told.env == {"prompt_style": "full", "search_top_k": 3}
    # No record: the default benchmark is HotpotQA, the env as given.
    plain = tmp_path / "plain"
    plain.mkdir()
    untouched = with_policy_defaults(EvalRunConfig(out="o", policy=str(plain)))
    assert untouched.benchmark == "hotpotqa" and untouched.env == {}


def test_rl_takes_the_start_policys_env_for_keys_the_config_leaves_unset(tmp_path, capsys):
    policy = _policy(tmp_path, prompt_style="compact", hops=(1,), search_top_k=2)
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump({"policy": {"path": str(policy)},
                                    "env": {"search_top_k": 5}}))
    assert cli_main(["rl", "--config", str(path), "--print-config"]) == 0
    captured = capsys.readouterr()
    printed = yaml.safe_load(captured.out)
    # The file's search width stays; the recorded prompt and question mix fill the rest.
    assert printed["env"]["search_top_k"] == 5
    assert printed["env"]["prompt_style"] == "compact" and printed["env"]["hops"] == [1]
    assert "its warm_start.json" in captured.err
    assert cli_main(["rl", "--config", str(path), "env.prompt_style=full",
                     "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["env"]["prompt_style"] == "full" and printed["env"]["hops"] == [1]
