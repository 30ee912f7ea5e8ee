"""Advantages against hand-worked numbers (design.md "RL")."""

import math

import pytest
import torch

from tests.helpers import synthetic_record
from trainers.algorithms import IGPOConfig, make_algorithm
from trainers.algorithms.advantages import (
    broadcast_turn_advantages,
    discounted_turn_advantages,
    group_zscore,
    grpo_advantages,
    ig_scale,
    igpo_turn_advantages,
    rloo_advantages,
)
from trainers.algorithms.rewards import RewardConfig, TurnRole, turn_rewards
from trainers.batch import collate


def z(x, mean, var):
    """The documented z-score: (x - mean) / (sqrt(pop var + 1e-8) + 1e-6)."""
    return (x - mean) / (math.sqrt(var + 1e-8) + 1e-6)


def test_group_zscore_hand_numbers_and_special_cases():
    values = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 2.0, 2.0, 2.0])
    groups = torch.tensor([7, 7, 7, 7, 3, 9, 9, 9])  # any ids; group 3 has one member
    out = group_zscore(values, groups)
    expected = [z(1, 0.5, 0.25), z(0, 0.5, 0.25), z(0, 0.5, 0.25), z(1, 0.5, 0.25),
                0.0,  # a set of one: std = 1, so (5 - 5) / (1 + 1e-6) = 0
                0.0, 0.0, 0.0]  # all equal: 0 / (sqrt(1e-8) + 1e-6) = 0
    assert out.tolist() == pytest.approx(expected, abs=1e-6)
    assert out[0].item() == pytest.approx(0.999998, abs=1e-6)


def test_group_zscore_ignores_invalid_entries():
    values = torch.tensor([3.0, 100.0, 1.0])
    valid = torch.tensor([True, False, True])
    out = group_zscore(values, torch.zeros(3, dtype=torch.long), valid)
    assert out.tolist() == pytest.approx([z(3, 2, 1), 0.0, z(1, 2, 1)], abs=1e-6)


def test_ig_scale_formula_and_bounds():
    turn_valid = torch.ones(1, 2, dtype=torch.bool)
    # mean|o~| = 1, mean|r~| = 0.5 -> 1 / (0.5 + 1e-6)
    s = ig_scale(torch.tensor([1.0, -1.0]), torch.tensor([[0.5, -0.5]]), turn_valid)
    assert s.item() == pytest.approx(1 / (0.5 + 1e-6), rel=1e-6)
    # outcomes all equal -> mean|o~| = 0 is floored at 0.3
    s = ig_scale(torch.zeros(2), torch.tensor([[1.0, -1.0]]), turn_valid)
    assert s.item() == pytest.approx(0.3 / (1 + 1e-6), rel=1e-6)
    # turn rewards all zero -> capped at 10
    s = ig_scale(torch.tensor([1.0, -1.0]), torch.zeros(1, 2), turn_valid)
    assert s.item() == pytest.approx(10.0)
    # no turn reward at all -> 1 (nothing to scale)
    assert ig_scale(torch.ones(2), torch.ones(1, 2), ~turn_valid).item() == 1.0


def test_discount_with_carriers_and_penalties():
    C, G, P, OUT = (int(r) for r in (TurnRole.CARRIER, TurnRole.INFO_GAIN, TurnRole.PENALTY,
                                   TurnRole.OUTCOME))
    role = torch.tensor([[C, G, C, P, G, OUT, -1]])
    values = torch.tensor([[9.0, 1.0, 9.0, -2.0, 0.5, 3.0, 9.0]])  # carriers' values unused
    a5 = 3.0
    a4 = 0.5 + 0.5 * a5  # 2.0
    a3 = -2.0 + 0.5 * a4  # -1.0
    a1 = 1.0 + 0.5 * a3  # 0.5 (the penalty turn is in the discount chain)
    expected = [a1, a1, a4, a3, a4, a5, 0.0]  # carriers take the next INFO_GAIN/OUTCOME A
    out = discounted_turn_advantages(values, role, gamma=0.5)
    assert out[0].tolist() == pytest.approx(expected)


