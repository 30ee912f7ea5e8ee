"""The algorithm registry, a toy algorithm added from this single file, and one end-to-end
IGPO step on a tiny model (probe pass -> turn rewards -> advantages -> loss -> backward)."""

from dataclasses import dataclass, field

import pytest
import torch

from tests.helpers import synthetic_record
from trainers.algorithms import (
    Advantages,
    Algorithm,
    IGPOConfig,
    Placebo,
    PolicyGradientConfig,
    available_algorithms,
    make_algorithm,
    placebo_signs,
    register_algorithm,
)
from trainers.algorithms.information_gain import score_batch
from trainers.algorithms.losses import LossConfig
from trainers.algorithms.probes import ProbeTemplate
from trainers.batch import collate
from trainers.modeling.logprobs import shifted_token_logprobs
from trainers.modeling.models import tiny_causal_lm

pytestmark = pytest.mark.usefixtures("single_thread")


# --- a toy algorithm, added exactly as docs/algorithms.md describes -------------------
@dataclass
class ConstantConfig(PolicyGradientConfig):
    value: float = field(default=0.5, metadata={"help": "advantage given to every token"})


@register_algorithm("toy_constant")
class ConstantAdvantage(Algorithm):
    """Every policy token gets the same advantage (useless, but easy to check)."""

    config_class = ConstantConfig

    def advantages(self, batch, rewards):
        tokens = torch.where(batch.loss_mask, self.config.value, 0.0)
        return Advantages(tokens, {"toy_value": self.config.value})


def small_batch():
    records = [
        synthetic_record([("search",), ("visit", 4, 6), ("answer", 3, 0)], 0, 1.0, seed=1),
        synthetic_record([("visit", 4, 6), ("invalid", 3, 4, False), ("answer", 3, 0)], 0, 0.0,
                         seed=2),
        synthetic_record([("visit", 3, 5), ("answer", 3, 0, False)], 1, 0.0, seed=3),
    ]
    return collate(records)


def test_registry_lists_the_shipped_algorithms_and_the_toy():
    assert {"igpo", "grpo", "rloo", "toy_constant"} <= set(available_algorithms())
    with pytest.raises(KeyError, match="registered"):
        make_algorithm("ppo_from_the_future")
    with pytest.raises(ValueError, match="already registered"):
        @register_algorithm("grpo")
        class Impostor(Algorithm):
            pass
    with pytest.raises(TypeError, match="IGPOConfig"):
        make_algorithm("igpo", LossConfig())


def test_toy_algorithm_runs_through_the_generic_loss():
    batch = small_batch()
    algorithm = make_algorithm("toy_constant", ConstantConfig(value=2.0, loss=LossConfig(kl_coef=0)))
    advantages, metrics = algorithm.advantages(batch, algorithm.turn_rewards(batch))
    assert metrics == {"toy_value": 2.0}
    assert torch.equal(advantages[batch.loss_mask], torch.full((int(batch.loss_mask.sum()),), 2.0))
    old = torch.zeros(batch.input_ids.shape)
    batch = batch.replace(advantages=advantages, old_logprobs=old)
    logprobs = torch.zeros(batch.input_ids.shape, requires_grad=True)
    loss, loss_metrics = algorithm.loss(batch, logprobs)
    assert loss.item() == pytest.approx(-2.0)  # -A * ratio with ratio 1, token-mean
    assert loss_metrics["clip_fraction"] == 0.0


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_outcome_only_algorithms_broadcast_per_trajectory(name):
    batch = small_batch()
    algorithm = make_algorithm(name)
    tokens, _ = algorithm.advantages(batch, algorithm.turn_rewards(batch))
    for row in range(batch.batch_size):
        values = tokens[row][batch.loss_mask[row]].unique()
        assert len(values) == 1  # one advantage for the whole trajectory
        assert (tokens[row][~batch.loss_mask[row]] == 0).all()
    assert tokens[2].abs().max() == 0  # alone in its group: no baseline, no signal
    assert tokens[0, batch.loss_mask[0]][0] > 0 > tokens[1, batch.loss_mask[1]][0]


