"""Hostile input to the surfaces added last (issue 42, items 1, 2 and 4), each replayed as a
test, grouped by the mechanism that now refuses it.

1. Model paths stay inside the Hugging Face cache (trainers.modeling.hub_cache): a ref that
   is a path, a snapshot or a config.json / .gguf linked outside the cache is refused with
   one line naming it; huggingface_hub's own layout (snapshot files linked into the repo's
   blobs/) still loads; a 5,000-character id is one line, not an OSError.
2. Every config error is one line and types mean what they say (trainers.config_yaml, the
   one YAML reader of files, overrides and --env; trainers.config_utils' typing): a bool is
   no int, NaN / inf no float, a mapping field takes a mapping and a list field a list; an
   invalid, tab-indented, tagged or directory config file is one line; an unknown env key
   stops `venus-gym eval` before it writes anything; a file of nested aliases is refused as
   fast as the same value given as an override; `env.date=2025-01-01` means the same in the
   file and as an override.
4. The sanitiser is a fixed point (venus_gym.sanitize): sanitising twice is sanitising once,
   and no output holds a chat control token or a tool_response tag.

The tests use the public entry points (the command, the loaders, venus_gym.protocol), so each
can be run against older code to see it fail there.
"""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_hub_models import COMMIT
from tests.test_hub_models import lay_out_hub_cache as lay_out
from trainers.cli import main as cli_main
from venus_gym.protocol import sanitize_observation