def _two_rollout_group(final_ok=(True, True)):
    """Group of two, browse-aware scores worked by hand:
    A: search, visit, answer (outcome 1); s: question -3, after visit -1  -> IG 2.0
    B: visit, visit, answer (outcome 0);  s: -3, -2.5, -2.0              -> IG 0.5, 0.5
    """
    records = [
        synthetic_record([("search",), ("visit",), ("answer", 3, 0, final_ok[0])], 0, 1.0, seed=1),
        synthetic_record([("visit",), ("visit",), ("answer", 3, 0, final_ok[1])], 0, 0.0, seed=2),
    ]
    nan = float("nan")
    scores = torch.tensor([[-3.0, nan, -1.0, nan], [-3.0, -2.5, -2.0, nan]])
    return collate(records).replace(boundary_scores=scores)


def test_igpo_scaled_separate_hand_worked():
    batch = _two_rollout_group()
    rewards = turn_rewards(batch, RewardConfig())
    adv, metrics = igpo_turn_advantages(rewards, batch.group_ids, "scaled_separate", 0.95)
    o_a, o_b = z(1, 0.5, 0.25), z(0, 0.5, 0.25)  # ~ +1, -1
    r = [z(2.0, 1.0, 0.5), z(0.5, 1.0, 0.5)]  # ~ 1.41421, -0.70711
    scale = max(0.3, (abs(o_a) + abs(o_b)) / 2) / ((abs(r[0]) + 2 * abs(r[1])) / 3 + 1e-6)
    assert metrics["ig_scale"] == pytest.approx(scale, rel=1e-5)
    assert scale == pytest.approx(1.06066, abs=1e-4)
    visit_a = scale * r[0] + 0.95 * o_a  # ~ 2.45
    visit_b2 = scale * r[1] + 0.95 * o_b  # ~ -1.70
    visit_b1 = scale * r[1] + 0.95 * visit_b2  # ~ -2.365
    assert adv[0, :3].tolist() == pytest.approx([visit_a, visit_a, o_a], abs=1e-5)
    assert adv[1, :3].tolist() == pytest.approx([visit_b1, visit_b2, o_b], abs=1e-5)
    assert [visit_a, visit_b1] == pytest.approx([2.45, -2.365], abs=1e-4)


def test_igpo_separate_and_joint_hand_worked():
    batch = _two_rollout_group()
    rewards = turn_rewards(batch, RewardConfig())
    adv, metrics = igpo_turn_advantages(rewards, batch.group_ids, "separate", 0.95)
    assert "ig_scale" not in metrics
    o_a, o_b = z(1, 0.5, 0.25), z(0, 0.5, 0.25)
    r_a, r_b = z(2.0, 1.0, 0.5), z(0.5, 1.0, 0.5)
    b2 = r_b + 0.95 * o_b
    assert adv[0, :3].tolist() == pytest.approx([r_a + 0.95 * o_a] * 2 + [o_a], abs=1e-5)
    assert adv[1, :3].tolist() == pytest.approx([r_b + 0.95 * b2, b2, o_b], abs=1e-5)

    adv, _ = igpo_turn_advantages(rewards, batch.group_ids, "joint", 0.95)
    pooled = [1.0, 0.0, 2.0, 0.5, 0.5]  # outcomes and turn rewards in one set
    mean = sum(pooled) / 5
    var = sum((v - mean) ** 2 for v in pooled) / 5  # 0.46
    o_a, o_b, r_a, r_b = (z(v, mean, var) for v in (1.0, 0.0, 2.0, 0.5))
    b2 = r_b + 0.95 * o_b
    assert adv[0, :3].tolist() == pytest.approx([r_a + 0.95 * o_a] * 2 + [o_a], abs=1e-5)
    assert adv[1, :3].tolist() == pytest.approx([r_b + 0.95 * b2, b2, o_b], abs=1e-5)
    assert adv[1, 0].item() == pytest.approx(-1.92706, abs=1e-4)


def test_all_equal_group_gives_zero_advantages():
    records = [synthetic_record([("visit",), ("answer", 3, 0)], 0, 1.0, seed=i) for i in range(3)]
    scores = torch.tensor([[-2.0, -1.0, float("nan")]] * 3)
    batch = collate(records).replace(boundary_scores=scores)
    adv, _ = igpo_turn_advantages(turn_rewards(batch, RewardConfig()), batch.group_ids)
    assert adv.abs().max().item() == pytest.approx(0.0, abs=1e-6)