def test_loss_requires_advantages():
    batch = small_batch()
    with pytest.raises(ValueError, match="advantages"):
        make_algorithm("grpo").loss(batch, torch.zeros(batch.input_ids.shape))


def test_igpo_end_to_end_on_a_tiny_model():
    torch.manual_seed(0)
    model = tiny_causal_lm("qwen3", vocab_size=256, hidden_size=32, num_layers=1)
    batch = small_batch()
    template = ProbeTemplate(generation_prompt_ids=(1, 2), prefix_ids=(3, 4, 5), suffix_ids=(6, 0))
    probes = [[template.probe_for_ids([10, 11], "a"), template.probe_for_ids([12], "b")]] * 3
    algorithm = make_algorithm("igpo", IGPOConfig(loss=LossConfig(kl_coef=0.01)))
    assert algorithm.needs_probe_scores

    batch = score_batch(model, batch, probes, algorithm.probe_slots(batch))
    rewards = algorithm.turn_rewards(batch)
    advantages, adv_metrics = algorithm.advantages(batch, rewards)
    assert adv_metrics["ig/visit_count"] == 3.0 and "ig_scale" in adv_metrics
    batch = batch.replace(advantages=advantages, ref_logprobs=batch.old_logprobs.clone())

    logits = model(batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    logprobs, entropy = shifted_token_logprobs(logits, batch.input_ids)
    loss, metrics = algorithm.loss(batch, logprobs, entropy)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    # same policy as the probe pass: ratios are 1 and the KL to the copy is 0
    assert metrics["ratio_min"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)
    for key in ("clip_fraction", "entropy", "dual_clip_fraction"):
        assert key in metrics
    # Batch diagnostics come once per step with the advantages, not per micro-batch loss.
    for key in ("ig/visit_mean", "format_error_rate", "format_error_rate_final"):
        assert key in adv_metrics and key not in metrics
    assert adv_metrics["format_error_rate"] == pytest.approx(2 / 8)


def many_trajectories(n=16):
    return collate([synthetic_record([("visit",), ("answer", 3, 0)], group_id=i // 4,
                                     outcome=float(i % 2), seed=100 + i) for i in range(n)])


@pytest.mark.parametrize("name", ["toy_constant", "grpo", "igpo"])
def test_placebo_flips_whole_trajectories_by_a_seeded_sign(name):
    batch = many_trajectories()
    batch = batch.replace(boundary_scores=torch.tensor([[-2.0, -1.0, float("nan")]] * 16))
    config = make_algorithm(name).config_class(placebo=True, placebo_seed=3)
    placebo = make_algorithm(name, config)
    assert isinstance(placebo, Placebo) and placebo.inner.name == name
    assert placebo.needs_probe_scores == (name == "igpo")
    real_config = make_algorithm(name).config_class()
    real = make_algorithm(name, real_config)
    rewards = real.turn_rewards(batch)
    real_tokens, _ = real.advantages(batch, rewards)
    tokens, metrics = placebo.advantages(batch, placebo.turn_rewards(batch))
    signs = placebo_signs(batch, 3)
    assert set(signs.tolist()) == {1.0, -1.0}  # 16 fair coins: both sides (fixed seed)
    assert torch.equal(tokens, real_tokens * signs[:, None])  # whole trajectories flipped
    assert metrics["placebo_negated_fraction"] == float((signs < 0).float().mean())
    # a pure function of the seed and the trajectories: same inputs, same signs
    assert torch.equal(placebo_signs(batch, 3), signs)
    assert torch.equal(placebo_signs(batch.select(range(8, 16)), 3), signs[8:])
    assert not torch.equal(placebo_signs(batch, 4), signs)


def test_placebo_is_an_option_of_the_run_config():
    from trainers.rl.config import AlgorithmSettings

    algorithm = AlgorithmSettings(name="igpo", options={"placebo": True, "gamma": 0.9}).build()
    assert isinstance(algorithm, Placebo) and algorithm.config.gamma == 0.9
    assert not isinstance(AlgorithmSettings(name="igpo").build(), Placebo)
