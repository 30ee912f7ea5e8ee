"""`dotted.key=value` overrides on the command line (trainers.config_utils): typed and
validated exactly as the same value written in the YAML file, unknown keys refused with the
closest valid names, `--print-config` printing the resolved config of `venus-gym rl`,
`venus-gym sft` and `venus-gym eval`."""

from __future__ import annotations

import copy

import pytest
import yaml

from trainers.cli import main as cli_main
from trainers.config_utils import config_to_dict, load_yaml_config, parse_overrides
from trainers.rl.config import RLConfig, load_rl_config
from trainers.sft.config import SFTExperimentConfig

BASE = {"policy": {"path": "runs/sft/final"},
        "learner": {"lr": 1.0e-5},
        "algorithm": {"name": "igpo", "options": {"loss": {"entropy_coef": 0.01}}},
        "run": {"steps": 5}}


def write(tmp_path, data, name="run.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def set_dotted(data, key, value):
    data = copy.deepcopy(data)
    node = data
    *sections, last = key.split(".")
    for part in sections:
        node = node.setdefault(part, {})
    node[last] = value
    return data


# (override, the same value as YAML text in the file)
SAME_AS_YAML = [
    ("learner.lr=3e-4", "3e-4"),                 # YAML 1.1 reads a string: from_dict a float
    ("learner.lr=0.001", "0.001"),
    ("learner.betas=[0.8, 0.9]", "[0.8, 0.9]"),
    ("env.hops=[1]", "[1]"),
    ("env.hops=null", "null"),
    ("rollout.group_size=16", "16"),
    ("rollout.vllm_options={dtype: bfloat16, max_model_len: 4096}",
     "{dtype: bfloat16, max_model_len: 4096}"),
    ("run.use_ray=true", "true"),
    ("run.tensorboard='off'", "'off'"),
    ("algorithm.options.gamma=0.9", "0.9"),
    ("env.extra_tools=[calculator]", "[calculator]"),
]
# values the file refuses: the override is refused too
REFUSED_AS_YAML = [
    ("run.tensorboard=off", "off", "run.tensorboard must be str, got False"),
    ("rollout.group_size=many", "many", "rollout.group_size must be int"),
    ("learner.betas=[0.9]", "[0.9]", "learner.betas must have 2 items"),
]


@pytest.mark.parametrize("override, text", SAME_AS_YAML)
def test_an_override_is_the_same_value_written_in_the_file(tmp_path, override, text):
    key = override.partition("=")[0]
    in_file = set_dotted(BASE, key, yaml.safe_load(text))
    expected = load_yaml_config(write(tmp_path, in_file, "in_file.yaml"), RLConfig)
    overridden = load_rl_config(write(tmp_path, BASE), [override])
    assert config_to_dict(overridden) == config_to_dict(expected)
    assert config_to_dict(overridden) != config_to_dict(load_rl_config(write(tmp_path, BASE)))


@pytest.mark.parametrize("override, text, message", REFUSED_AS_YAML)
def test_a_value_the_file_refuses_is_refused_as_an_override(tmp_path, override, text, message):
    key = override.partition("=")[0]
    with pytest.raises(ValueError, match=message):
        load_rl_config(write(tmp_path, set_dotted(BASE, key, yaml.safe_load(text))))
    with pytest.raises(ValueError, match=message) as caught:
        load_rl_config(write(tmp_path, BASE), [override])
    assert f"(set by the override {override!r})" in str(caught.value)


def test_unknown_keys_are_refused_with_the_closest_valid_names(tmp_path):
    path = write(tmp_path, BASE)
    cases = {
        "learner.lrr=3e-4": "unknown key learner.lrr; did you mean learner.lr",
        "lr=3e-4": "unknown key lr; did you mean learner.lr?",
        "rollout.group_sise=4": "unknown key rollout.group_sise; did you mean "
                                "rollout.group_size",
        "env.wrld=hotpotqa": "unknown key env.wrld; did you mean env.world",
        "learner=3": "learner is a section, not a value",
        "learner.lr.decay=3": "unknown key learner.lr.decay: learner.lr is a value",
    }
    for override, message in cases.items():
        with pytest.raises(ValueError) as caught:
            load_rl_config(path, [override])
        assert str(caught.value).startswith(message), (override, str(caught.value))
    # keys inside a free-form mapping are checked by whoever reads it: the algorithm
    config = load_rl_config(path, ["algorithm.options.gama=0.9"])
    with pytest.raises(ValueError, match=r"\['gama'\] in algorithm.options \(did you mean "
                                         r"gamma\?\)"):
        config.validate()
    with pytest.raises(ValueError, match="not dotted.key=value"):
        parse_overrides(["learner.lr"])
    with pytest.raises(ValueError, match="unknown key model.nam; did you mean model.name"):
        load_yaml_config(write(tmp_path, {}, "sft.yaml"), SFTExperimentConfig,
                         ["model.nam=tiny"])


def test_later_overrides_win_and_mappings_merge(tmp_path):
    config = load_rl_config(write(tmp_path, BASE), [
        "learner.lr=1e-4", "learner.lr=2e-4", "algorithm.options.gamma=0.5",
        "algorithm.options={reward: {outcome_weight: 2.0}}"])
    assert config.learner.lr == 2e-4
    # the file's loss options and the first override survive the mapping merged in last
    assert config.algorithm.options == {"loss": {"entropy_coef": 0.01}, "gamma": 0.5,
                                        "reward": {"outcome_weight": 2.0}}


def test_rl_print_config_prints_the_resolved_config(tmp_path, capsys):
    path = write(tmp_path, BASE)
    code = cli_main(["rl", "--config", str(path), "learner.lr=3e-4", "--steps", "7",
                     "rollout.group_size=16", "--print-config"])
    assert code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    expected = load_rl_config(path, ["learner.lr=3e-4", "rollout.group_size=16"])
    expected.run.steps = 7
    assert printed == config_to_dict(expected)
    assert printed["learner"]["lr"] == 3e-4 and printed["run"]["steps"] == 7

    assert cli_main(["rl", "--config", str(path), "learner.lrr=3e-4", "--print-config"]) == 2
    assert "unknown key learner.lrr; did you mean learner.lr" in capsys.readouterr().err
    assert cli_main(["rl", "--config", str(path), "not-an-override", "--print-config"]) == 2
    assert "'not-an-override' is not dotted.key=value" in capsys.readouterr().err


def test_sft_and_eval_take_overrides_and_print_config(tmp_path, capsys):
    first = write(tmp_path, {"train": {"lr": 1.0e-3, "output_dir": str(tmp_path / "a")}},
                  "first.yaml")
    second = write(tmp_path, {"train": {"output_dir": str(tmp_path / "b")}}, "second.yaml")
    code = cli_main(["sft", "--config", str(first), str(second), "data.num_episodes=32",
                     "train.lr=5e-4", "--print-config"])
    assert code == 0
    out = capsys.readouterr().out
    sections = [yaml.safe_load(part.split("\n", 1)[1]) for part in out.split("== ")[1:]]
    assert [part.split("\n", 1)[0] for part in out.split("== ")[1:]] == [str(first),
                                                                          str(second)]
    assert [s["data"]["num_episodes"] for s in sections] == [32, 32]
    assert [s["train"]["lr"] for s in sections] == [5e-4, 5e-4]
    assert [s["train"]["output_dir"] for s in sections] == [str(tmp_path / "a"),
                                                           str(tmp_path / "b")]
    with pytest.raises(SystemExit):
        cli_main(["sft", "--config", str(first), "train.lrr=1", "--print-config"])
    assert "unknown key train.lrr; did you mean train.lr" in capsys.readouterr().err

    code = cli_main(["eval", "--policy", "warm-start", "--out", str(tmp_path / "eval"),
                     "--k", "2", "k=4", "env.search_top_k=3", "env.hops=[1, 2]",
                     "--print-config"])
    assert code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    # The packaged policy's recorded prompt style fills the env key the overrides leave open.
    assert printed["k"] == 4 and printed["env"] == {"prompt_style": "compact",
                                                    "search_top_k": 3, "hops": [1, 2]}
    assert printed["benchmark"] == "generated"
    assert not (tmp_path / "eval").exists()  # printing runs nothing
    assert cli_main(["eval", "--policy", "x", "--out", str(tmp_path), "kk=4",
                     "--print-config"]) == 2
    assert "unknown key kk; did you mean k?" in capsys.readouterr().err
