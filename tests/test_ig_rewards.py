"""Turn rewards: browse-aware IG assignment, probe slots, format penalty, outcome."""

import math

import pytest
import torch

from tests.helpers import synthetic_record
from trainers.algorithms.rewards import (
    RewardConfig,
    TurnRole,
    distractor_answers,
    ig_reference_slots,
    outcome_rewards,
    probe_slots,
    turn_reward_metrics,
    turn_rewards,
)
from trainers.batch import collate

C, G, P, OUT = (int(r) for r in (TurnRole.CARRIER, TurnRole.INFO_GAIN, TurnRole.PENALTY,
                               TurnRole.OUTCOME))
NAN = float("nan")


def mixed_batch(outcome=1.0, final_ok=True):
    """Turns: 0 search, 1 visit, 2 search, 3 malformed, 4 visit, 5 search, 6 answer."""
    turns = [("search",), ("visit",), ("search",), ("invalid", 3, 4, False), ("visit",),
             ("search",), ("answer", 3, 0, final_ok)]
    return collate([synthetic_record(turns, group_id=0, outcome=outcome)])


def test_browse_aware_slots_and_rewards():
    batch = mixed_batch()
    config = RewardConfig()  # browse-aware, log IG, penalty 1
    # IG turns 1 and 4; turn 1 is measured from the question (slot 0), turn 4 from the end
    # of turn 1 (slot 2): slots 0, 2 and 5 are probed.
    assert probe_slots(batch, config)[0].nonzero().flatten().tolist() == [0, 2, 5]
    assert ig_reference_slots(batch, config)[0, [1, 4]].tolist() == [0, 2]
    scores = torch.tensor([[-4.0, NAN, -3.0, NAN, NAN, -1.0, NAN, NAN]])
    rewards = turn_rewards(batch.replace(boundary_scores=scores), config)
    assert rewards.role[0].tolist() == [C, G, C, P, G, C, OUT]
    assert rewards.reward[0].tolist() == [0.0, 1.0, 0.0, -1.0, 2.0, 0.0, 1.0]
    ig = rewards.information_gain[0]
    assert ig[[1, 4]].tolist() == [1.0, 2.0] and torch.isnan(ig[[0, 2, 3, 5, 6]]).all()
    # IG telescopes under browse-aware assignment: s(last browse) - s(question)
    assert ig[[1, 4]].sum().item() == scores[0, 5].item() - scores[0, 0].item()


def test_plain_assignment_uses_the_previous_turn():
    batch = mixed_batch()
    config = RewardConfig(browse_aware=False)
    assert probe_slots(batch, config)[0].tolist() == [True] * 7 + [False]
    scores = torch.tensor([[-5.0, -4.5, -4.0, -3.0, -2.9, -2.0, -1.0, NAN]])
    rewards = turn_rewards(batch.replace(boundary_scores=scores), config)
    assert rewards.role[0].tolist() == [G, G, G, P, G, G, OUT]
    # turn 4 is measured from the end of the malformed turn 3, not from turn 2
    assert rewards.reward[0].tolist() == pytest.approx([0.5, 0.5, 1.0, -1.0, 0.9, 1.0, 1.0])


def test_probability_information_gain():
    batch = mixed_batch()
    scores = torch.tensor([[-4.0, NAN, -3.0, NAN, NAN, -1.0, NAN, NAN]])
    rewards = turn_rewards(batch.replace(boundary_scores=scores), RewardConfig(ig_kind="prob"))
    assert rewards.reward[0, 1].item() == pytest.approx(math.exp(-3) - math.exp(-4))
    assert rewards.reward[0, 4].item() == pytest.approx(math.exp(-1) - math.exp(-3))


def test_format_penalty_scale_and_malformed_final_turn():
    batch = mixed_batch(outcome=1.0, final_ok=False)
    scores = torch.tensor([[-4.0, NAN, -3.0, NAN, NAN, -1.0, NAN, NAN]])
    rewards = turn_rewards(batch.replace(boundary_scores=scores),
                           RewardConfig(format_penalty=0.5))
    assert rewards.reward[0, 3].item() == -0.5  # malformed middle turn
    assert rewards.reward[0, 6].item() == -0.5  # malformed answer replaces outcome 1.0
    assert rewards.role[0, 6].item() == OUT


def test_missing_scores_raise_with_the_fix():
    batch = mixed_batch()
    with pytest.raises(ValueError, match="score_batch"):
        turn_rewards(batch, RewardConfig())
    scores = torch.tensor([[-4.0, NAN, NAN, NAN, NAN, -1.0, NAN, NAN]])  # slot 2 missing
    with pytest.raises(ValueError, match="turn 1: probe score missing"):
        turn_rewards(batch.replace(boundary_scores=scores), RewardConfig())


