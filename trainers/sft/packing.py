"""Sequence packing and padding for masked SFT, and the masked loss.

A *sample* is one tokenised trajectory: `input_ids` and `loss_mask` (1 on policy tokens).
Batches come in two layouts with the same loss:

* packed:  samples are concatenated into rows of exactly `row_length` tokens (best-fit
           decreasing bin packing, the tail of each row padded). Samples must not see each
           other: each row gets position ids restarting at 0 per sample and a block-diagonal
           causal attention mask ([rows, 1, L, L] bool, True = may attend), given to the
           model as a ready 4D mask (transformers passes 4D masks through untouched).
* padded:  one sample per row, right-padded to the longest row of the micro-batch.

Labels are built per sample *before* packing: position i of a sample predicts token i + 1
of the same sample, and only where that token is a policy token (`loss_mask[i + 1] == 1`).
The last token of a sample predicts nothing, so no token is ever trained to predict across
a sample boundary, and `masked_lm_loss` needs no shifting. Ignored positions hold -100.

Where we deviate from DR-Venus and why
* DR-Venus packs long-context samples with flash-attention varlen kernels on GPUs. torch's
  SDPA has no varlen kernel on CPU, so two exact substitutes are offered: the dense
  block-diagonal mask (simple; O(L^2) per row) and per-sample attention over the recorded
  spans (trainers.modeling.varlen; sum of len_i^2 per row, the default for packed training).
* Samples longer than a row are truncated (their tail is lost) rather than split, so a
  trained token always sees its whole history.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainers.modeling.varlen import pack_lengths

IGNORE_INDEX = -100


@dataclass(frozen=True)
class SFTSample:
    """One training sequence: ids and the 0/1 policy-token mask (same length)."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(f"{len(self.loss_mask)} mask entries for {len(self.input_ids)} ids")
        if len(self.input_ids) < 2:
            raise ValueError("a sample needs at least 2 tokens (one to predict from)")

    def __len__(self) -> int:
        return len(self.input_ids)

    def labels(self) -> list[int]:
        """Next-token targets inside this sample (IGNORE_INDEX where not trained)."""
        ids, mask = self.input_ids, self.loss_mask
        return [ids[i + 1] if mask[i + 1] else IGNORE_INDEX for i in range(len(ids) - 1)] \
            + [IGNORE_INDEX]

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask[1:])


def samples_from_trajectories(trajectories: Sequence, max_length: int) -> list[SFTSample]:
    """SFTSamples of tokenised trajectories, truncated to `max_length` tokens; samples that
    have no policy token left after truncation are dropped."""
    samples = []
    for trajectory in trajectories:
        if trajectory.input_ids is None or trajectory.loss_mask is None:
            raise ValueError(f"trajectory {trajectory.id!r} has no tokens; tokenize it first")
        ids = tuple(trajectory.input_ids[:max_length])
        mask = tuple(trajectory.loss_mask[:max_length])
        if sum(mask[1:]) > 0:
            samples.append(SFTSample(ids, mask))
    return samples


def pack_samples(samples: Sequence[SFTSample], row_length: int,
                 candidates: int = 512) -> list[list[int]]:
    """Pack samples into rows of at most `row_length` tokens, filling each row as full as
    possible (trainers.modeling.varlen.pack_lengths); returns rows of sample indices."""
    for index, sample in enumerate(samples):
        if len(sample) > row_length:
            raise ValueError(f"sample {index} has {len(sample)} tokens, more than a row "
                             f"({row_length}); truncate first (samples_from_trajectories)")
    return pack_lengths([len(sample) for sample in samples], row_length, candidates)


def epoch_rows(samples: Sequence[SFTSample], row_length: int, packing: bool, seed: int,
               epoch: int) -> list[list[int]]:
    """The rows of one epoch in training order: a pure function of (seed, epoch), so a
    resumed run rebuilds exactly the rows it was in the middle of."""
    rows = pack_samples(samples, row_length) if packing else [[i] for i in range(len(samples))]
    random.Random(f"sft-rows:{seed}:{epoch}").shuffle(rows)
    return rows


