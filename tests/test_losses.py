"""Policy losses against hand-worked numbers; NaN/inf must raise."""

import math

import pytest
import torch

from trainers.algorithms.losses import (
    LossConfig,
    aggregate,
    kl_k3,
    ppo_loss,
    turn_token_weights,
)
from trainers.modeling.logprobs import shifted_token_logprobs

NO_KL = LossConfig(kl_coef=0.0)


def four_tokens():
    """ratio = exp(logp - old): 1.5, 5, 0.5, 1 with advantages +1, -1, -1, +2."""
    old = torch.zeros(1, 4)
    logp = torch.tensor([[math.log(1.5), math.log(5.0), math.log(0.5), 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, -1.0, 2.0]])
    return logp, old, adv, torch.ones(1, 4, dtype=torch.bool)


def test_clipped_surrogate_with_dual_clip_hand_numbers():
    logp, old, adv, mask = four_tokens()
    loss, metrics = ppo_loss(logp, old, adv, mask, NO_KL)
    # per token: max(-1.5, -1.2) = -1.2 | max(5, 1.2) = 5 -> dual clip min(5, 3) = 3
    #            max(0.5, 0.8) = 0.8   | -2
    assert loss.item() == pytest.approx((-1.2 + 3.0 + 0.8 - 2.0) / 4)
    assert metrics["clip_fraction"] == pytest.approx(0.5)  # tokens 1 and 3 take the clip
    assert metrics["dual_clip_fraction"] == pytest.approx(0.25)
    assert metrics["ratio_max"] == pytest.approx(5.0, rel=1e-6)
    assert metrics["ratio_min"] == pytest.approx(0.5, rel=1e-6)
    loss.backward()
    # clipped and dual-clipped tokens carry no gradient; d(-A * ratio)/dlogp = -2 * 1 / 4
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, 0.0, -0.5])


def test_without_dual_clip_the_negative_advantage_loss_is_unbounded():
    logp, old, adv, mask = four_tokens()
    loss, metrics = ppo_loss(logp, old, adv, mask, LossConfig(kl_coef=0.0, dual_clip=None))
    assert loss.item() == pytest.approx((-1.2 + 5.0 + 0.8 - 2.0) / 4)
    assert "dual_clip_fraction" not in metrics


def test_clip_higher():
    logp, old, adv, mask = four_tokens()
    loss, _ = ppo_loss(logp, old, adv, mask, LossConfig(kl_coef=0.0, clip_ratio_high=0.28))
    assert loss.item() == pytest.approx((-1.28 + 3.0 + 0.8 - 2.0) / 4)


def test_negative_advantages_are_weighted_before_the_surrogate():
    logp, old, adv, mask = four_tokens()
    loss, _ = ppo_loss(logp, old, adv, mask, LossConfig(kl_coef=0.0,
                                                        negative_advantage_weight=0.5))
    # as the hand numbers above with A = -0.5 on tokens 1 and 2: token 1's ratio 5 is
    # dual-clipped at -A * 3 = 1.5, token 2's max(0.25, 0.4) = 0.4
    assert loss.item() == pytest.approx((-1.2 + 1.5 + 0.4 - 2.0) / 4)
    halved, _ = ppo_loss(logp, old, torch.where(adv < 0, adv * 0.5, adv), mask, NO_KL)
    assert loss.item() == pytest.approx(halved.item())
    logp = torch.zeros(1, 4, requires_grad=True)  # ratio 1: every token carries gradient
    off, _ = ppo_loss(logp, old, adv, mask, LossConfig(kl_coef=0.0,
                                                       negative_advantage_weight=0.0))
    off.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.25, 0.0, 0.0, -0.5])


@pytest.mark.parametrize("weight", [-0.1, float("nan"), float("inf")])
def test_a_bad_negative_advantage_weight_is_refused(weight):
    with pytest.raises(ValueError, match="negative_advantage_weight must be a finite number"):
        LossConfig(negative_advantage_weight=weight)


def test_masked_positions_are_ignored_even_if_nan():
    logp, old, adv, mask = four_tokens()
    mask = torch.tensor([[True, False, False, True]])
    poisoned = logp.detach().clone()
    poisoned[0, 1] = float("nan")
    loss, _ = ppo_loss(poisoned.requires_grad_(), old, adv, mask, NO_KL)
    assert loss.item() == pytest.approx((-1.2 - 2.0) / 2)


