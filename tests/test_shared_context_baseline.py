"""The shared-context baseline (trainers.algorithms.advantages.shared_context_baseline and
`loss.shared_context_baseline`): the rows of a group that chose a token in the same context
share a leave-one-out baseline there."""

import random

import pytest
import torch

from tests.test_copying import SYSTEM
from tests.test_copying import record as copying_record
from trainers.algorithms import make_algorithm
from trainers.algorithms.advantages import shared_context_baseline
from trainers.algorithms.losses import LossConfig
from trainers.algorithms.registry import PolicyGradientConfig
from trainers.algorithms.rewards import outcome_rewards
from trainers.batch import collate

QUESTION = [40, 41]
PROMPT = SYSTEM + QUESTION


def record(turns, group_id=0, outcome=1.0):
    """PROMPT, then per turn (policy tokens, env reply tokens)."""
    return copying_record(QUESTION, turns, group_id=group_id, outcome=outcome)


def per_token(batch, row_values):
    """[B, L] advantages: row r's policy tokens all take row_values[r]."""
    values = torch.tensor(row_values, dtype=torch.float32)[:, None]
    return torch.where(batch.loss_mask.bool(), values.expand_as(batch.input_ids.float()),
                       torch.zeros(batch.input_ids.shape))


def baseline(batch, advantages):
    return shared_context_baseline(advantages, batch.input_ids, batch.lengths,
                                   batch.loss_mask, batch.group_ids)


def test_hand_computed_group_of_three():
    # rows 0 and 1 write the same first turn and part at their answer; row 2 parts at once;
    # row 3 is another group with row 0's tokens
    reply = [7, 7]
    rows = [record([([10, 11], reply), ([20, 2], [])]),
            record([([10, 11], reply), ([21, 2], [])]),
            record([([12, 11], reply), ([20, 2], [])]),
            record([([10, 11], reply), ([20, 2], [])], group_id=1)]
    batch = collate(rows)
    raw = per_token(batch, [3.0, 1.0, -4.0, 5.0])
    out, metrics = baseline(batch, raw)
    start = len(PROMPT)
    # token 0 of turn 0: all three rows of group 0 choose there -> leave-one-out over the others
    assert out[0, start].item() == pytest.approx(3.0 - (1.0 - 4.0) / 2)
    assert out[1, start].item() == pytest.approx(1.0 - (3.0 - 4.0) / 2)
    assert out[2, start].item() == pytest.approx(-4.0 - (3.0 + 1.0) / 2)
    # token 1 of turn 0: rows 0 and 1 share the context; row 2 is alone in its own
    assert out[0, start + 1].item() == pytest.approx(3.0 - 1.0)
    assert out[1, start + 1].item() == pytest.approx(1.0 - 3.0)
    assert out[2, start + 1].item() == pytest.approx(-4.0)
    # the answer's first token: rows 0 and 1 are in one state and part there
    answer = start + 2 + len(reply)
    assert out[0, answer].item() == pytest.approx(2.0)
    assert out[1, answer].item() == pytest.approx(-2.0)
    # the answer's last token follows different tokens: each row alone keeps its advantage
    assert out[0, answer + 1].item() == pytest.approx(3.0)
    assert out[1, answer + 1].item() == pytest.approx(1.0)
    # a group of one keeps its advantages; nothing off the policy tokens
    assert torch.equal(out[3], raw[3])
    assert not out[~batch.loss_mask.bool()].any()
    # shared: group 0's rows 0/1 at 3 tokens each, row 2 at 1 -> 7 of the 16 policy tokens
    assert metrics["shared_context_token_fraction"] == pytest.approx(7 / 16)


def random_group(rng, group_id, size):
    """`size` rows that follow a small random tree of token choices (shared prefixes)."""
    rows = []
    for _ in range(size):
        turns = [([rng.choice([10, 11]), rng.choice([12, 13]), 14], [7]),
                 ([rng.choice([20, 21]), rng.choice([22, 23, 24]), 2], [])]
        rows.append(record(turns, group_id=group_id))
    return rows


def test_over_every_shared_context_the_new_advantages_sum_to_zero_and_lone_ones_stay():
    rng = random.Random(0)
    rows = [r for g in range(3) for r in random_group(rng, g, 6)]
    batch = collate(rows)
    raw = torch.randn(batch.input_ids.shape) * batch.loss_mask
    out, _ = baseline(batch, raw)
    ids, mask = batch.input_ids.tolist(), batch.loss_mask.bool()
    contexts: dict[tuple, list[int]] = {}
    for row in range(batch.batch_size):
        for p in range(int(batch.lengths[row])):
            if mask[row, p]:
                key = (int(batch.group_ids[row]), tuple(ids[row][:p]))
                contexts.setdefault(key, []).append((row, p))
    assert any(len(members) > 1 for members in contexts.values())
    assert any(len(members) == 1 for members in contexts.values())
    for members in contexts.values():
        if len(members) == 1:
            (row, p), = members
            assert out[row, p] == raw[row, p]
        else:
            assert abs(sum(float(out[row, p]) for row, p in members)) < 1e-5
            for row, p in members:
                others = [float(raw[r, q]) for r, q in members if r != row]
                assert float(out[row, p]) == pytest.approx(float(raw[row, p])
                                                           - sum(others) / len(others), abs=1e-5)


