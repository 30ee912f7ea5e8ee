"""Induction warm-up: a few hundred steps of "repeat this random sequence" before SFT.

A deep-research turn copies strings from its context: the entity of the question into the
search query, a url from the search results into the visit call, the value from the evidence
into the answer. Pretrained LMs copy with induction heads (attend to the token after an
earlier occurrence of the current token). A tiny model trained from scratch on a few
thousand SFT trajectories does not form them: in our runs it learned the turn format
(88-100% valid turns) but its loss on an entity name stayed at ~5 nats even on the name's
third occurrence in the same turn, and it answered 0% of held-out tasks (docs/sft.md).

The warm-up trains on sequences `x ++ x` of random token ids, with the loss on the second
half only. Induction heads appear after ~200 steps (the second-half loss falls from ~9 to
~0.03 nats on the 10K-token world vocabulary), and SFT then starts from a model that copies.
The data is random: it carries no knowledge of the world, its tasks or the protocol, so the
model is still trained from scratch on the task.

Where we deviate from DR-Venus and why: DR-Venus starts from a pretrained Qwen3-4B, which
already copies; this stage stands in for pretraining at tiny scale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class WarmupResult:
    steps: int
    first_loss: float
    last_loss: float


def induction_warmup(model: torch.nn.Module, vocab_size: int, *, steps: int,
                     half_length: int = 64, batch_size: int = 16, lr: float = 2e-3,
                     low_id: int = 0, seed: int = 0,
                     log: Callable[[str], None] | None = print, log_every: int = 50
                     ) -> WarmupResult:
    """Train `model` in place on `x ++ x` copies of uniform random ids in [low_id, vocab_size).

    Args:
        model: a causal LM (returns `.logits` [B, L, V]); left in train mode.
        vocab_size: ids are drawn below this (the tokenizer's length).
        steps: optimizer steps (0 = nothing happens).
        half_length: length of x; sequences are 2 * half_length tokens.
        batch_size: sequences per step.
        lr: AdamW learning rate (constant; a fresh optimizer, not the SFT one).
        low_id: smallest id drawn (skip control tokens, which never occur inside text).
        seed: seed of the random sequences.
        log: where progress lines go (None = silent).
    Returns the first and last second-half losses (nats per token).
    """
    if steps < 0 or half_length < 1 or batch_size < 1 or not 0 <= low_id < vocab_size:
        raise ValueError("need steps >= 0, half_length >= 1, batch_size >= 1 and "
                         "0 <= low_id < vocab_size")
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95),
                                  weight_decay=0.01)
    model.train()
    first = last = float("nan")
    for step in range(steps):
        ids = copy_task_batch(vocab_size, batch_size, half_length, generator=generator,
                              low_id=low_id).to(device)
        loss = copy_task_loss(model, ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        last = float(loss.detach())
        if step == 0:
            first = last
        if log and (step % log_every == 0 or step == steps - 1):
            log(f"induction warm-up {step + 1}/{steps}: copy loss {last:.3f}")
    return WarmupResult(steps, first, last)


def copy_task_batch(vocab_size: int, batch_size: int, half_length: int, *,
                    generator: torch.Generator | None = None, seed: int | None = None,
                    low_id: int = 0) -> torch.Tensor:
    """[batch_size, 2 * half_length] int64: rows `x ++ x`, x uniform in [low_id, vocab)."""
    if generator is None:
        generator = torch.Generator().manual_seed(int(seed or 0))
    half = torch.randint(low_id, vocab_size, (batch_size, half_length), generator=generator)
    return torch.cat([half, half], dim=1)


def copy_task_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the second half of `x ++ x` rows (nats per token)."""
    half = ids.shape[1] // 2
    # Logits at positions H-1 .. 2H-2 predict the second copy.
    logits = model(input_ids=ids, use_cache=False).logits[:, half - 1:-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                             ids[:, half:].reshape(-1))