@pytest.mark.parametrize("field", ["logprobs", "old_logprobs", "advantages"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_inputs_on_policy_tokens_raise(field, bad):
    logp, old, adv, mask = four_tokens()
    inputs = {"logprobs": logp.detach().clone(), "old_logprobs": old.clone(),
              "advantages": adv.clone()}
    inputs[field][0, 2] = bad
    with pytest.raises(FloatingPointError, match=field):
        ppo_loss(inputs["logprobs"], inputs["old_logprobs"], inputs["advantages"], mask, NO_KL)


def test_k3_kl_hand_number_and_term():
    logp, old = torch.zeros(1, 2), torch.zeros(1, 2)
    ref = torch.full((1, 2), math.log(2.0))
    assert kl_k3(logp, ref)[0].tolist() == pytest.approx([2 - math.log(2) - 1] * 2)
    adv, mask = torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool)
    base, _ = ppo_loss(logp, old, adv, mask, NO_KL)
    loss, metrics = ppo_loss(logp, old, adv, mask, LossConfig(kl_coef=0.5), ref_logprobs=ref)
    assert metrics["kl"] == pytest.approx(0.306853, abs=1e-6)
    assert loss.item() == pytest.approx(base.item() + 0.5 * 0.306853, abs=1e-6)
    assert kl_k3(torch.zeros(3), torch.zeros(3)).abs().max().item() == 0.0


def test_kl_max_caps_a_collapsed_tokens_term_and_its_gradient():
    # One token 20 nats below the reference: uncapped, its k3 gradient is exp(20) - 1.
    logp = torch.tensor([[-20.0, -1.0]], requires_grad=True)
    ref = torch.zeros(1, 2)
    kl_k3(logp, ref).sum().backward()
    assert logp.grad[0, 0].item() == pytest.approx(-(math.exp(20.0) - 1.0), rel=1e-4)
    logp.grad = None
    adv, mask = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    loss, metrics = ppo_loss(logp, logp.detach(), adv, mask,
                             LossConfig(kl_coef=1.0, kl_max=10.0), ref_logprobs=ref)
    # The capped term: token mean of 10 and e - 2; the capped token takes no gradient, the
    # other its uncapped one (over the 2 tokens of the mean).
    assert loss.item() == pytest.approx((10.0 + math.e - 2.0) / 2)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -(math.e - 1.0) / 2])
    # The logged KL stays the true one, so the collapsed token still shows.
    assert metrics["kl"] == pytest.approx((math.exp(20.0) - 21.0 + math.e - 2.0) / 2, rel=1e-4)
    assert metrics["kl_capped_fraction"] == 0.5
    with pytest.raises(ValueError, match="kl_max"):
        LossConfig(kl_max=0.0)


def test_kl_is_skipped_at_coefficient_zero():
    logp, old, adv, mask = four_tokens()
    nan_ref = torch.full((1, 4), float("nan"))  # would raise if the KL were computed
    loss, metrics = ppo_loss(logp, old, adv, mask, NO_KL, ref_logprobs=nan_ref)
    assert "kl" not in metrics and math.isfinite(loss.item())
    with pytest.raises(ValueError, match="ref_logprobs"):
        ppo_loss(logp, old, adv, mask, LossConfig(kl_coef=0.001))


def test_truncated_importance_sampling_weight():
    logp, old, adv = torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, 1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    # old / engine = 3 (capped to 2) and 0.5 (kept)
    engine = torch.tensor([[-math.log(3.0), math.log(2.0)]])
    loss, metrics = ppo_loss(logp, old, adv, mask, LossConfig(kl_coef=0.0, tis_cap=2.0),
                             engine_logprobs=engine)
    assert loss.item() == pytest.approx((-1.0 * 2.0 - 1.0 * 0.5) / 2, rel=1e-6)
    assert metrics["tis_weight_mean"] == pytest.approx(1.25, rel=1e-6)
    with pytest.raises(ValueError, match="engine_logprobs"):
        ppo_loss(logp, old, adv, mask, LossConfig(kl_coef=0.0, tis_cap=2.0))