def test_zero_sum_sequence_advantages_are_only_rescaled_where_every_row_chooses():
    rows = [record([([10 + r % 2, 11 + r], [7]), ([20, 2], [])]) for r in range(4)]
    batch = collate(rows)
    raw = per_token(batch, [1.0, -1.0, 0.5, -0.5])   # GRPO-like: sums to zero over the group
    out, metrics = baseline(batch, raw)
    first = len(PROMPT)
    assert out[:, first].tolist() == pytest.approx((raw[:, first] * 4 / 3).tolist())
    assert metrics["shared_context_mean_advantage_abs"] == pytest.approx(
        # first token: mean 0 over all four; second token: rows {0, 2} and {1, 3} share
        (4 * 0.0 + 2 * 0.75 + 2 * 0.75) / 8)


def test_identical_rollouts_get_no_net_gradient():
    """The behaviour the option exists for: G rollouts that wrote the same tokens get
    advantages that cancel, so the loss's gradient on the shared logits is zero; without
    the baseline, IGPO-like advantages of one sign push them."""
    rows = [record([([10, 11, 12], [7]), ([20, 2], [])], outcome=1.0) for _ in range(3)]
    batch = collate(rows)
    raw = per_token(batch, [0.7, 0.7, 0.7])       # per-turn returns that do not cancel
    gradients = {}
    for on in (False, True):
        algorithm = make_algorithm("grpo", PolicyGradientConfig(
            loss=LossConfig(kl_coef=0.0, shared_context_baseline=on)))
        advantages = baseline(batch, raw)[0] if on else raw
        logits = torch.zeros(batch.input_ids.shape[1], 64, requires_grad=True)
        logprobs = torch.log_softmax(logits, -1).gather(1, batch.input_ids.T).T  # [B, L]
        old = logprobs.detach()
        scored = batch.replace(advantages=advantages, old_logprobs=old)
        loss, _ = algorithm.loss(scored, logprobs)
        loss.backward()
        gradients[on] = logits.grad.abs().max().item()
    assert gradients[False] > 1e-3
    assert gradients[True] < 1e-7


@pytest.mark.parametrize("placebo", [False, True])
def test_weighted_advantages_apply_it_only_when_asked(placebo):
    rows = [record([([10, 11], [7]), ([20 + r, 2], [])], outcome=float(r % 2))
            for r in range(4)]
    batch = collate(rows)
    rewards = outcome_rewards(batch)
    off = make_algorithm("grpo", PolicyGradientConfig(placebo=placebo))
    on = make_algorithm("grpo", PolicyGradientConfig(
        placebo=placebo, loss=LossConfig(shared_context_baseline=True)))
    plain, plain_metrics = off.weighted_advantages(batch, rewards)
    centred, metrics = on.weighted_advantages(batch, rewards)
    assert "shared_context_token_fraction" not in plain_metrics
    assert metrics["shared_context_token_fraction"] > 0
    expected, _ = baseline(batch, plain)
    assert torch.allclose(centred, expected)
    assert not torch.allclose(centred, plain)


def test_a_malformed_turn_is_never_raised_above_zero_or_its_own_advantage():
    # rows 0 and 1 begin their first turn alike; row 1's turn turns out malformed and carries
    # a penalty (A < 0) while row 0's valid turn has a lower advantage still: the baseline
    # alone would make row 1's shared tokens positive
    rows = [record([([10, 11, 12], [7]), ([20, 2], [])]),
            record([([10, 11, 13], [7]), ([20, 2], [])])]
    rows[1].turn_format_ok[0] = False
    batch = collate(rows)
    raw = per_token(batch, [-3.0, -1.0])
    algorithm = make_algorithm("grpo", PolicyGradientConfig(
        loss=LossConfig(shared_context_baseline=True)))
    algorithm.advantages = lambda batch, rewards: (raw, {})
    centred, _ = algorithm.weighted_advantages(batch, outcome_rewards(batch))
    plain, _ = baseline(batch, raw)
    first_turn = batch.turn_index == 0
    assert (plain[1][first_turn[1]][:2] > 0).all()          # what the clamp prevents
    assert (centred[1][first_turn[1]] <= 0).all()
    assert torch.equal(centred[0], plain[0])                 # the valid row keeps its baseline
    assert torch.equal(centred[1][~first_turn[1]], plain[1][~first_turn[1]])