@dataclass
class Batch:
    """One micro-batch ready for the model.

    input_ids [B, L], labels [B, L] (IGNORE_INDEX where not trained), position_ids [B, L],
    segments [B, L]: which sample of its row each position holds (-1 = padding).
    real_tokens: non-padding tokens; trained_tokens: labels != IGNORE_INDEX.
    The attention mask is built from `segments` only when asked for, where it is used: a
    packed row's is [B, 1, L, L] (64M entries at L = 8K), and varlen attention needs none.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    segments: torch.Tensor
    packed: bool
    real_tokens: int
    trained_tokens: int
    spans: list[list[tuple[int, int]]]  # per row, [start, end) of each sample

    @property
    def slots(self) -> int:
        return int(self.input_ids.numel())

    def attention_mask_on(self, device: torch.device | str) -> torch.Tensor:
        """[B, 1, L, L] bool block-diagonal causal (packed) or [B, L] 0/1 padding mask
        (padded), built on `device`."""
        segments = self.segments.to(device)
        if not self.packed:
            return (segments >= 0).long()
        length = segments.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        same_sample = segments[:, :, None] == segments[:, None, :]
        # Padding attends to itself only, so its (ignored) rows never hold all -inf scores.
        is_pad = (segments < 0)[:, :, None]
        diagonal = torch.eye(length, dtype=torch.bool, device=device)[None]
        return ((same_sample & ~is_pad & causal[None]) | (is_pad & diagonal))[:, None]

    def model_inputs(self, with_mask: bool = True, device: torch.device | str | None = None
                     ) -> dict[str, torch.Tensor]:
        """Keyword arguments for the model, on `device` (default: where the batch is);
        with_mask=False leaves the attention mask out (varlen attention takes the sample
        spans instead, trainers.modeling.varlen)."""
        device = self.input_ids.device if device is None else device
        inputs = {"input_ids": self.input_ids.to(device),
                  "position_ids": self.position_ids.to(device)}
        if with_mask:
            inputs["attention_mask"] = self.attention_mask_on(device)
        return inputs


def collate(samples: Sequence[SFTSample], rows: Sequence[Sequence[int]], pad_id: int,
            packing: bool, row_length: int) -> Batch:
    """Build a micro-batch of `rows` (lists of sample indices)."""
    length = row_length if packing else max(sum(len(samples[i]) for i in row) for row in rows)
    n_rows = len(rows)
    input_ids = torch.full((n_rows, length), pad_id, dtype=torch.long)
    labels = torch.full((n_rows, length), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((n_rows, length), dtype=torch.long)
    # segment id per position: which sample of the row it belongs to (-1 = padding)
    segments = torch.full((n_rows, length), -1, dtype=torch.long)
    spans: list[list[tuple[int, int]]] = []
    for r, row in enumerate(rows):
        offset = 0
        spans.append([])
        for k, index in enumerate(row):
            sample = samples[index]
            n = len(sample)
            input_ids[r, offset:offset + n] = torch.tensor(sample.input_ids)
            labels[r, offset:offset + n] = torch.tensor(sample.labels())
            position_ids[r, offset:offset + n] = torch.arange(n)
            segments[r, offset:offset + n] = k
            spans[r].append((offset, offset + n))
            offset += n
    real = int((segments >= 0).sum())
    return Batch(input_ids=input_ids, labels=labels, position_ids=position_ids,
                 segments=segments, packed=packing, real_tokens=real,
                 trained_tokens=int((labels != IGNORE_INDEX).sum()), spans=spans)


def masked_lm_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of token cross-entropies over trained positions (labels already aligned: position
    i's label is the next token of the same sample). logits [B, L, V], labels [B, L]."""
    return torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
        ignore_index=IGNORE_INDEX, reduction="sum")


def padding_waste(rows: Sequence[Sequence[int]], samples: Sequence[SFTSample], packing: bool,
                  row_length: int, rows_per_micro_batch: int) -> float:
    """Fraction of token slots that are padding over an epoch's micro-batches."""
    slots = real = 0
    for start in range(0, len(rows), rows_per_micro_batch):
        group = rows[start:start + rows_per_micro_batch]
        sizes = [sum(len(samples[i]) for i in row) for row in group]
        width = row_length if packing else max(sizes)
        slots += width * len(group)
        real += sum(sizes)
    return 1.0 - real / slots if slots else 0.0