def test_group_of_one():
    one_visit = collate([synthetic_record([("visit",), ("answer", 3, 0)], 4, 1.0)])
    one_visit = one_visit.replace(boundary_scores=torch.tensor([[-3.0, -2.0, float("nan")]]))
    for mode in ("scaled_separate", "separate", "joint"):
        adv, _ = igpo_turn_advantages(turn_rewards(one_visit, RewardConfig()),
                                      one_visit.group_ids, mode)
        assert adv.abs().max().item() == 0.0  # every pooled set has one element

    # Two IG turns: the outcome set still has one element (o~ = 0), the turn set has two.
    two_visits = collate([synthetic_record([("visit",), ("visit",), ("answer", 3, 0)], 4, 1.0)])
    two_visits = two_visits.replace(
        boundary_scores=torch.tensor([[-3.0, -2.0, -0.5, float("nan")]]))  # IG 1.0, 1.5
    adv, metrics = igpo_turn_advantages(turn_rewards(two_visits, RewardConfig()),
                                        two_visits.group_ids)
    r1, r2 = z(1.0, 1.25, 0.0625), z(1.5, 1.25, 0.0625)  # ~ -1, +1
    scale = 0.3 / ((abs(r1) + abs(r2)) / 2 + 1e-6)  # mean|o~| = 0 is floored at 0.3
    assert metrics["ig_scale"] == pytest.approx(scale, rel=1e-5)
    visit2 = scale * r2 + 0.95 * 0.0
    assert adv[0].tolist() == pytest.approx([scale * r1 + 0.95 * visit2, visit2, 0.0], abs=1e-6)
    assert adv[0, 0].item() == pytest.approx(-0.015, abs=1e-4)


def test_zero_information_gain_leaves_discounted_outcome():
    records = [synthetic_record([("visit",), ("visit",), ("answer", 3, 0)], 0, o, seed=i)
               for i, o in enumerate((1.0, 0.0))]
    scores = torch.tensor([[-2.0, -2.0, -2.0, float("nan")]] * 2)  # IG = 0 everywhere
    batch = collate(records).replace(boundary_scores=scores)
    adv, metrics = igpo_turn_advantages(turn_rewards(batch, RewardConfig()), batch.group_ids)
    assert metrics["ig_scale"] == pytest.approx(10.0)  # mean|r~| = 0 -> capped, times 0
    o = z(1, 0.5, 0.25)
    assert adv[0, :3].tolist() == pytest.approx([0.95**2 * o, 0.95 * o, o], abs=1e-6)
    assert adv[1, :3].tolist() == pytest.approx([-(0.95**2) * o, -0.95 * o, -o], abs=1e-6)


def test_trajectories_without_browse_turns_share_the_outcome():
    records = [synthetic_record([("search",), ("search",), ("answer", 3, 0)], 0, o, seed=i)
               for i, o in enumerate((1.0, 0.0))]
    batch = collate(records)  # no boundary_scores needed: no IG turn anywhere
    adv, metrics = igpo_turn_advantages(turn_rewards(batch, RewardConfig()), batch.group_ids)
    o = z(1, 0.5, 0.25)
    assert adv[0].tolist() == pytest.approx([o] * 3, abs=1e-6)
    assert adv[1].tolist() == pytest.approx([-o] * 3, abs=1e-6)
    assert "ig_scale" in metrics and metrics["ig_scale"] == 1.0


def test_format_failure_on_final_turn_replaces_the_outcome():
    batch = _two_rollout_group(final_ok=(True, False))  # B's answer is malformed
    rewards = turn_rewards(batch, RewardConfig(format_penalty=1.0))
    assert rewards.reward[1, 2].item() == -1.0
    adv, _ = igpo_turn_advantages(rewards, batch.group_ids, "separate", 0.95)
    # outcomes {1, -1}: mean 0, pop var 1
    assert adv[0, 2].item() == pytest.approx(z(1, 0, 1), abs=1e-6)
    assert adv[1, 2].item() == pytest.approx(z(-1, 0, 1), abs=1e-6)


