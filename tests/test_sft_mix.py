"""The SFT loss mixed into RL updates (learner.sft_coef, trainers/rl/sft_mix.py): which
oracle samples each update draws, the gradient it adds, and a learner that trains with it."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from tests.helpers import synthetic_record
from trainers.algorithms import IGPOConfig, make_algorithm
from trainers.batch import collate
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.rl.config import LearnerConfig
from trainers.rl.learner import Learner, LossTotals, policy_rows
from trainers.rl.sft_mix import SftMix
from trainers.sft.packing import SFTSample

MIX_YAML = """
data:
  num_episodes: {episodes}
  seed: 0
  world_seeds: {worlds}
  mixture: short
  max_seq_len: 4096
train:
  progress_bar: false
env:
  world_size: 200
  world_seed: 0
  hops: [1, 2]
  search_top_k: 3
  prompt_style: compact
"""


def fake_samples(count: int, vocab: int, seed: int = 0) -> list[SFTSample]:
    """Samples of different lengths whose second half is policy tokens."""
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        length = rng.randint(6, 14)
        ids = tuple(rng.randrange(3, vocab) for _ in range(length))
        samples.append(SFTSample(ids, tuple(int(i >= length // 2) for i in range(length))))
    return samples


def test_a_pass_over_the_samples_ends_before_any_repeats_and_learners_split_each_draw():
    samples = fake_samples(10, 50)
    one = SftMix(samples, coef=1.0, samples_per_update=2, seed=3)
    drawn = [i for update in range(10) for i in one.draw(update)[0]]
    assert sorted(drawn[:10]) == list(range(10)) and sorted(drawn[10:]) == list(range(10))
    assert drawn[:10] != drawn[10:]  # a new pass is reshuffled
    assert drawn != [i for u in range(10) for i in
                     SftMix(samples, coef=1.0, samples_per_update=2, seed=4).draw(u)[0]]
    halves = [SftMix(samples, coef=1.0, samples_per_update=1, seed=3, rank=r, world_size=2)
              for r in (0, 1)]
    for update in range(7):
        whole, _ = one.draw(update)
        assert halves[0].draw(update)[0] == whole
        assert (halves[0].draw(update)[1], halves[1].draw(update)[1]) == (whole[0::2],
                                                                           whole[1::2])


def test_two_learners_shares_add_up_to_coef_times_the_draws_mean_cross_entropy():
    tokenizer = build_chatml_tokenizer(["a b c d e f g"] * 4, vocab_size=300)
    vocab = len(tokenizer)
    samples = fake_samples(6, vocab, seed=1)

    def gradients(mix: SftMix, model: torch.nn.Module) -> tuple[dict, float]:
        model.zero_grad(set_to_none=True)
        value = mix.backward(model, 1, torch.device("cpu"))
        return {n: p.grad.clone() for n, p in model.named_parameters()}, value

    model = build_tiny_causal_lm(tokenizer, hidden=32, layers=1, seed=5)
    model.train()
    shares = [gradients(SftMix(samples, coef=0.5, samples_per_update=1, seed=0, rank=r,
                               world_size=2, pad_id=0), model) for r in (0, 1)]
    single, single_value = gradients(SftMix(samples, coef=0.5, samples_per_update=2, seed=0,
                                            pad_id=0), model)
    # The same loss by hand: each drawn sample alone, next-token targets on policy tokens.
    model.zero_grad(set_to_none=True)
    drawn = SftMix(samples, coef=0.5, samples_per_update=2, seed=0).draw(1)[0]
    total, tokens = torch.zeros(()), 0
    for index in drawn:
        ids = torch.tensor([samples[index].input_ids])
        logits = model(input_ids=ids).logits[0, :-1]
        targets = ids[0, 1:]
        keep = torch.tensor(samples[index].loss_mask[1:], dtype=torch.bool)
        total = total + torch.nn.functional.cross_entropy(logits[keep], targets[keep],
                                                          reduction="sum")
        tokens += int(keep.sum())
    (0.5 * total / tokens).backward()
    by_hand = {n: p.grad for n, p in model.named_parameters()}
    assert single_value == pytest.approx(float(total.detach()) / tokens, rel=1e-5)
    assert shares[0][1] + shares[1][1] == pytest.approx(single_value, rel=1e-5)
    assert any(float(g.abs().max()) > 1e-4 for g in by_hand.values())
    for name, grad in by_hand.items():
        assert torch.allclose(single[name], grad, atol=1e-6), name
        assert torch.allclose(shares[0][0][name] + shares[1][0][name], grad, atol=1e-6), name


def test_bad_settings_say_what_is_wrong(tmp_path):
    samples = fake_samples(3, 50)
    with pytest.raises(ValueError, match="sft_coef must be > 0"):
        SftMix(samples, coef=0.0, samples_per_update=1, seed=0)
    with pytest.raises(ValueError, match="sft_samples_per_update must be >= 1"):
        SftMix(samples, coef=1.0, samples_per_update=0, seed=0)
    with pytest.raises(ValueError, match="no samples"):
        SftMix([], coef=1.0, samples_per_update=1, seed=0)
    config = tmp_path / "mix.yaml"
    config.write_text(MIX_YAML.format(episodes=4, worlds="[0, 37]"))
    with pytest.raises(ValueError, match=r"include RL's world 0"):
        SftMix.from_config(str(config), chat=None, rl_world=0, coef=1.0,
                           samples_per_update=1, seed=0)
    algorithm = make_algorithm("igpo", IGPOConfig())
    with pytest.raises(ValueError, match="needs learner.sft_config"):
        Learner("warm-start", algorithm, lr=1e-4, use_gpu=False, sft_coef=1.0)


def test_the_config_hands_learners_an_absolute_sft_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = LearnerConfig(sft_coef=0.5, sft_config="mix.yaml",
                             sft_samples_per_update=3).model_settings()
    assert settings["sft_config"] == str(tmp_path / "mix.yaml")
    assert (settings["sft_coef"], settings["sft_samples_per_update"]) == (0.5, 3)
    assert LearnerConfig().model_settings()["sft_coef"] == 0.0


def test_a_learner_with_the_mix_learns_the_oracle_episodes_when_rewards_give_no_gradient(
        tmp_path):
    """Zero advantages and no KL: the RL loss has no gradient, so every move of the weights
    is the mixed SFT loss, and its cross-entropy on the drawn oracle episodes falls."""
    config = tmp_path / "mix.yaml"
    config.write_text(MIX_YAML.format(episodes=2, worlds="[37]"))
    algorithm = make_algorithm("igpo", IGPOConfig())
    learner = Learner("warm-start", algorithm, lr=1e-3, use_gpu=False, sft_coef=1.0,
                      sft_config=str(config), sft_samples_per_update=2, rl_world=0)
    assert len(learner.sft_mix.samples) == 2
    assert all(s.trained_tokens > 0 for s in learner.sft_mix.samples)
    batch = collate([synthetic_record([("search", 4, 5), ("answer", 3, 0)], group_id=0,
                                      outcome=float(row % 2), vocab_size=300, seed=row)
                     for row in range(2)])
    batch = batch.replace(**learner.score(batch, [["london"]] * 2))
    batch = batch.replace(advantages=torch.zeros(batch.input_ids.shape))
    totals = LossTotals(tokens=int(batch.loss_mask.sum()), sequences=policy_rows(batch))
    losses = [learner.update(batch, totals)["sft_loss"] for _ in range(5)]
    assert losses[0] > 0
    assert losses[-1] < 0.9 * losses[0], losses


def test_an_rl_run_trains_with_the_mix_and_refuses_episodes_of_its_own_world(
        tmp_path, monkeypatch, policy_dir):
    """Through the driver: a relative learner.sft_config is found from the working
    directory, every step logs the mix's loss, and a mix on RL's own world stops the run
    before any rollout, naming the world."""
    from tests.test_rl_driver import WORLD, small_config
    from trainers.rl.driver import train

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mix.yaml").write_text(MIX_YAML.format(episodes=2, worlds="[37]"))
    config = small_config(policy_dir, tmp_path / "run", steps=1)
    config.learner = dataclasses.replace(config.learner, sft_coef=0.5, sft_config="mix.yaml",
                                         sft_samples_per_update=1)
    config.eval = dataclasses.replace(config.eval, before=False, after=False)
    result = train(config)
    assert [h["step"] for h in result.history] == [0]
    assert result.history[0]["sft_loss"] > 0
    (tmp_path / "own.yaml").write_text(MIX_YAML.format(episodes=2,
                                                       worlds=f"[{WORLD['world_seed']}]"))
    config.learner = dataclasses.replace(config.learner, sft_config="own.yaml")
    config.run = dataclasses.replace(config.run, output_dir=str(tmp_path / "refused"))
    with pytest.raises(ValueError, match=f"include RL's world {WORLD['world_seed']}"):
        train(config)
    assert not (tmp_path / "refused" / "metrics.jsonl").exists()