# --- 1. model paths stay inside the cache ---------------------------------------------------
@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """An empty hub cache, and a model directory outside it (what an attacker points at)."""
    root = tmp_path / "hub"
    root.mkdir()
    outside = Path(os.path.realpath(tmp_path)) / "outside"
    outside.mkdir()
    (outside / "config.json").write_text('{"model_type": "llama"}')
    (outside / "model.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return {"root": root, "outside": outside}


def assert_refused(spec: str, *fragments: str) -> str:
    """The one-line error resolving and loading `spec` give; asserts each fragment is in it."""
    from trainers.modeling.models import load_policy, resolve_model_path

    with pytest.raises(ValueError) as caught:
        resolve_model_path(spec)
    message = str(caught.value)
    assert "\n" not in message and "outside" in message
    for fragment in fragments:
        assert fragment in message, message
    with pytest.raises(ValueError):
        load_policy(spec)
    return message


@pytest.mark.parametrize("ref", ["../../../outside", "ABSOLUTE", "..", "x/../../../../outside"])
def test_1_a_ref_that_is_a_path_is_refused(cache, ref):
    lay_out(cache["root"], "org/ev", {"config.json": b"{}"})
    ref = str(cache["outside"]) if ref == "ABSOLUTE" else ref
    (cache["root"] / "models--org--ev" / "refs" / "main").write_text(ref)
    assert_refused("org/ev", "hub id 'org/ev'", "refs/main", repr(ref), "not a commit hash")


def test_1_a_snapshot_linked_outside_the_cache_is_refused(cache):
    snapshot = lay_out(cache["root"], "org/ev", {"config.json": b"{}"})
    for entry in snapshot.iterdir():
        entry.unlink()
    snapshot.rmdir()
    snapshot.symlink_to(cache["outside"], target_is_directory=True)
    assert_refused("org/ev", "hub id 'org/ev'", str(cache["outside"]))


@pytest.mark.parametrize("name", ["config.json", "model.gguf"])
def test_1_a_file_linked_outside_the_cache_is_refused(cache, name):
    snapshot = lay_out(cache["root"], "org/ev", {"README.md": b"card"})
    (snapshot / name).symlink_to(cache["outside"] / name)
    assert_refused("org/ev", "hub id 'org/ev'", name, str(cache["outside"] / name))


def test_1_a_folder_linked_outside_the_cache_is_refused(cache):
    snapshot = lay_out(cache["root"], "org/ev", {"config.json": b"{}"})
    (snapshot / "onnx").symlink_to(cache["outside"], target_is_directory=True)
    assert_refused("org/ev", "onnx", str(cache["outside"]))


def test_1_huggingface_hubs_own_layout_still_resolves(cache, tmp_path, monkeypatch):
    from trainers.modeling.models import resolve_model_path

    snapshot = lay_out(cache["root"], "org/ev", {"config.json": b"{}", "tokenizer.json": b"{}"})
    (snapshot / "sub").mkdir()  # a folder of the repo, its file linked into blobs/ as well
    blob = next((cache["root"] / "models--org--ev" / "blobs").iterdir())
    (snapshot / "sub" / "extra.json").symlink_to(os.path.relpath(blob, snapshot / "sub"))
    assert resolve_model_path("org/ev") == snapshot
    gguf = lay_out(cache["root"], "org/gguf", {"m.Q4.gguf": b"GGUF"})
    assert resolve_model_path("org/gguf") == gguf / "m.Q4.gguf"
    # a ref with huggingface_hub's content and a trailing newline is no path either
    (cache["root"] / "models--org--ev" / "refs" / "main").write_text(COMMIT + "\n")
    assert resolve_model_path("org/ev") == Path("org/ev")  # not found, as before
    # the cache reached through a link (HF_HUB_CACHE on another disk) is still the cache
    linked = tmp_path / "linked-hub"
    linked.symlink_to(cache["root"], target_is_directory=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(linked))
    assert resolve_model_path("org/gguf").resolve() == (gguf / "m.Q4.gguf").resolve()


def test_1_a_5000_character_id_is_one_line(cache):
    from trainers.modeling.models import load_policy, resolve_model_path

    spec = "org/" + "x" * 5000
    assert resolve_model_path(spec) == Path(spec)
    with pytest.raises(FileNotFoundError) as caught:
        load_policy(spec)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 1000
    assert "(5,004 characters) is neither a GGUF file nor a directory" in message


# --- 2. every config error is one line, types mean what they say ----------------------------
RL_BASE = {"policy": {"path": "runs/sft/final"}, "run": {"steps": 5}}


@pytest.fixture()
def configs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(RL_BASE))
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump({"train": {"output_dir": "sft-out"}}))
    return tmp_path


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the command; it must exit 2 and its error be one line (an sft error is argparse's
    usage, then the one line). Returns that line."""
    try:
        code = cli_main(argv)
    except SystemExit as stop:  # sft reports through argparse
        code = stop.code
    assert code == 2, argv
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and "Traceback" not in "\n".join(lines)
    return lines[-1]


RL = ["rl", "--config", "rl.yaml", "--print-config"]
SFT = ["sft", "--config", "sft.yaml", "--print-config"]
EVAL = ["eval", "--policy", "x", "--out", "eval-out", "--print-config"]
WRONG_TYPES = [
    (RL + ["rollout.group_size=true"], "rollout.group_size must be int, got True"),
    (RL + ["learner.lr=.nan"], "learner.lr must be a finite number, got nan"),
    (RL + ["learner.lr=.inf"], "learner.lr must be a finite number, got inf"),
    (RL + ["sync.bucket_mb=.inf"], "sync.bucket_mb must be a finite number, got inf"),
    (RL + ["rollout.vllm_options=[1,2]"], "rollout.vllm_options must be a mapping"),
    (RL + ["rollout.vllm_options=5"], "rollout.vllm_options must be a mapping"),
    (RL + ["env.extra_tools=5"], "env.extra_tools must be a list, got 5"),
    (SFT + ["data.num_episodes=true"], "data.num_episodes must be int, got True"),
    (SFT + ["train.lr=.nan"], "train.lr must be a finite number, got nan"),
    (EVAL + ["k=true"], "k must be int, got True"),
    (EVAL + ["env=[1,2]"], "env must be a mapping"),
    (EVAL + ["env=5"], "env must be a mapping"),
    (EVAL + ["--env", "max_turns=[1"], "--env 'max_turns=[1' is not valid config YAML (line 1"),
    (EVAL + ["env.bogus=1"], "unknown env key(s) ['bogus']: DeepResearch-v0 has no such"),
    (EVAL + ["--env", "bogus=1"], "unknown env key(s) ['bogus']"),
    (EVAL + ["--env", "search_top_kk=2"], "did you mean search_api_key_env, search_top_k"),
    (EVAL + ["--env", "search_top_k=many"], "env.search_top_k must be int, got 'many'"),
    # a long override where a config file name may stand: no OSError from the file check
    (["sft", "--config", "sft.yaml", "train.lr=" + "x" * 300, "--print-config"],
     "train.lr must be float, got 'xxx"),
    (RL + ["learner.lr=1" + "0" * 400], "learner.lr must be a finite number, got an integer"),
    (RL + ["learner.lr=1" + "0" * 5000], "override 'learner.lr=10000"),
]


@pytest.mark.parametrize("argv, message", WRONG_TYPES,
                         ids=[f"{a[0]} {[x for x in a if '=' in x][0][:30]}"
                              for a, _ in WRONG_TYPES])
def test_2_a_wrong_value_is_one_line_naming_it(configs, capsys, argv, message):
    assert message in one_line_error(capsys, argv)


def test_2_the_same_wrong_value_in_the_file_is_refused_the_same_way(configs, capsys):
    (configs / "wrong.yaml").write_text("policy: {path: x}\nrollout: {group_size: true}\n"
                                        "learner: {lr: .nan}\n")
    line = one_line_error(capsys, ["rl", "--config", "wrong.yaml", "--print-config"])
    assert "rollout.group_size must be int, got True" in line or "learner.lr must be" in line


BAD_FILES = [
    ("invalid.yaml", "run: [1, 2\n", "is not valid config YAML (line 2, column 1): expected ','"),
    ("tab.yaml", "run:\n\tsteps: 2\n", "(line 2, column 1): found character '\\t' that cannot "
                                       "start any token (a tab: indent with spaces)"),
    ("tag.yaml", "run: !!python/object/apply:os.system ['echo hi']\n",
     "could not determine a constructor for the tag '!!python/object/apply:os.system'"),
    ("folder", None, "config file 'folder' is a directory, not a YAML file"),
    ("absent.yaml", "", "config file 'absent.yaml' does not exist"),
]


@pytest.mark.parametrize("name, text, message", BAD_FILES, ids=[f[0] for f in BAD_FILES])
def test_2_a_bad_config_file_is_one_line(configs, capsys, name, text, message):
    if text is None:
        (configs / name).mkdir()
    elif text:
        (configs / name).write_text(text)
    assert message in one_line_error(capsys, ["rl", "--config", name, "--print-config"])
    assert message in one_line_error(capsys, ["sft", "--config", name, "--print-config"])


def test_2_eval_with_an_unknown_env_key_refuses_before_any_work(configs, capsys):
    out = configs / "eval-out"
    for option in (["env.bogus=1"], ["--env", "bogus=1"]):
        line = one_line_error(capsys, ["eval", "--policy", "x", "--out", str(out), *option])
        assert "unknown env key(s) ['bogus']" in line
        assert not out.exists()  # no eval_config.json, no tasks loaded, no policy


def nested_aliases(levels: int) -> str:
    lines = ["a0: &a0 [x,x,x,x,x,x,x,x,x,x]"]
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return "\n".join(lines)


def test_2_a_file_of_nested_aliases_is_refused_like_the_override(configs, capsys):
    bomb = ("policy: {path: x}\nalgorithm:\n  options:\n"
            + "".join(f"    {line}\n" for line in nested_aliases(9).splitlines()))
    assert len(bomb.encode()) < 600  # a small file
    (configs / "bomb.yaml").write_text(bomb)
    started = time.perf_counter()
    line = one_line_error(capsys, ["rl", "--config", "bomb.yaml", "--print-config"])
    assert time.perf_counter() - started < 10
    assert "aliases expand" in line and "to more than 10,000" in line
    value = "{" + ", ".join(nested_aliases(5).splitlines()) + "}"
    line = one_line_error(capsys, RL + ["algorithm.options=" + value])
    assert "override 'algorithm.options=" in line and "to more than 10,000" in line
    # a few aliases, as people write them, still work
    (configs / "aliases.yaml").write_text("policy: {path: x}\nrollout:\n  vllm_options:\n"
                                          "    a: &a {dtype: bfloat16}\n    b: *a\n")
    assert cli_main(["rl", "--config", "aliases.yaml", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["rollout"]["vllm_options"] == {"a": {"dtype": "bfloat16"},
                                                  "b": {"dtype": "bfloat16"}}


def test_2_a_value_means_the_same_in_the_file_and_as_an_override(configs, capsys):
    (configs / "dated.yaml").write_text("policy: {path: x}\nrun: {steps: 5}\nenv:\n"
                                        "  date: 2025-01-01\nlearner:\n  lr: 5e-5\n")
    assert cli_main(["rl", "--config", "dated.yaml", "--print-config"]) == 0
    in_file = yaml.safe_load(capsys.readouterr().out)
    assert cli_main(RL + ["policy.path=x", "env.date=2025-01-01", "learner.lr=5e-5"]) == 0
    overridden = yaml.safe_load(capsys.readouterr().out)
    assert in_file == overridden
    assert in_file["env"]["date"] == "2025-01-01" and in_file["learner"]["lr"] == 5e-5


# --- 4. the sanitiser is a fixed point -----------------------------------------------------
# The project's patterns: a chat control token (as tests/test_transcript_clean.py has it) and
# the tags that frame a tool result.
CONTROL_TOKEN = re.compile(r"<\|[^|<>\s]{1,64}\|>")
RESPONSE_TAG = re.compile(r"</?tool_response>")
PIECES = ["<", ">", "|", "/", "<|", "|>", "</", "<|im_end|>", "<|im_start|>", "endoftext",
          "<tool_response>", "</tool_response>", "tool_response", "&lt;", "&gt;", " ", "\n",
          "\r", "\x00", "a", "system"]


def assert_fixed_point(text: str) -> None:
    once = sanitize_observation(text)
    assert sanitize_observation(once) == once, (text, once)
    assert not CONTROL_TOKEN.search(once) and not RESPONSE_TAG.search(once), (text, once)


def test_4_a_tag_inside_a_control_token_is_caught():
    once = sanitize_observation("<|</tool_response>endoftext|>")
    assert once == "< |&lt;/tool_response&gt;endoftext| >"
    assert_fixed_point("<|</tool_response>endoftext|>")
    assert_fixed_point("<|<tool_response>|>")


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES) | st.sampled_from(PIECES) | st.text(max_size=3),
                max_size=10).map("".join))
def test_4_sanitising_is_a_fixed_point(text):
    assert_fixed_point(text)


def test_4_mutated_chat_turns_never_leak_a_control_token():
    """Seeded mutations of real turns (the shape the leak was found in: 1-2 per 20,000)."""
    rng = random.Random(42)
    turns = ["<|im_start|>user\n<tool_response>\nParis is the capital.\n</tool_response>"
             "<|im_end|>", "<|im_start|>assistant\n<think>\nok\n</think>\n<answer>\nParis\n"
             "</answer><|endoftext|>"]
    for _ in range(20_000):
        text = list(rng.choice(turns))
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(len(text) + 1)
            if rng.random() < 0.5 and text:
                del text[min(position, len(text) - 1)]
            else:
                text.insert(position, rng.choice(PIECES))
        assert_fixed_point("".join(text))
