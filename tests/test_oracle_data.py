"""Oracle SFT data: deterministic, train split only, exact masks, a long-turn tail."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainers.data.oracle_data import (
    DEFAULT_MIXTURE,
    SHORT_MIXTURE,
    OracleDataConfig,
    format_histogram,
    generate_oracle_trajectories,
    make_train_env,
    tokenize_trajectories,
    turn_histogram,
    world_texts,
)
from trainers.modeling.models import build_chatml_tokenizer
from trainers.modeling.tokenization import ChatTokenizer
from trainers.trajectory import check_invariants

ENV = {"world_size": 300, "world_seed": 0, "hops": (1, 2, 3, 4), "search_top_k": 3}


@pytest.fixture(scope="module")
def long_tail_data():
    return generate_oracle_trajectories(OracleDataConfig(num_episodes=80, seed=1,
                                                         env_kwargs=ENV,
                                                         mixture=DEFAULT_MIXTURE))


def test_deterministic_given_seed():
    config = OracleDataConfig(num_episodes=6, seed=3, env_kwargs=ENV, mixture=SHORT_MIXTURE)
    first = generate_oracle_trajectories(config)
    second = generate_oracle_trajectories(config)
    assert [t.to_json() for t in first] == [t.to_json() for t in second]
    other = generate_oracle_trajectories(OracleDataConfig(num_episodes=6, seed=4,
                                                          env_kwargs=ENV,
                                                          mixture=SHORT_MIXTURE))
    assert [t.messages for t in other] != [t.messages for t in first]


def test_world_seeds_spread_episodes_over_other_worlds():
    """With world_seeds the episodes come from those worlds' train splits, split evenly and
    in order, and none from the evaluation world of env_kwargs."""
    config = OracleDataConfig(num_episodes=7, seed=0, env_kwargs=ENV, mixture=SHORT_MIXTURE,
                              world_seeds=(5, 6))
    trajectories = generate_oracle_trajectories(config)
    worlds = [t.task_id.split("-")[1] for t in trajectories]  # ids are venus-s<seed>-...
    assert worlds == ["s5"] * 3 + ["s6"] * 4
    for seed in (5, 6):
        train_ids = {task.id for task in make_train_env({**ENV, "world_seed": seed})
                     .unwrapped.tasks}
        assert all(t.task_id in train_ids for t in trajectories
                   if t.task_id.startswith(f"venus-s{seed}-"))
    assert [t.to_json() for t in generate_oracle_trajectories(config)] == \
        [t.to_json() for t in trajectories]


def test_only_train_tasks_and_correct(long_tail_data):
    train_ids = {task.id for task in make_train_env(ENV).unwrapped.tasks}
    train_env = make_train_env(ENV).unwrapped
    assert train_env.config.task_split == "train"
    assert all(t.task_id in train_ids for t in long_tail_data)
    assert all(t.outcome == 1.0 for t in long_tail_data)
    # every episode uses the environment's own system prompt, then the question
    for trajectory in long_tail_data:
        assert trajectory.messages[0] == {"role": "system", "content": train_env.system_prompt}
        assert trajectory.messages[1]["content"] == trajectory.question
        check_invariants(trajectory)


def test_long_turn_tail(long_tail_data):
    counts = turn_histogram(long_tail_data)
    total = sum(counts.values())
    assert total == len(long_tail_data)
    over_50 = counts["51-100"] + counts["101-150"] + counts[">150"]
    over_100 = counts["101-150"] + counts[">150"]
    assert over_50 >= 0.1 * total and over_100 >= 0.03 * total, format_histogram(counts)
    assert counts["1-5"] + counts["6-10"] >= 0.4 * total  # most stay short
    reasons = {t.messages[4]["content"][:40] for t in long_tail_data if len(t.messages) > 4}
    assert len(reasons) > 5  # varied reasoning text


def test_tokenized_with_exact_masks():
    trajectories = generate_oracle_trajectories(OracleDataConfig(
        num_episodes=4, seed=0, env_kwargs=ENV, mixture=SHORT_MIXTURE))
    tokenizer = build_chatml_tokenizer(world_texts(ENV)[:200], vocab_size=600)
    chat = ChatTokenizer(tokenizer)
    for trajectory in tokenize_trajectories(trajectories, chat):
        check_invariants(trajectory, tokenizer=chat)
        # policy tokens decode to exactly the assistant turns (+ end-of-turn)
        for (start, end), turn in zip(trajectory.turn_spans, trajectory.turns):
            text = tokenizer.decode(trajectory.input_ids[start:end - 1])
            assert text == turn.assistant
            assert trajectory.input_ids[end - 1] == chat.end_of_turn_id


def test_sft_config_names_its_oracle_data_and_refuses_an_unknown_mixture():
    """The SFT pipeline and the main job build their oracle data from one function, so the
    data's worlds are the tokenizer's worlds (data.world_seeds)."""
    from trainers.sft.config import SFTExperimentConfig, from_dict
    from trainers.sft.pipeline import oracle_data_config

    config = from_dict(SFTExperimentConfig, {"data": {"world_seeds": [4, 5], "mixture": "short",
                                                      "num_episodes": 9}})
    data = oracle_data_config(config)
    assert (tuple(data.world_seeds), data.num_episodes, data.mixture) == ((4, 5), 9, SHORT_MIXTURE)
    config.data.mixture = "shrot"
    with pytest.raises(ValueError, match="shrot"):
        oracle_data_config(config)


def test_plan_steps_setting_reaches_the_written_episodes():
    from trainers.sft.config import SFTExperimentConfig, from_dict
    from trainers.sft.pipeline import oracle_data_config

    config = from_dict(SFTExperimentConfig, {"data": {"mixture": "short", "num_episodes": 4,
                                                      "plan_steps": False}})
    data = oracle_data_config(config)
    assert data.plan_steps is False
    texts = {}
    for plan_steps in (True, False):
        episodes = generate_oracle_trajectories(dataclasses.replace(
            data, env_kwargs=ENV, plan_steps=plan_steps))
        assert episodes and all(t.metadata["plan_steps"] is plan_steps for t in episodes)
        texts[plan_steps] = [m["content"] for t in episodes for m in t.messages
                             if m["role"] == "assistant"]
    assert any("Step 1:" in text for text in texts[True])
    assert not any("Step " in text for text in texts[False])


def test_prompt_style_reaches_the_written_episodes_and_the_rl_env():
    """An SFT config's env.prompt_style is the system prompt its oracle episodes are written
    with, and the RL settings pass it to the environment (train and run with one style)."""
    from trainers.rl.config import EnvSettings
    from trainers.sft.config import SFTExperimentConfig, from_dict
    from trainers.sft.pipeline import oracle_data_config
    from venus_gym.protocol import render_system_prompt

    config = from_dict(SFTExperimentConfig, {"data": {"mixture": "short", "num_episodes": 2},
                                             "env": {"world_size": 300, "world_seed": 3,
                                                     "prompt_style": "compact"}})
    episodes = generate_oracle_trajectories(oracle_data_config(config))
    compact = render_system_prompt(style="compact")
    assert episodes and all(t.messages[0]["content"] == compact for t in episodes)
    assert EnvSettings(prompt_style="compact").kwargs()["prompt_style"] == "compact"
    assert EnvSettings().kwargs()["prompt_style"] == "full"


def test_recovery_examples_show_a_malformed_attempt_its_error_and_the_fix():
    config = OracleDataConfig(num_episodes=12, seed=2, env_kwargs=ENV, mixture=SHORT_MIXTURE,
                              recovery_prob=0.3)
    trajectories = generate_oracle_trajectories(config)
    tokenizer = build_chatml_tokenizer(world_texts(ENV)[:200], vocab_size=600)
    chat = ChatTokenizer(tokenizer)
    attempts = 0
    for trajectory in tokenize_trajectories(trajectories, chat):
        check_invariants(trajectory, tokenizer=chat)
        assert trajectory.outcome == 1.0
        messages = trajectory.messages
        for k, (turn, (start, end)) in enumerate(zip(trajectory.turns, trajectory.turn_spans)):
            at = [i for i, m in enumerate(messages) if m["role"] == "assistant"][k]
            if turn.valid:
                assert "weight" not in messages[at] and set(trajectory.loss_mask[start:end]) == {1}
                continue
            attempts += 1
            # context only: weight 0, mask 0; the env's own error reply; then the real turn
            assert messages[at]["weight"] == 0 and set(trajectory.loss_mask[start:end]) == {0}
            assert "malformed" in messages[at + 1]["content"]
            assert trajectory.turns[k + 1].valid
    assert attempts >= 4
    # the same seed without recovery: the same episodes with the attempts left out
    plain = generate_oracle_trajectories(OracleDataConfig(
        num_episodes=12, seed=2, env_kwargs=ENV, mixture=SHORT_MIXTURE))
    for with_attempts, without in zip(trajectories, plain):
        kept = [m for i, m in enumerate(with_attempts.messages)
                if m.get("weight") != 0 and with_attempts.messages[i - 1].get("weight") != 0]
        assert kept == without.messages
    with pytest.raises(ValueError, match="recovery_prob"):
        OracleDataConfig(recovery_prob=1.0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kinds", [None, ("phrase_loop",), ("cut", "loop", "json",
                                                            "phrase_loop")])
def test_every_malformation_is_rejected_by_the_protocol(seed, kinds):
    import random

    from trainers.data.oracle_data import malformed_version
    from venus_gym.protocol import parse_turn
    trajectory = generate_oracle_trajectories(OracleDataConfig(
        num_episodes=1, seed=seed, env_kwargs=ENV, mixture=SHORT_MIXTURE))[0]
    rng = random.Random(seed)
    for turn in trajectory.turns:
        broken = malformed_version(turn.assistant, rng, *([kinds] if kinds else []))
        assert broken is not None and broken != turn.assistant
        assert not parse_turn(broken).valid


def test_phrase_loops_repeat_a_phrase_like_a_turn_run_into_the_token_cap():
    import random

    from trainers.data.oracle_data import malformed_version
    turn = "<think>\nSo the mayor of Pallosgrad is the one to find.\n</think>\n<answer>X</answer>"
    rng = random.Random(0)
    for _ in range(20):
        broken = malformed_version(turn, rng, ("phrase_loop",))
        # the turn, cut somewhere before its last closing tag, then the loop
        assert turn.startswith(broken.split(" ")[0]) and broken.split(" ")[0] != turn
        words = broken.split()
        # some phrase of 1-4 words fills the tail: it comes back at least 20 times in a row
        assert any(words[-k:] * 20 == words[-20 * k:] for k in range(1, 5))
    trajectories = generate_oracle_trajectories(OracleDataConfig(
        num_episodes=6, seed=4, env_kwargs=ENV, mixture=SHORT_MIXTURE, recovery_prob=0.3,
        recovery_kinds=("phrase_loop",)))
    attempts = [turn for t in trajectories for turn in t.turns if not turn.valid]
    assert attempts and all(len(turn.assistant.split()) >= 20 for turn in attempts)
    assert trajectories[0].metadata["recovery_kinds"] == ["phrase_loop"]
    with pytest.raises(ValueError, match="recovery_kinds must be a non-empty subset"):
        OracleDataConfig(recovery_kinds=("typo",))
    # the SFT config's default (kept as a literal there, so configs load without the env)
    # is the data generator's, in the same order, which is part of the seed
    from trainers.data.oracle_data import DEFAULT_RECOVERY_KINDS
    from trainers.sft.config import DataConfig
    assert DataConfig().recovery_kinds == DEFAULT_RECOVERY_KINDS


def test_worker_processes_give_the_same_data_in_the_same_order(monkeypatch):
    """Generation and tokenization in 2 processes return exactly what one process returns
    (the RNG draws are made up front), in order, over two worlds (several chunks each)."""
    from trainers.data import oracle_data

    pools = []
    real_pool = oracle_data._process_pool
    monkeypatch.setattr(oracle_data, "_process_pool",
                        lambda workers: pools.append(workers) or real_pool(workers))
    config = OracleDataConfig(num_episodes=20, seed=5, env_kwargs=ENV, mixture=SHORT_MIXTURE,
                              world_seeds=(7, 8), recovery_prob=0.2)
    serial = generate_oracle_trajectories(config)
    assert pools == []
    parallel = generate_oracle_trajectories(config, workers=2)
    assert pools == [2]  # really ran in worker processes
    assert len(serial) >= 15 and len({t.task_id.split("-")[1] for t in serial}) == 2
    assert [t.to_json() for t in parallel] == [t.to_json() for t in serial]
    chat = ChatTokenizer(build_chatml_tokenizer(world_texts(ENV), vocab_size=400))
    tokenized = tokenize_trajectories(serial, chat, workers=2)
    assert pools == [2, 2]
    assert [t.to_json() for t in tokenized] == \
        [t.to_json() for t in tokenize_trajectories(serial, chat)]
    assert all(t.input_ids and sum(t.loss_mask) > 0 for t in tokenized)


@pytest.mark.parametrize("workers", [-1, 1.5, True])
def test_bad_worker_counts_are_refused_by_name(workers):
    config = OracleDataConfig(num_episodes=2, env_kwargs=ENV)
    with pytest.raises(ValueError, match="workers must be an int >= 0"):
        generate_oracle_trajectories(config, workers=workers)
    with pytest.raises(ValueError, match="workers must be an int >= 0"):
        tokenize_trajectories([], ChatTokenizer(build_chatml_tokenizer(["a b"], 300)),
                              workers=workers)


def test_episodes_do_not_depend_on_the_python_hash_seed(tmp_path):
    """Two processes with different PYTHONHASHSEED write the same episodes. (A visit
    summary once summed its sentence scores in set order, so ties broke differently per
    process: episode 76 of these settings read another evidence sentence.)"""
    script = (
        "import hashlib, json, sys\n"
        "from trainers.data.oracle_data import OracleDataConfig, SHORT_MIXTURE, "
        "generate_oracle_trajectories\n"
        "config = OracleDataConfig(num_episodes=90, seed=0, mixture=SHORT_MIXTURE, "
        "plan_steps=False, env_kwargs={'world_size': 2000, 'world_seed': 0, "
        "'hops': (1, 2), 'search_top_k': 3})\n"
        "print(json.dumps([hashlib.sha256(json.dumps(t.messages).encode()).hexdigest() "
        "for t in generate_oracle_trajectories(config)]))\n")
    root = Path(__file__).resolve().parents[1]
    runs = [json.loads(subprocess.run(
        [sys.executable, "-c", script], cwd=root, check=True, capture_output=True, text=True,
        env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}).stdout)
        for seed in ("1", "2")]
    assert len(runs[0]) >= 80
    assert runs[0] == runs[1], [i for i, (a, b) in enumerate(zip(*runs)) if a != b]


def test_an_error_in_a_worker_process_reaches_the_caller():
    config = OracleDataConfig(num_episodes=4, env_kwargs={**ENV, "hops": (9,)})
    with pytest.raises(ValueError, match="no tasks"):
        generate_oracle_trajectories(config, workers=2)
