"""Induction warm-up: a few hundred steps of "repeat this random sequence" before SFT.

A deep-research turn copies strings from its context: the entity of the question into the
search query, a url from the search results into the visit call, the value from the evidence
into the answer. Pretrained LMs copy with induction heads (attend to the token after an
earlier occurrence of the current token). A tiny model trained from scratch on a few
thousand SFT trajectories does not form them: in our runs it learned the turn format
(88-100% valid turns) but its loss on an entity name stayed at ~5 nats even on the name's
third occurrence in the same turn, and it answered 0% of held-out tasks (docs/sft.md).

The warm-up trains on sequences `x ++ y` of random token ids, y being x's chunks in a
shuffled order, with the loss on the copyable tokens of y (`copy_task_batch`). The shuffle
matters: a plain `x ++ x` is solved by attending a fixed distance back, which teaches
nothing about copying from a question or a search result (our first version did that, and
SFT erased it within 200 steps).
The data is random: it carries no knowledge of the world, its tasks or the protocol, so the
model is still trained from scratch on the task.

Where we deviate from DR-Venus and why: DR-Venus starts from a pretrained Qwen3-4B, which
already copies; this stage stands in for pretraining at tiny scale.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

# The target is checked on the mean loss of this many steps: one batch is too noisy.
TARGET_WINDOW = 10


class InductionWarmupError(RuntimeError):
    """The warm-up ran all its steps without reaching its copy-loss target."""


@dataclass
class WarmupResult:
    steps: int
    first_loss: float
    last_loss: float
    reached_target: bool | None = None  # None: no target was set


def induction_warmup(model: torch.nn.Module, vocab_size: int, *, steps: int,
                     half_length: int = 32, chunk: int = 4, batch_size: int = 64,
                     lr: float = 3e-3, low_id: int = 0, seed: int = 0,
                     log: Callable[[str], None] | None = print, log_every: int = 100,
                     target_loss: float = 0.0) -> WarmupResult:
    """Train `model` in place on the shuffled-chunk copy task (`copy_task_batch`).

    Copying arrives as a phase change (the loss sits near chance for hundreds or thousands
    of steps, then falls by several nats within ~100), and when it arrives depends on the
    model's shape, the batch size and the lr (docs/sft.md has a table). With `target_loss`
    > 0 the warm-up stops as soon as the mean loss of the last TARGET_WINDOW steps is below
    it, and raises InductionWarmupError if `steps` pass first: SFT after a failed warm-up
    does not learn to copy names (experiments/HISTORY.md, part 10), so a long run should
    not start.

    Args:
        model: a causal LM (returns `.logits` [B, L, V]); left in train mode.
        vocab_size: ids are drawn below this (the tokenizer's length).
        steps: optimizer steps (0 = nothing happens).
        half_length: length of x; sequences are 2 * half_length tokens.
        chunk: length of the chunks of x that the second half repeats in shuffled order.
        batch_size: sequences per step.
        lr: AdamW learning rate (constant; a fresh optimizer, not the SFT one).
        low_id: smallest id drawn (skip control tokens, which never occur inside text).
        seed: seed of the random sequences.
        log: where progress lines go (None = silent).
        target_loss: copy loss (nats) that ends the warm-up early and must be reached
            (0 = no target: run exactly `steps`).
    Returns the steps run and the first and last copy losses (nats per predictable token).
    """
    if steps < 0 or half_length < 1 or batch_size < 1 or not 0 <= low_id < vocab_size \
            or not 1 < chunk <= half_length or half_length % chunk or not target_loss >= 0:
        raise ValueError("need steps >= 0, half_length >= 1, batch_size >= 1, "
                         "0 <= low_id < vocab_size, 1 < chunk <= half_length with "
                         "half_length a multiple of chunk, and target_loss >= 0")
    if target_loss > 0 and steps < TARGET_WINDOW:
        raise ValueError(f"a target_loss needs steps >= {TARGET_WINDOW} (it is checked on the "
                         f"mean of {TARGET_WINDOW} steps), got steps={steps}")
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95),
                                  weight_decay=0.01)
    model.train()
    first = last = float("nan")
    recent: deque[float] = deque(maxlen=TARGET_WINDOW)
    for step in range(steps):
        ids, targets = copy_task_batch(vocab_size, batch_size, half_length, chunk=chunk,
                                       generator=generator, low_id=low_id)
        loss = copy_task_loss(model, ids.to(device), targets.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        last = float(loss.detach())
        if step == 0:
            first = last
        recent.append(last)
        reached = target_loss > 0 and len(recent) == TARGET_WINDOW \
            and sum(recent) / TARGET_WINDOW < target_loss
        if log and (step % log_every == 0 or step == steps - 1 or reached):
            log(f"induction warm-up {step + 1}/{steps}: copy loss {last:.3f}"
                + (f" (mean of the last {TARGET_WINDOW} below the target {target_loss})"
                   if reached else ""))
        if reached:
            return WarmupResult(step + 1, first, last, reached_target=True)
    if target_loss > 0:
        raise InductionWarmupError(
            f"the induction warm-up did not teach the model to copy: mean copy loss "
            f"{sum(recent) / len(recent):.3f} over its last {len(recent)} steps after {steps} "
            f"steps, target {target_loss} (chance is "
            f"{math.log(vocab_size - low_id):.2f}). Raise train.induction_warmup_steps, or "
            f"change induction_warmup_lr / induction_warmup_batch_size; deeper models need "
            f"other settings (docs/sft.md, 'Induction warm-up settings by model shape').")
    return WarmupResult(steps, first, last)


def copy_task_batch(vocab_size: int, batch_size: int, half_length: int, *, chunk: int = 8,
                    generator: torch.Generator | None = None, seed: int | None = None,
                    low_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows `x ++ y`: x uniform random ids in [low_id, vocab), y the chunks of x (length
    `chunk`) in a random order. Returns (ids [B, 2H] int64, targets [B, 2H] bool), targets
    True on the tokens of y that can be copied: all but the first of each chunk.

    Why shuffled chunks: with `x ++ x` every copy sits exactly H tokens back, and a model
    with rotary positions learns "attend H back" instead of "find the earlier occurrence of
    the current token and copy what followed it" (induction). Only the latter carries over
    to copying a name from a question or a url from search results.
    """
    if generator is None:
        generator = torch.Generator().manual_seed(int(seed or 0))
    x = torch.randint(low_id, vocab_size, (batch_size, half_length), generator=generator)
    n_chunks = half_length // chunk
    order = torch.argsort(torch.rand(batch_size, n_chunks, generator=generator), dim=1)
    y = torch.gather(x.view(batch_size, n_chunks, chunk), 1,
                     order[:, :, None].expand(-1, -1, chunk)).reshape(batch_size, half_length)
    targets = torch.zeros(batch_size, 2 * half_length, dtype=torch.bool)
    targets[:, half_length:] = True
    targets[:, half_length::chunk] = False
    return torch.cat([x, y], dim=1), targets


def copy_task_loss(model: torch.nn.Module, ids: torch.Tensor, targets: torch.Tensor
                   ) -> torch.Tensor:
    """Mean cross-entropy over the target tokens of `copy_task_batch` rows (nats/token)."""
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
    wanted = targets[:, 1:]
    return torch.nn.functional.cross_entropy(logits[wanted].float(), ids[:, 1:][wanted])
