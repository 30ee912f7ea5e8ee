"""Copied spans (trainers.algorithms.copying) and the copied-token weight of the advantages."""

import pytest
import torch

from trainers.algorithms import make_algorithm
from trainers.algorithms.copying import copied_tokens, shared_prefix_length
from trainers.algorithms.losses import LossConfig
from trainers.algorithms.registry import PolicyGradientConfig
from trainers.algorithms.rewards import outcome_rewards
from trainers.batch import TrajectoryRecord, collate

SYSTEM = [1, 50, 51, 52, 53, 2]          # shared by every row: the system prompt


def record(question, turns, group_id=0, outcome=1.0):
    """A trajectory: SYSTEM + question, then per turn (policy tokens, env reply tokens)."""
    ids = SYSTEM + question
    mask = [0] * len(ids)
    turn_index = [-1] * len(ids)
    question_end = len(ids)
    ends = []
    for t, (policy, reply) in enumerate(turns):
        ids += policy + reply
        mask += [1] * len(policy) + [0] * len(reply)
        turn_index += [t] * len(policy) + [-1] * len(reply)
        ends.append(len(ids))
    return TrajectoryRecord(input_ids=ids, loss_mask=mask, turn_index=turn_index,
                            turn_ends=ends, question_end=question_end,
                            turn_kinds=["search"] * (len(turns) - 1) + ["answer"],
                            turn_format_ok=[True] * len(turns), group_id=group_id,
                            outcome=outcome)


def test_copies_of_the_question_and_replies_are_marked_after_their_first_tokens():
    name = [70, 71, 72, 73]                      # a 4-token name in the question
    fact = [80, 81, 82]                          # a 3-token fact in the tool reply
    rows = [record([60] + name + [61], [([90] + name + [91], [3] + fact + [4]),
                                        ([92] + fact + [2], [])]),
            record([62, 63], [([90, 63, 91], [5, 6]), ([92, 6, 2], [])])]
    batch = collate(rows)
    copied = copied_tokens(batch, ngram=3)
    row = batch.input_ids[0].tolist()
    marked = [row[i] for i in range(len(row)) if copied[0, i]]
    # the name's tokens 3 and 4 (72, 73) continue a copy of the question; 70, 71 choose it;
    # the fact's last token (82) continues a copy of the reply
    assert marked == [72, 73, 82]
    assert not copied[1].any()                   # row 1 copies only 1-2 tokens
    assert not (copied & ~batch.loss_mask.bool()).any()


def test_the_shared_system_prompt_is_not_a_source():
    # the policy repeats 3 tokens of the system prompt (its format example): not a copy
    rows = [record([60, 61], [([51, 52, 53, 2], [])]),
            record([64, 65], [([51, 52, 53, 2], [])], group_id=1)]
    batch = collate(rows)
    assert shared_prefix_length(batch.input_ids, batch.lengths) == len(SYSTEM)
    assert not copied_tokens(batch, ngram=3).any()


def test_only_earlier_context_counts():
    # the reply that contains the n-gram comes after the policy wrote it: not a copy
    rows = [record([60], [([70, 71, 72], [70, 71, 72]), ([92, 2], [])]),
            record([61], [([93, 2], [])], group_id=1)]
    assert not copied_tokens(collate(rows), ngram=3).any()


def test_weighted_advantages_scale_copies_only():
    name = [70, 71, 72, 73]
    rows = [record([60] + name, [([90] + name + [2], [])], outcome=1.0),
            record([60] + name, [([91, 2], [])], outcome=0.0),
            record([64], [([94, 2], [])], group_id=1, outcome=1.0),
            record([64], [([95, 2], [])], group_id=1, outcome=0.0)]
    batch = collate(rows)
    plain = make_algorithm("grpo")
    weighted = make_algorithm("grpo", PolicyGradientConfig(
        loss=LossConfig(copied_token_weight=0.25)))
    rewards = outcome_rewards(batch)
    base, _ = plain.weighted_advantages(batch, rewards)
    scaled, metrics = weighted.weighted_advantages(batch, rewards)
    copied = copied_tokens(batch, 3)
    assert copied.sum() == 2                     # the name's tokens 72, 73 in row 0
    assert torch.allclose(scaled[copied], base[copied] * 0.25)
    assert torch.equal(scaled[~copied], base[~copied])
    assert base[copied].abs().min() > 0          # the weight had something to scale
    assert metrics["copied_token_fraction"] == pytest.approx(2 / int(batch.loss_mask.sum()))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="copied_token_weight"):
        LossConfig(copied_token_weight=-0.5)
    with pytest.raises(ValueError, match="copy_ngram"):
        LossConfig(copy_ngram=1)
    with pytest.raises(ValueError, match="n-gram"):
        copied_tokens(collate([record([60], [([2], [])])]), ngram=1)
