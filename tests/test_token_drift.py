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