def test_token_mean_and_seq_mean():
    values = torch.tensor([[4.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(10 / 4)
    # seq-mean: rows with tokens only: (4 + 2) / 2
    assert aggregate(values, mask, "seq-mean").item() == pytest.approx(3.0)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)  # verl's name


def test_turn_weight_cap_hand_numbers():
    # row 0: turn 0 has 2 tokens, turn 1 has 5 (a long, cut-off turn); row 1: one turn of 3
    turn_index = torch.tensor([[-1, 0, 0, -1, 1, 1, 1, 1, 1], [-1, 0, 0, 0, -1, -1, -1, -1, -1]])
    mask = turn_index >= 0
    weights = turn_token_weights(turn_index, mask, cap=2)
    assert weights[0].tolist() == pytest.approx([0, 1, 1, 0, 0.4, 0.4, 0.4, 0.4, 0.4])
    assert weights[1].tolist() == pytest.approx([0, 2 / 3, 2 / 3, 2 / 3, 0, 0, 0, 0, 0])

    # In the loss: ratio 1 everywhere, so the per-token loss is -A; token-mean keeps its
    # denominator (10 policy tokens): turn 1 counts as 2 tokens, not 5.
    advantages = torch.tensor([[0.0, 1.0, 1.0, 0.0, -1.0, -1.0, -1.0, -1.0, -1.0],
                               [0.0, 1.0, 1.0, 1.0, 0, 0, 0, 0, 0]])
    logp = torch.zeros(2, 9)
    plain, _ = ppo_loss(logp, logp, advantages, mask, NO_KL)
    assert plain.item() == pytest.approx((-2 + 5 - 3) / 10)
    capped, metrics = ppo_loss(logp, logp, advantages, mask, NO_KL, token_weights=weights)
    assert capped.item() == pytest.approx((-2 + 5 * 0.4 - 3 * 2 / 3) / 10)
    assert metrics["token_weight_mean"] == pytest.approx((2 + 2 + 2) / 10)
    with pytest.raises(ValueError, match="turn_weight_cap"):
        LossConfig(turn_weight_cap=0)


def test_algorithm_loss_applies_the_turn_weight_cap():
    from tests.helpers import synthetic_record
    from trainers.algorithms import IGPOConfig, make_algorithm
    from trainers.batch import collate

    batch = collate([synthetic_record([("search", 2), ("invalid", 6, 4, False), ("answer", 2)])])
    advantages = torch.where(batch.loss_mask, 1.0, 0.0)
    batch = batch.replace(advantages=advantages, old_logprobs=torch.zeros(batch.input_ids.shape))
    logprobs = torch.zeros(batch.input_ids.shape)
    loss_config = LossConfig(kl_coef=0.0, turn_weight_cap=3)
    loss, _ = make_algorithm("igpo", IGPOConfig(loss=loss_config)).loss(batch, logprobs)
    assert loss.item() == pytest.approx(-(2 + 3 + 2) / 10)  # the 6-token turn counts as 3


def test_entropy_bonus_and_metric():
    logp, old, adv = torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    entropy = torch.tensor([[1.0, 3.0]])
    base, _ = ppo_loss(logp, old, adv, mask, NO_KL, entropy=entropy)
    loss, metrics = ppo_loss(logp, old, adv, mask, LossConfig(kl_coef=0.0, entropy_coef=0.1),
                             entropy=entropy)
    assert metrics["entropy"] == pytest.approx(2.0)
    assert loss.item() == pytest.approx(base.item() - 0.2)
    with pytest.raises(ValueError, match="entropy"):
        ppo_loss(logp, old, adv, mask, LossConfig(kl_coef=0.0, entropy_coef=0.1))


def test_shifted_token_logprobs_alignment():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [1 / 3] * 3]]))
    ids = torch.tensor([[0, 1, 2]])
    logprobs, entropy = shifted_token_logprobs(logits, ids)
    # token 1 is predicted by position 0, token 2 by position 1
    assert logprobs[0].tolist() == pytest.approx([0.0, math.log(0.25), math.log(0.8)], abs=1e-6)
    h0 = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    h1 = -(2 * 0.1 * math.log(0.1) + 0.8 * math.log(0.8))
    assert entropy[0].tolist() == pytest.approx([0.0, h0, h1], abs=1e-6)
