"""The RL driver with the vLLM engine (run by `make test-vllm`): the learner's weights are
pushed into the running vLLM engine after every update, so the engine's log-probs of the
next step's rollouts equal the learner's recomputed log-probs; rollouts stay token-exact."""

from __future__ import annotations

import dataclasses
import os

import pytest

vllm = pytest.importorskip("vllm")

from trainers.data.oracle_data import world_texts  # noqa: E402
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm  # noqa: E402
from trainers.rl.config import RLConfig  # noqa: E402
from trainers.rl.driver import train  # noqa: E402
from trainers.trajectory import check_invariants  # noqa: E402

WORLD = {"world_size": 300, "world_seed": 3}


def test_vllm_rollouts_follow_the_learner_weights(tmp_path):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    tokenizer = build_chatml_tokenizer(world_texts(WORLD), vocab_size=2048)
    model = build_tiny_causal_lm(tokenizer, hidden=128, layers=2, heads=2, head_dim=64, seed=0)
    model.save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    config = RLConfig()
    config.policy.path, config.policy.threads = str(tmp_path / "policy"), 1
    config.env = dataclasses.replace(config.env, hops=(1,), search_top_k=2, max_turns=3,
                                     max_context_tokens=1500, **WORLD)
    config.rollout = dataclasses.replace(config.rollout, engine="vllm", group_size=2,
                                         queries_per_step=2, max_turn_tokens=24,
                                         max_context_tokens=2048,
                                         vllm_options={"max_model_len": 2560})
    config.algorithm.options = {"loss": {"entropy_coef": 0.01}}
    config.learner = dataclasses.replace(config.learner, lr=1e-3, micro_batch_size=2)
    config.eval = dataclasses.replace(config.eval, num_tasks=1, max_turn_tokens=24)
    config.run = dataclasses.replace(config.run, steps=3, output_dir=str(tmp_path / "run"),
                                     progress_bar=False, tensorboard="off", save_every=0)
    result = train(config, keep_trajectories=True)
    assert len(result.history) == 3
    # Steps 1 and 2 ran on weights the learner changed: the engine must have received them.
    for row in result.history:
        assert row["rollout_logprob_diff_max"] < 1e-3, row["rollout_logprob_diff_max"]
    assert result.history[-1]["kl"] > 0  # the policy did move away from the reference
    for trajectories in result.trajectories:
        for trajectory in trajectories:
            check_invariants(trajectory)