def test_token_broadcast_reaches_policy_tokens_only():
    batch = _two_rollout_group()
    algorithm = make_algorithm("igpo")
    tokens = algorithm.advantages(batch, algorithm.turn_rewards(batch)).tokens
    assert tokens.shape == batch.input_ids.shape
    assert (tokens[~batch.loss_mask] == 0).all()  # question, headers and tool replies
    turn_adv, _ = igpo_turn_advantages(turn_rewards(batch, RewardConfig()), batch.group_ids)
    for row in range(2):
        for pos in batch.loss_mask[row].nonzero().flatten().tolist():
            assert tokens[row, pos] == turn_adv[row, batch.turn_index[row, pos]]
    direct = broadcast_turn_advantages(turn_adv, batch.turn_index, batch.loss_mask)
    assert torch.equal(direct, tokens)


def test_igpo_algorithm_uses_its_config():
    batch = _two_rollout_group()
    rewards = turn_rewards(batch, RewardConfig())
    default = make_algorithm("igpo").advantages(batch, rewards).tokens
    undiscounted = make_algorithm("igpo", IGPOConfig(gamma=0.0)).advantages(batch, rewards).tokens
    assert not torch.allclose(default, undiscounted)


def test_grpo_and_rloo_hand_numbers():
    outcome = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.7])
    groups = torch.tensor([0, 0, 0, 0, 1])
    assert grpo_advantages(outcome, groups).tolist() == pytest.approx(
        [z(1, .5, .25), z(0, .5, .25), z(0, .5, .25), z(1, .5, .25), 0.0], abs=1e-6)
    # RLOO: o_i - mean of the other three; a group of one has no baseline -> 0
    assert rloo_advantages(outcome, groups).tolist() == pytest.approx(
        [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3, 0.0], abs=1e-6)


def test_isolated_penalties_leave_the_discount_chain():
    C, G, P, OUT = (int(r) for r in (TurnRole.CARRIER, TurnRole.INFO_GAIN, TurnRole.PENALTY,
                                   TurnRole.OUTCOME))
    role = torch.tensor([[C, G, C, P, G, OUT, -1]])
    values = torch.tensor([[9.0, 1.0, 9.0, -2.0, 0.5, 3.0, 9.0]])
    a5 = 3.0
    a4 = 0.5 + 0.5 * a5  # 2.0
    a3 = -2.0  # its own penalty only
    a1 = 1.0 + 0.5 * a4  # 2.0: the chain skips the penalty turn
    out = discounted_turn_advantages(values, role, gamma=0.5, isolate_penalties=True)
    assert out[0].tolist() == pytest.approx([a1, a1, a4, a3, a4, a5, 0.0])


def _penalty_above_the_igs():
    """A: visit (IG -3), malformed, answer (outcome 1); B: visit, visit (IG -0.5 each),
    answer (outcome 0). The pooled turn rewards {-3, -1, -0.5, -0.5} have mean -1.25, so
    the penalty's z-score is positive."""
    records = [
        synthetic_record([("visit",), ("invalid", 3, 4, False), ("answer",)], 0, 1.0, seed=1),
        synthetic_record([("visit",), ("visit",), ("answer",)], 0, 0.0, seed=2),
    ]
    nan = float("nan")
    scores = torch.tensor([[-1.0, -4.0, nan, nan], [-1.0, -1.5, -2.0, nan]])
    return collate(records).replace(boundary_scores=scores)


