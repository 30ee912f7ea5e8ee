"""The RL driver's held-out evaluation: its own engine on eval.split (test or validation),
greedy.

The driver evaluates the starting policy, every `eval.every` steps and the final policy
with the learner's current weights (`load`), and saves the final policy as a model
directory (`save_final`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainers.modeling.models import load_policy
from trainers.rl.config import RLConfig
from trainers.rollout import SamplingConfig, text_token_counter


class EvalPolicy:
    """The driver's own engine for held-out evaluation (greedy, eval.split)."""

    def __init__(self, config: RLConfig, weights: dict[str, torch.Tensor]):
        from trainers.engines.hf import HFEngine

        self.config = config
        model, tokenizer, _ = load_policy(config.policy.path)
        self.engine = HFEngine(model, tokenizer)
        self.load(weights)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        self.engine.update_weights(weights)

    def evaluate(self, chat: Any) -> dict[str, float]:
        """Greedy play of the held-out split with the loaded weights: the evaluation's
        summary (trainers.evaluation.evaluate)."""
        from trainers.evaluation.evaluate import evaluate

        config = self.config
        sampling = SamplingConfig(max_turn_tokens=config.eval.max_turn_tokens, temperature=0.0)
        env_kwargs = {**config.env.kwargs(), "token_counter": text_token_counter(chat)}
        result = evaluate(self.engine, chat, env_kwargs, num_tasks=config.eval.num_tasks, k=1,
                          sampling=sampling, task_split=config.eval.split,
                          max_context_tokens=config.rollout.max_context_tokens)
        return result.summary()

    def save_final(self, directory: Path, tokenizer: Any) -> None:
        self.engine.model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
