"""It learns: a tiny model trained for ~1 minute on oracle data writes format-valid first
turns on held-out tasks, which the same model untrained never does (the test-suite
version; the full recipe is `venus-gym sft`, trainers/sft/recipe.py)."""

from __future__ import annotations

import time

import pytest
import torch

from trainers.engines.hf import HFEngine
from trainers.evaluation.evaluate import evaluate
from trainers.rollout import SamplingConfig
from trainers.sft.config import SFTExperimentConfig, from_dict
from trainers.sft.pipeline import build_chat, build_model, build_samples, build_tokenizer
from trainers.sft.trainer import SFTTrainer

CONFIG = {
    "model": {"vocab_size": 1024, "hidden": 128, "layers": 2, "heads": 4},
    "data": {"num_episodes": 48, "mixture": "plain", "max_seq_len": 1280},
    "train": {"lr": 3e-3, "warmup_ratio": 0.05, "epochs": 8, "progress_bar": False,
              "log_every": 1000},
    "env": {"world_size": 300, "hops": [1, 2], "search_top_k": 3},
}
EVAL_TASKS = 8
FIRST_TURN_VALID_THRESHOLD = 0.5


def first_turn_valid_rate(model, chat, env_kwargs) -> float:
    engine = HFEngine(model, chat.tokenizer)
    # max_turns=1: the first turn, then the forced-final-answer turn (not counted here).
    evaluation = evaluate(engine, chat, {**env_kwargs, "max_turns": 1}, num_tasks=EVAL_TASKS,
                          sampling=SamplingConfig(max_turn_tokens=160, temperature=0.0))
    return sum(t.turns[0].valid for t in evaluation.trajectories) / len(evaluation.trajectories)


@pytest.mark.slow
def test_tiny_model_learns_the_turn_format(tmp_path):
    started = time.perf_counter()
    torch.manual_seed(0)
    config = from_dict(SFTExperimentConfig, {**CONFIG, "train": {
        **CONFIG["train"], "output_dir": str(tmp_path)}})
    tokenizer = build_tokenizer(config.model, config.env_kwargs(), config.data.world_seeds)
    chat = build_chat(tokenizer)
    samples = build_samples(config, chat)
    model = build_model(config.model, tokenizer)
    untrained = first_turn_valid_rate(model, chat, config.env_kwargs())
    trainer = SFTTrainer(model, samples, config.train, config.data, tokenizer.pad_token_id,
                         log=lambda _: None)
    history = trainer.train()
    trained = first_turn_valid_rate(model, chat, config.env_kwargs())
    elapsed = time.perf_counter() - started
    print(f"first-turn format validity: untrained {untrained:.2f}, trained {trained:.2f}; "
          f"loss {history[0]['loss']:.2f} -> {history[-1]['loss']:.2f}; {elapsed:.0f} s")
    assert untrained < FIRST_TURN_VALID_THRESHOLD
    assert trained >= FIRST_TURN_VALID_THRESHOLD


@pytest.mark.slow
def test_induction_warmup_teaches_a_tiny_model_to_copy_from_anywhere_in_its_context():
    """After the warm-up the model copies chunks of an unseen random sequence that come back
    in a shuffled order (so no fixed offset works: it must find the earlier occurrence of
    the current token) far better than chance and than before the warm-up."""
    from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm
    from trainers.sft.warmup import copy_task_batch, copy_task_loss, induction_warmup

    tokenizer = build_chatml_tokenizer(["alpha beta gamma delta"] * 20, vocab_size=300)
    model = build_tiny_causal_lm(tokenizer, hidden=64, layers=2, heads=2, seed=0)
    vocab = len(tokenizer)
    ids, targets = copy_task_batch(vocab, 8, 32, chunk=4, seed=123, low_id=5)
    # The second half repeats the first in another order, chunk by chunk.
    assert sorted(ids[0, 32:].tolist()) == sorted(ids[0, :32].tolist())
    assert ids[0, 32:].tolist() != ids[0, :32].tolist()

    def copy_loss() -> float:
        with torch.no_grad():
            return float(copy_task_loss(model, ids, targets))

    before = copy_loss()
    chance = torch.log(torch.tensor(float(vocab - 5))).item()
    result = induction_warmup(model, vocab, steps=1000, half_length=32, chunk=4,
                              batch_size=16, lr=3e-3, low_id=5, seed=0, log=None,
                              target_loss=0.3 * chance)
    after = copy_loss()
    assert before > 0.8 * chance  # random init: no better than guessing
    assert result.last_loss < result.first_loss / 3
    assert after < 0.35 * chance, (before, after, chance)
    # The target ended the warm-up early, once the loss had fallen below it.
    assert result.reached_target is True and result.steps < 1000, result


def test_induction_warmup_that_misses_its_target_stops_the_run_with_advice():
    from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm
    from trainers.sft.warmup import InductionWarmupError, induction_warmup

    tokenizer = build_chatml_tokenizer(["alpha beta gamma delta"] * 20, vocab_size=300)
    model = build_tiny_causal_lm(tokenizer, hidden=32, layers=1, heads=2, seed=0)
    with pytest.raises(InductionWarmupError, match="did not teach the model to copy: mean "
                       "copy loss .* over its last 10 steps after 12 steps.*"
                       "induction_warmup_steps"):
        induction_warmup(model, len(tokenizer), steps=12, batch_size=4, low_id=5, log=None,
                         target_loss=0.01)
    with pytest.raises(ValueError, match="needs steps >= 10"):
        induction_warmup(model, len(tokenizer), steps=5, log=None, target_loss=1.0)
    no_target = induction_warmup(model, len(tokenizer), steps=3, batch_size=4, low_id=5,
                                 log=None)
    assert no_target.steps == 3 and no_target.reached_target is None
    with pytest.raises(ValueError, match="target_loss >= 0"):
        induction_warmup(model, len(tokenizer), steps=3, log=None, target_loss=-1.0)