def test_format_isolation_hand_worked():
    batch = _penalty_above_the_igs()
    o_a, o_b = z(1, 0.5, 0.25), z(0, 0.5, 0.25)
    var = ((-1.75) ** 2 + 0.25 ** 2 + 2 * 0.75 ** 2) / 4  # 1.0625
    r_ig_a, r_pen, r_ig_b = z(-3, -1.25, var), z(-1, -1.25, var), z(-0.5, -1.25, var)
    assert r_pen > 0.2

    paper = make_algorithm("igpo", IGPOConfig(normalization="separate", format_isolated=False))
    rewards = paper.turn_rewards(batch)
    tokens, metrics = paper.advantages(batch, rewards)
    turn_adv, _ = igpo_turn_advantages(rewards, batch.group_ids, "separate", 0.95)
    pen = r_pen + 0.95 * o_a  # the paper's chain: the malformed turn inherits the answer
    assert turn_adv[0, :3].tolist() == pytest.approx([r_ig_a + 0.95 * pen, pen, o_a], abs=1e-5)
    assert metrics["malformed_positive_fraction"] == 1.0
    malformed_tokens = batch.loss_mask & (batch.turn_index == 1)
    assert (tokens[0][malformed_tokens[0]] > 0).all()

    isolated = make_algorithm("igpo", IGPOConfig(normalization="separate"))  # the default
    assert isolated.config.format_isolated
    turn_adv, metrics = igpo_turn_advantages(rewards, batch.group_ids, "separate", 0.95,
                                             format_isolated=True)
    b1 = r_ig_b + 0.95 * o_b
    assert turn_adv[0, :3].tolist() == pytest.approx([r_ig_a + 0.95 * o_a, 0.0, o_a], abs=1e-5)
    assert turn_adv[1, :3].tolist() == pytest.approx([r_ig_b + 0.95 * b1, b1, o_b], abs=1e-5)
    tokens, metrics = isolated.advantages(batch, rewards)
    assert metrics["malformed_positive_fraction"] == 0.0
    assert (tokens[0][malformed_tokens[0]] == 0).all()


def test_format_isolation_keeps_an_ordinary_penalty_and_clamps_a_malformed_answer():
    # IGs above the penalty: its z-score is negative and kept as it is; the valid visit
    # before it no longer collects it.
    records = [
        synthetic_record([("visit",), ("invalid", 3, 4, False), ("answer",)], 0, 0.0, seed=1),
        synthetic_record([("visit",), ("visit",), ("answer", 3, 0, False)], 0, 0.0, seed=2),
    ]
    nan = float("nan")
    scores = torch.tensor([[-3.0, -2.0, nan, nan], [-3.0, -2.0, -1.0, nan]])  # IG 1, 1, 1
    batch = collate(records).replace(boundary_scores=scores)
    rewards = turn_rewards(batch, RewardConfig())
    adv, _ = igpo_turn_advantages(rewards, batch.group_ids, "separate", 0.95,
                                  format_isolated=True,
                                  malformed=batch.turn_valid & ~batch.turn_format_ok)
    var = 3 * 0.5 ** 2 / 4 + 1.5 ** 2 / 4  # pool {1, -1, 1, 1}: mean 0.5
    r_ig, r_pen = z(1, 0.5, var), z(-1, 0.5, var)
    o_a, o_b = z(0, -0.5, 0.25), z(-1, -0.5, 0.25)  # B's malformed answer scores -1
    assert adv[0, :3].tolist() == pytest.approx([r_ig + 0.95 * o_a, r_pen, o_a], abs=1e-5)
    b1 = r_ig + 0.95 * o_b
    assert adv[1, :3].tolist() == pytest.approx([r_ig + 0.95 * b1, b1, o_b], abs=1e-5)
    assert adv[1, 2] < 0 and adv[0, 1] < 0


def test_turn_reward_magnitude_is_logged_before_the_ig_scale():
    batch = _two_rollout_group()
    rewards = turn_rewards(batch, RewardConfig())
    _, metrics = igpo_turn_advantages(rewards, batch.group_ids, "scaled_separate", 0.95)
    r = [z(2.0, 1.0, 0.5), z(0.5, 1.0, 0.5)]
    before = (abs(r[0]) + 2 * abs(r[1])) / 3
    assert metrics["turn_reward_z_abs_mean"] == pytest.approx(before, rel=1e-5)
    assert metrics["turn_reward_scaled_abs_mean"] == pytest.approx(
        metrics["ig_scale"] * before, rel=1e-5)
    # after the scale the magnitude is mean|o~| by construction; before it, it is not
    assert metrics["turn_reward_scaled_abs_mean"] == pytest.approx(
        metrics["outcome_z_abs_mean"], rel=1e-4)
    assert metrics["turn_reward_z_abs_mean"] != pytest.approx(metrics["outcome_z_abs_mean"],
                                                              rel=1e-2)
