"""benchmarks/token_drift.py scores exactly the policy tokens, at the rollout temperature."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "token_drift.py"


def _module():
    spec = importlib.util.spec_from_file_location("token_drift", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_token_logprobs_are_the_masked_tokens_log_probabilities_at_the_temperature():
    tokenizer = build_chatml_tokenizer(["a city on a river with a mayor"] * 10, vocab_size=300)
    model = build_tiny_causal_lm(tokenizer, hidden=32, layers=1, seed=0).eval()
    ids = [5, 9, 17, 3, 40, 41, 8, 12]
    mask = [0, 0, 0, 1, 1, 0, 1, 1]  # the prompt, a turn, a tool response token, a turn
    scored = _module().token_logprobs(model, ids, mask, temperature=0.5)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0] / 0.5
    expected = [torch.log_softmax(logits[i - 1], -1)[ids[i]] for i in range(1, len(ids))
                if mask[i]]
    assert scored.shape == (4,)
    assert torch.allclose(scored, torch.stack(expected), atol=1e-5)
    hotter = _module().token_logprobs(model, ids, mask, temperature=1.0)
    assert not torch.allclose(scored, hotter)  # the temperature is applied


def test_held_out_episodes_without_ids_are_tokenized_with_the_start_template_in_order():
    from trainers.data.oracle_data import (
        SHORT_MIXTURE,
        OracleDataConfig,
        generate_oracle_trajectories,
        tokenize_trajectories,
    )
    from trainers.modeling.models import load_tokenizer

    env = {"world_size": 300, "world_seed": 0, "hops": (1, 2), "search_top_k": 3,
           "prompt_style": "compact"}
    played = generate_oracle_trajectories(OracleDataConfig(num_episodes=3, seed=5, env_kwargs=env,
                                                           mixture=SHORT_MIXTURE))
    assert not any(t.input_ids for t in played)  # as a held-out play file saves them
    chat = load_tokenizer("warm-start")[1]
    already = tokenize_trajectories(played[1:2], chat)[0]
    mixed = [played[0], already, played[2]]
    result = _module().with_token_ids(mixed, chat)
    assert result[1] is already  # a trajectory with ids is kept as it was
    expected = tokenize_trajectories([played[0], played[2]], chat)
    for got, want, source in zip([result[0], result[2]], expected, [played[0], played[2]]):
        assert got.input_ids == want.input_ids and got.loss_mask == want.loss_mask
        assert got.messages == source.messages and got.outcome == source.outcome
        assert 0 < sum(got.loss_mask) < len(got.input_ids)
    assert _module().with_token_ids(result, chat) == result  # nothing left to do


def test_mean_se_median_of_per_trajectory_changes():
    stats = _module().mean_se_median
    mean, se, median = stats([4.0, 1.0, 3.0, 2.0])
    assert (mean, median) == (2.5, 2.5)
    assert abs(se - (((1.5 ** 2 + 0.5 ** 2) * 2 / 3) / 4) ** 0.5) < 1e-12
    assert stats([5.0, -1.0, 0.0])[2] == 0.0
    one = stats([2.0])
    assert one[0] == 2.0 and one[2] == 2.0 and one[1] != one[1]  # no SE from one value
    assert all(v != v for v in stats([]))
