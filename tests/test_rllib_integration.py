"""RLlib's PPO on DeepResearch-v0 through trainers.integrations.rllib: the episodes RLlib's
env runner plays carry the project's rollout ids and masks, and one training iteration
updates the policy and syncs it to the env runner."""

from __future__ import annotations

import os

import numpy as np
import pytest

try:
    from ray.rllib.algorithms.ppo import PPOConfig  # noqa: F401
except ImportError as error:  # e.g. dm-tree missing: ray[default] without the rllib extra
    pytest.skip(f"ray.rllib cannot be imported ({error}); pip install -e .[rllib]",
                allow_module_level=True)

import torch  # noqa: E402

from trainers.integrations.rllib_env import (  # noqa: E402
    TokenTurnConfig,
    TokenTurnEnv,
    unpadded,
)

ENV = {"world_size": 100, "world_seed": 1, "max_turns": 2, "tool_timeout_s": 5.0}
TURN_TOKENS, CONTEXT = 12, 2048
pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    from envs.deep_research import DeepResearchEnv
    from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm

    env = DeepResearchEnv(**ENV)
    texts = [env.system_prompt] + [f"{p.title}\n{p.text}" for p in env.world.corpus]
    texts += [t.question for t in env.world.tasks]
    tokenizer = build_chatml_tokenizer(texts, vocab_size=600)
    model = build_tiny_causal_lm(tokenizer, hidden=32, layers=1, seed=0)
    path = tmp_path_factory.mktemp("policy")
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def ray_session():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _config(policy_dir, **overrides):
    from trainers.integrations.rllib import ppo_config

    settings = {"env": ENV, "max_turn_tokens": TURN_TOKENS, "max_context_tokens": CONTEXT,
                "num_envs": 2, "train_batch_turns": 4, "minibatch_turns": 4, "lr": 1e-3,
                **overrides}
    return ppo_config(str(policy_dir), **settings)


def _episode_view(episode, pad_id):
    """(ids, loss mask, per-turn summed log-probs, task id) of an RLlib episode."""
    observations, actions = episode.get_observations(), episode.get_actions()
    ids, mask = [], []
    for step, observation in enumerate(observations):
        seen = unpadded(observation, pad_id)
        ids += seen
        mask += [0] * len(seen)
        if step < len(actions):
            generated = unpadded(actions[step], pad_id)
            ids += generated
            mask += [1] * len(generated)
    logps = [float(x) for x in episode.get_extra_model_outputs("action_logp")]
    return ids, mask, logps, episode.get_infos()[0]["task_id"]


def _check_learner_logps(module, episode):
    """The training forward gives each turn the log-prob the env runner recorded (the PPO
    ratio starts at 1), from the state the env runner stored before that turn."""
    from ray.rllib.core.columns import Columns

    state = module.get_initial_state()
    for step in range(len(episode)):
        if step:
            state = {k: torch.as_tensor(v) for k, v in
                     episode.get_extra_model_outputs(Columns.STATE_OUT, step - 1).items()}
        batch = {Columns.OBS: torch.as_tensor(episode.get_observations(step))[None, None],
                 Columns.ACTIONS: torch.as_tensor(episode.get_actions(step))[None, None],
                 Columns.STATE_IN: {k: v[None] for k, v in state.items()}}
        with torch.no_grad():
            out = module.forward_train(batch)
        logp = module.get_train_action_dist_cls().from_logits(
            out[Columns.ACTION_DIST_INPUTS]).logp(batch[Columns.ACTIONS])
        recorded = float(episode.get_extra_model_outputs(Columns.ACTION_LOGP, step))
        assert float(logp) == pytest.approx(recorded, abs=1e-4)


