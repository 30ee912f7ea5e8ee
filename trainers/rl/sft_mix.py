"""An SFT loss on fresh oracle episodes mixed into every RL update (InstructGPT's PPO-ptx).

    mix = SftMix.from_config("benchmarks/configs/learning_check_sft_mix.yaml", chat,
                             rl_world=0, coef=0.5, samples_per_update=2, seed=0,
                             rank=0, world_size=1, pad_id=tokenizer.pad_token_id)
    sft_loss = mix.backward(model, update=7, device=device)  # adds coef x CE to .grad

Each learner builds the same oracle samples (the SFT config's data and env sections,
tokenised with the policy's own chat template), so every learner knows the whole draw of
an update: update u takes `samples_per_update * world_size` samples in an order fixed by the
seed, learner r every world_size-th of them. Its gradient is `coef` times the mean
next-token cross-entropy over the draw's trained tokens, computed at temperature 1 (the
objective the warm start was trained with), added to the RL gradient before clipping.

Why: every RL update of a small start lowers its held-out correct behaviour about as much
as a random-sign update does (docs/benchmarks.md "Does the update raise held-out correct
episodes"), while SFT on fresh worlds holds it. The mixed loss keeps the imitation of
worlds RL never plays in the update, so the rewards' direction is not paid for with the
start's general skills.

Where we deviate from DR-Venus and why
* DR-Venus's RL has no SFT term. InstructGPT mixes pre-training gradients into PPO for the
  same reason as here (keeping what the start could do); we mix the warm start's own SFT
  objective on worlds disjoint from RL's, off by default (`learner.sft_coef: 0`).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from trainers.sft.packing import SFTSample, collate, masked_lm_loss_sum


class SftMix:
    """The oracle samples of one learner's SFT term and the verb that adds its gradient.

    Args:
        samples: tokenised oracle samples (the same list on every learner).
        coef: weight of the mean token cross-entropy in the update's loss.
        samples_per_update: samples each learner trains on per optimizer update.
        seed: fixes the order the samples are drawn in (a new pass reshuffles).
        rank, world_size: this learner's share of each draw.
        pad_id: padding token id of the padded micro-batch.
    """

    def __init__(self, samples: Sequence[SFTSample], *, coef: float, samples_per_update: int,
                 seed: int, rank: int = 0, world_size: int = 1, pad_id: int = 0):
        if not samples:
            raise ValueError("the SFT mix has no samples")
        if coef <= 0:
            raise ValueError(f"learner.sft_coef must be > 0 for an SFT mix, got {coef}")
        if samples_per_update < 1:
            raise ValueError(f"learner.sft_samples_per_update must be >= 1, got "
                             f"{samples_per_update}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside a world of {world_size} learners")
        self.samples = list(samples)
        self.coef, self.per_update = float(coef), int(samples_per_update)
        self.seed, self.rank, self.world_size, self.pad_id = seed, rank, world_size, pad_id
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        """The samples' order in pass `epoch` over them (a pure function of seed, epoch)."""
        if epoch not in self._orders:
            order = list(range(len(self.samples)))
            random.Random(f"sft-mix:{self.seed}:{epoch}").shuffle(order)
            self._orders = {epoch: order}  # draws move forward: keep only the current pass
        return self._orders[epoch]

    @classmethod
    def from_config(cls, config_path: str, chat: Any, *, rl_world: int, **kwargs: Any
                    ) -> SftMix:
        """Build the samples an SFT config's data section asks for (its model section is
        not used: the samples are tokenised with the policy's `chat`). Refuses a config
        whose worlds include the one RL trains on: the mix would then teach the oracle's
        answers to RL's own questions."""
        from trainers.sft.config import load_config
        from trainers.sft.pipeline import build_samples

        config = load_config(config_path)
        worlds = set(config.oracle_worlds())
        if rl_world in worlds:
            raise ValueError(f"learner.sft_config {config_path}: its worlds {sorted(worlds)} "
                             f"include RL's world {rl_world}; give the mix other worlds")
        return cls(build_samples(config, chat), **kwargs)

    def draw(self, update: int) -> tuple[list[int], list[int]]:
        """Sample indices of update `update`: (the whole draw, this learner's share)."""
        size = self.per_update * self.world_size
        start = update * size
        indices = []
        for position in range(start, start + size):
            epoch, offset = divmod(position, len(self.samples))
            indices.append(self._order(epoch)[offset])
        return indices, indices[self.rank::self.world_size]

    def backward(self, model: torch.nn.Module, update: int, device: torch.device, *,
                 scale: float = 1.0, autocast: Callable[[], Any] | None = None) -> float:
        """Add this learner's share of `coef` x the draw's mean cross-entropy to the
        gradients (times `scale`, the strategy's loss scale); returns the share's summed
        cross-entropy divided by the draw's trained tokens (the learners' values sum to the
        draw's mean)."""
        everyone, mine = self.draw(update)
        total_tokens = sum(self.samples[i].trained_tokens for i in everyone)
        batch = collate(self.samples, [[i] for i in mine], self.pad_id, packing=False,
                        row_length=0)
        inputs = batch.model_inputs(with_mask=True, device=device)
        with (autocast or contextlib.nullcontext)():
            logits = model(**inputs, use_cache=False).logits
        labels = batch.labels.to(device)
        loss_sum = masked_lm_loss_sum(logits, labels)
        (loss_sum * (self.coef * scale / max(1, total_tokens))).backward()
        return float(loss_sum.detach()) / max(1, total_tokens)