def test_browse_kinds_are_configurable():
    batch = mixed_batch()
    config = RewardConfig(browse_kinds=("search", "visit"))  # every valid tool turn
    assert probe_slots(batch, config)[0].nonzero().flatten().tolist() == [0, 1, 2, 3, 5, 6]
    with pytest.raises(ValueError, match="unknown turn kind"):
        RewardConfig(browse_kinds=("browse",))


def test_metrics_per_turn_kind():
    batch = mixed_batch()
    scores = torch.tensor([[-4.0, NAN, -3.0, NAN, NAN, -1.0, NAN, NAN]])
    batch = batch.replace(boundary_scores=scores)
    metrics = turn_reward_metrics(batch, turn_rewards(batch, RewardConfig()))
    assert metrics["format_error_rate"] == pytest.approx(1 / 7)
    assert metrics["format_error_rate_final"] == 0.0
    assert metrics["ig/visit_mean"] == pytest.approx(1.5)
    assert metrics["ig/visit_std"] == pytest.approx(0.5)
    assert metrics["ig/visit_count"] == 2.0
    assert "ig/search_mean" not in metrics


def test_outcome_rewards_put_the_raw_outcome_on_the_last_turn_only():
    """The outcome-only algorithms' rewards: no IG, no format penalty (even on a malformed
    final turn), every earlier turn a carrier; `outcome` reads the OUTCOME turn back."""
    batch = collate([synthetic_record([("search",), ("search",), ("answer", 3, 0, False)],
                                      group_id=0, outcome=0.7),
                     synthetic_record([("answer",)], group_id=0, outcome=1.0)])
    rewards = outcome_rewards(batch)
    assert rewards.role.tolist() == [[C, C, OUT], [OUT, -1, -1]]
    assert torch.equal(rewards.reward, torch.tensor([[0, 0, 0.7], [1.0, 0, 0]]))
    assert torch.equal(rewards.outcome, batch.outcome)
    assert torch.isnan(rewards.information_gain).all()
    # IGPO's rewards of the same batch (no browse turn, so no IG): the malformed final
    # turn gets the penalty instead.
    assert turn_rewards(batch, RewardConfig()).outcome.tolist() == [-1.0, 1.0]


def test_previous_turn_baseline_measures_each_visit_from_the_turn_before_it():
    batch = mixed_batch()
    config = RewardConfig(ig_baseline="previous_turn")
    # IG turns 1 and 4, measured from slots 1 (end of turn 0) and 4 (end of turn 3)
    assert ig_reference_slots(batch, config)[0, [1, 4]].tolist() == [1, 4]
    assert probe_slots(batch, config)[0].nonzero().flatten().tolist() == [1, 2, 4, 5]
    scores = torch.tensor([[NAN, -3.5, -3.0, NAN, -2.5, -1.0, NAN, NAN]])
    rewards = turn_rewards(batch.replace(boundary_scores=scores), config)
    assert rewards.reward[0].tolist() == [0.0, 0.5, 0.0, -1.0, 1.5, 0.0, 1.0]


def test_ig_baseline_options_are_checked():
    with pytest.raises(ValueError, match="ig_baseline"):
        RewardConfig(ig_baseline="question-only")
    with pytest.raises(ValueError, match="ig_kind 'log'"):
        RewardConfig(ig_baseline="contrastive", ig_kind="prob")
    with pytest.raises(ValueError, match="ig_distractors"):
        RewardConfig(ig_distractors=0)


def test_distractor_answers_are_other_groups_first_answers():
    answers = [["Paris", "paris city"], ["Paris"], ["1990"], ["1990"], ["Rome"], ["PARIS "]]
    group_ids = torch.tensor([0, 0, 1, 1, 2, 3])
    assert distractor_answers(answers, group_ids, count=4) == [
        ["1990", "Rome"],  # group 3's "PARIS " is a gold answer of the row: skipped
        ["1990", "Rome"],
        ["Rome", "PARIS "],  # from the group after its own, wrapping around
        ["Rome", "PARIS "],
        ["PARIS ", "1990"],  # group 0's "Paris" is the same answer again: skipped
        ["1990", "Rome"],
    ]
    assert distractor_answers(answers, group_ids, count=1)[2] == ["Rome"]
    assert distractor_answers([["a"], ["a"]], torch.tensor([0, 0]), 4) == [[], []]


def test_igpo_asks_for_distractors_only_when_contrastive():
    from trainers.algorithms import IGPOConfig, make_algorithm

    batch = collate([synthetic_record([("visit",), ("answer",)], group_id=g) for g in (0, 1)])
    answers = [["x"], ["y"]]
    assert make_algorithm("igpo").probe_distractors(batch, answers) is None
    contrastive = make_algorithm("igpo", IGPOConfig(reward=RewardConfig(
        ig_baseline="contrastive")))
    assert contrastive.probe_distractors(batch, answers) == [["y"], ["x"]]
    assert make_algorithm("grpo").probe_distractors(batch, answers) is None