def test_rllib_episodes_carry_the_project_rollouts_ids_and_masks(policy_dir, ray_session):
    from envs.group import DeepResearchGroupEnv
    from trainers.engines.hf import HFEngine
    from trainers.modeling.models import load_causal_lm, load_tokenizer
    from trainers.rollout import SamplingConfig, rollout_group, text_token_counter

    algo = _config(policy_dir, temperature=0.0).build_algo()
    try:
        episodes = algo.env_runner.sample(num_episodes=3, explore=True)
        runner_module = algo.env_runner.module  # inference-only: a training copy scores
        module = type(runner_module)(observation_space=runner_module.observation_space,
                                     action_space=runner_module.action_space,
                                     model_config=runner_module.model_config)
        _check_learner_logps(module, [e for e in episodes if e.is_done][0])
    finally:
        algo.stop()
    tokenizer, chat = load_tokenizer(policy_dir)
    engine = HFEngine(load_causal_lm(policy_dir), tokenizer)
    group = DeepResearchGroupEnv(group_size=1, token_counter=text_token_counter(chat), **ENV)
    done = [e for e in episodes if e.is_done]
    assert len(done) >= 2 and any(len(e) >= 2 for e in done)  # multi-turn episodes
    for episode in done:
        ids, mask, logps, task_id = _episode_view(episode, len(tokenizer))
        (trajectory,) = rollout_group(
            engine, group, chat, options={"task_id": task_id}, max_context_tokens=CONTEXT,
            sampling=SamplingConfig(max_turn_tokens=TURN_TOKENS, temperature=0.0))
        assert ids == trajectory.input_ids
        assert mask == trajectory.loss_mask
        assert len(logps) == len(trajectory.turn_spans) == len(episode)
        for logp, (start, end) in zip(logps, trajectory.turn_spans):
            assert logp == pytest.approx(sum(trajectory.rollout_logprobs[start:end]), abs=1e-4)
        rewards = list(episode.get_rewards())
        expected = [t.format_reward if t.format_reward is not None else 0.0
                    for t in trajectory.turns]
        expected[-1] += trajectory.outcome
        assert rewards == pytest.approx(expected)


def test_one_rllib_iteration_updates_the_policy_and_syncs_the_env_runner(policy_dir,
                                                                        ray_session):
    algo = _config(policy_dir, temperature=1.0, seed=0).build_algo()
    try:
        before = {k: v.copy() for k, v in algo.env_runner.module.get_state().items()}
        result = algo.train()
        learner = algo.learner_group.get_weights()["default_policy"]
        after = algo.env_runner.module.get_state()
    finally:
        algo.stop()
    changed = [k for k in before if k.startswith("lm.") and not np.array_equal(before[k],
                                                                              after[k])]
    assert changed, "no policy weight changed after one PPO iteration"
    for key, value in learner.items():  # the env runner plays the learner's weights
        np.testing.assert_array_equal(after[key], value)
    runners = result["env_runners"]
    assert runners["num_episodes"] >= 1
    assert 0.0 <= runners["format_valid_rate"] <= 1.0
    assert runners["episode_len_mean"] >= 1
    stats = result["learners"]["default_policy"]
    assert np.isfinite(stats["policy_loss"]) and np.isfinite(stats["vf_loss"])


def test_token_turn_env_refuses_an_observation_longer_than_its_space(policy_dir):
    env = TokenTurnEnv(TokenTurnConfig.from_env_config(
        {"policy_path": str(policy_dir), "env": ENV, "max_observation_tokens": 8}))
    with pytest.raises(ValueError, match="max_observation_tokens"):
        env.reset(seed=0)


def test_token_turn_config_names_unknown_keys():
    with pytest.raises(ValueError, match="unknown key.*'max_turns'"):
        TokenTurnConfig.from_env_config({"policy_path": "x", "max_turns": 3})
    with pytest.raises(ValueError, match="policy_path is required"):
        TokenTurnConfig.from_env_config({})
    with pytest.raises(ValueError, match="forced final turn fits"):
        TokenTurnConfig.from_env_config({"policy_path": "x", "max_context_tokens": 1000,
                                         "env": {"max_context_tokens": 1000}})


def test_turn_distribution_sums_token_logprobs_and_entropies():
    from trainers.integrations.rllib import TurnTokensDistribution

    inputs = torch.tensor([[[-0.5, 1.0], [-0.25, 2.0], [0.0, 0.0]]])
    dist = TurnTokensDistribution.from_logits(inputs)
    assert dist.logp(None).tolist() == [-0.75]
    assert dist.entropy().tolist() == [3.0]
    with pytest.raises(NotImplementedError, match="use_kl_loss=False"):
        dist.kl(dist)
