"""Packing: packed rows compute exactly the per-sample losses; labels never cross samples."""

from __future__ import annotations

import random

import pytest
import torch

from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.sft.packing import (
    IGNORE_INDEX,
    SFTSample,
    collate,
    masked_lm_loss_sum,
    pack_samples,
    padding_waste,
)

TEXTS = ["Search the page and read it. The river flows through the city."] * 20


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_tokenizer(TEXTS, vocab_size=300)


def random_samples(vocab: int, sizes: list[int], seed: int = 0) -> list[SFTSample]:
    rng = random.Random(seed)
    samples = []
    for size in sizes:
        ids = tuple(rng.randrange(3, vocab) for _ in range(size))
        mask = tuple([0, 0] + [rng.randrange(2) for _ in range(size - 2)])
        samples.append(SFTSample(ids, mask))
    return samples


def test_labels_stay_inside_sample():
    sample = SFTSample((5, 6, 7, 8), (0, 1, 0, 1))
    assert sample.labels() == [6, IGNORE_INDEX, 8, IGNORE_INDEX]
    samples = [sample, SFTSample((9, 10, 11), (0, 1, 1))]
    batch = collate(samples, [[0, 1]], pad_id=0, packing=True, row_length=10)
    labels = batch.labels[0].tolist()
    # the last token of sample 0 (position 3) must not predict sample 1's first token (9)
    assert labels[:7] == [6, IGNORE_INDEX, 8, IGNORE_INDEX, 10, 11, IGNORE_INDEX]
    assert labels[7:] == [IGNORE_INDEX] * 3
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3, 0, 1, 2, 0, 0, 0]
    mask = batch.attention_mask_on("cpu")[0, 0]
    assert not mask[4, :4].any() and mask[4, 4] and mask[6, 4:7].all()
    assert batch.trained_tokens == 4 and batch.real_tokens == 7


def test_pack_samples_is_a_partition():
    samples = random_samples(50, [random.Random(i).randrange(2, 40) for i in range(60)])
    rows = pack_samples(samples, 64)
    flat = sorted(i for row in rows for i in row)
    assert flat == list(range(60))
    assert all(sum(len(samples[i]) for i in row) <= 64 for row in rows)
    assert padding_waste(rows, samples, True, 64, 1) < 0.1
    with pytest.raises(ValueError):
        pack_samples(samples, 30)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_packed_loss_equals_separate_losses(tokenizer, arch):
    model = build_tiny_causal_lm(tokenizer, arch=arch, hidden=64, layers=2, seed=1)
    samples = random_samples(len(tokenizer), [17, 5, 30, 11, 9, 23], seed=2)
    rows = pack_samples(samples, 48)
    with torch.no_grad():
        packed = collate(samples, rows, tokenizer.pad_token_id, packing=True, row_length=48)
        packed_loss = masked_lm_loss_sum(model(**packed.model_inputs()).logits, packed.labels)
        separate = 0.0
        for index in range(len(samples)):
            single = collate(samples, [[index]], tokenizer.pad_token_id, packing=False,
                             row_length=48)
            logits = model(input_ids=single.input_ids).logits
            separate += float(masked_lm_loss_sum(logits, single.labels))
        padded = collate(samples, [[i] for i in range(len(samples))], tokenizer.pad_token_id,
                         packing=False, row_length=48)
        padded_loss = masked_lm_loss_sum(model(**padded.model_inputs()).logits, padded.labels)
    assert packed.trained_tokens == sum(s.trained_tokens for s in samples)
    assert abs(float(packed_loss) - separate) <= 1e-5 * max(1.0, separate)
    assert abs(float(padded_loss) - separate) <= 1e-5 * max(1.0, separate)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_varlen_attention_equals_separate_losses(tokenizer, arch):
    from trainers.modeling.varlen import packed_spans

    model = build_tiny_causal_lm(tokenizer, arch=arch, hidden=64, layers=2, seed=3,
                                 kv_heads=1)
    samples = random_samples(len(tokenizer), [17, 5, 30, 11, 9, 23, 40], seed=4)
    rows = pack_samples(samples, 50)
    with torch.no_grad():
        batch = collate(samples, rows, tokenizer.pad_token_id, packing=True, row_length=50)
        with packed_spans(model, batch.spans):
            logits = model(**batch.model_inputs(with_mask=False)).logits
        varlen = float(masked_lm_loss_sum(logits, batch.labels))
        dense = float(masked_lm_loss_sum(model(**batch.model_inputs()).logits, batch.labels))
        separate = 0.0
        for index in range(len(samples)):
            single = collate(samples, [[index]], tokenizer.pad_token_id, False, 50)
            separate += float(masked_lm_loss_sum(model(input_ids=single.input_ids).logits,
                                                 single.labels))
    assert model.config._attn_implementation != "venus_varlen"  # restored
    assert abs(varlen - separate) <= 1e-5 * separate
    assert abs(dense - separate) <= 1e-5 * separate
