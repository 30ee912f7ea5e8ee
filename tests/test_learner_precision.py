"""The RL learner for real models: fp32 master weights (an lr 1e-6 step reaches bf16-served
weights, while bf16 parameters round it away), bf16 autocast, gradient checkpointing and LoRA
(only adapters train; engines get base + merged delta), on a tiny model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.helpers import synthetic_record
from trainers.batch import collate
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm, load_policy
from trainers.rl.config import AlgorithmSettings, RLConfig
from trainers.rl.learner import Learner, LossTotals, policy_rows

pytest.importorskip("peft")  # the `lora` extra; `make test` installs it


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def policy_dir(phrase_policy_dir) -> str:
    return phrase_policy_dir


def algorithm():
    return AlgorithmSettings(name="grpo", options={"loss": {"kl_coef": 0.0}}).build()


def learner_batch(vocab_size: int, seed: int = 0):
    records = [synthetic_record([("search", 5, 4), ("answer", 4, 0)], 0, 1.0,
                                vocab_size=vocab_size, seed=seed + row) for row in range(2)]
    return collate(records)


def update(learner: Learner, seed: int = 0) -> dict[str, float]:
    """One optimizer step with advantage 1 on every policy token (a real gradient)."""
    batch = learner_batch(len(learner.tokenizer), seed)
    old = learner.score(batch, [["london"]] * batch.batch_size)
    batch = batch.replace(old_logprobs=old["old_logprobs"],
                          advantages=torch.where(batch.loss_mask, 1.0, 0.0))
    return learner.update(batch, LossTotals(tokens=int(batch.loss_mask.sum()),
                                            sequences=policy_rows(batch)))


# Below 2^-7 in magnitude, bf16's spacing (2^-15 and less) lets even a 1e-6 step through.
LARGE = 2.0 ** -7


def assert_master_weights_reach_bf16_engines(policy: str, **learner_options) -> None:
    """What this proves, precisely:
    * bf16 parameters: after one AdamW step at lr 1e-6 (each element moves by ~1e-6), no
      element of magnitude >= 2^-7 has changed: bf16's spacing there (>= 2^-14 ~ 6e-5) is
      far above the step, so the update rounds back to the old value.
    * fp32 master weights: the same step changes the fp32 weights, and the copy an engine
      serving bf16 gets (the masters cast to bf16) changes too, also among elements of
      magnitude >= 2^-7 (those within the step of a bf16 rounding boundary). Every later step
      adds to the masters, so all weights eventually move in the bf16 copy; with bf16
      parameters the large ones never would."""
    naive = Learner(policy, algorithm(), lr=1e-6, dtype="bfloat16", **learner_options)
    master = Learner(policy, algorithm(), lr=1e-6, **learner_options)
    assert {p.dtype for p in master.model.parameters()} == {torch.float32}
    naive_before, master_before = naive.weights(), master.weights()
    update(naive)
    update(master)
    naive_after, master_after = naive.weights(), master.weights()
    large_naive_changed = large_served_changed = master_changed = 0
    for name, before in master_before.items():
        large = before.abs() >= LARGE
        large_naive_changed += int((naive_after[name] != naive_before[name])[large].sum())
        served_before, served_after = before.bfloat16(), master_after[name].bfloat16()
        large_served_changed += int((served_after != served_before)[large].sum())
        master_changed += int((master_after[name] != before).sum())
    print(f"large elements changed: bf16 params {large_naive_changed}, bf16-served copy of the "
          f"fp32 masters {large_served_changed}; fp32 elements changed {master_changed}")
    assert large_naive_changed == 0
    assert master_changed > 0
    assert large_served_changed > 0


def test_fp32_master_weights_let_an_lr_1e_6_step_reach_bf16_served_weights(policy_dir):
    assert_master_weights_reach_bf16_engines(policy_dir)


def test_bf16_autocast_keeps_fp32_parameters_and_computes_in_bf16(policy_dir):
    plain = Learner(policy_dir, algorithm(), lr=1e-3)
    mixed = Learner(policy_dir, algorithm(), lr=1e-3, autocast="bfloat16")
    batch = learner_batch(len(plain.tokenizer))
    fp32 = plain.score(batch, [["x"]] * 2)["old_logprobs"]
    bf16 = mixed.score(batch, [["x"]] * 2)["old_logprobs"]
    # bf16 matmuls: close to the fp32 log-probs, but not equal (autocast is on).
    assert not torch.equal(fp32, bf16)
    assert torch.allclose(fp32, bf16, atol=0.1)
    update(mixed)
    assert {p.dtype for p in mixed.model.parameters()} == {torch.float32}
    assert {t.dtype for t in mixed.weights().values()} == {torch.float32}


def test_gradient_checkpointing_gives_the_same_update(policy_dir):
    plain = Learner(policy_dir, algorithm(), lr=1e-3)
    checkpointed = Learner(policy_dir, algorithm(), lr=1e-3, gradient_checkpointing=True)
    def checkpointing(model):
        return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())

    assert checkpointing(checkpointed.model) and not checkpointing(plain.model)
    plain_metrics, checkpointed_metrics = update(plain), update(checkpointed)
    assert plain_metrics["grad_norm"] == pytest.approx(checkpointed_metrics["grad_norm"],
                                                       rel=1e-5)
    after, expected = checkpointed.weights(), plain.weights()
    assert all(torch.allclose(after[k], expected[k], atol=1e-6) for k in expected)


def test_lora_trains_only_adapters_and_engines_get_base_plus_merged_delta(policy_dir, tmp_path):
    base_model, _, _ = load_policy(policy_dir)
    base = {k: v.clone() for k, v in base_model.state_dict().items()}
    learner = Learner(policy_dir, algorithm(), lr=1e-2, lora_rank=4, lora_alpha=8.0)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    # B starts at zero: before training the merged weights are the base weights.
    assert all(torch.equal(w, base[k]) for k, w in learner.weights().items())
    for step in range(2):  # step 1 moves B only (A's gradient is B^T ... = 0), step 2 A too
        update(learner, seed=step)
    after = learner.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_" in k for k in changed)
    assert any("lora_A" in k for k in changed) and any("lora_B" in k for k in changed)
    # The engine's weights: the base model's names, base + B @ A * alpha / rank on every
    # adapted projection, the base weight everywhere else.
    sent = learner.weights()
    assert sent.keys() == base.keys()
    adapted = 0
    for key, weight in sent.items():
        module = key[: -len(".weight")]
        lora_a = after.get(f"{module}.lora_A.default.weight")
        if lora_a is None:
            assert torch.equal(weight, base[key]), key
            continue
        delta = after[f"{module}.lora_B.default.weight"] @ lora_a * (8.0 / 4)
        assert torch.allclose(weight, base[key] + delta, atol=1e-7), key
        assert not torch.equal(weight, base[key]), key
        adapted += 1
    assert adapted == 2 * 7  # 2 layers x q, k, v, o, gate, up, down
    # An engine holding a plain model computes what the LoRA model computes.
    base_model.load_state_dict(sent)
    ids = learner_batch(len(learner.tokenizer)).input_ids
    with torch.no_grad():
        assert torch.allclose(base_model.eval()(ids).logits, learner.model.eval()(ids).logits,
                              atol=1e-5)
    # A checkpoint restores the adapters (not just the merged weights).
    learner.save(tmp_path)
    restored = Learner(policy_dir, algorithm(), lr=1e-2, lora_rank=4, lora_alpha=8.0)
    restored.load(tmp_path)
    assert all(torch.equal(restored.weights()[k], sent[k]) for k in sent)


def test_learner_options_are_validated_by_name(policy_dir):
    config = RLConfig()
    config.policy.path = policy_dir
    for change, message in (({"dtype": "fp8"}, "learner.dtype"),
                            ({"autocast": "fp16"}, "learner.autocast"),
                            ({"lora_rank": -1}, "learner.lora_rank"),
                            ({"lora_rank": 4, "strategy": "fsdp", "num_learners": 2},
                             "lora_rank > 0 needs learner.strategy ddp")):
        config.learner = dataclasses.replace(RLConfig().learner, **change)
        config.run.use_ray = True
        with pytest.raises(ValueError, match=message):
            config.validate()
    with pytest.raises(ValueError, match="match no module"):
        Learner(policy_dir, algorithm(), lr=1e-3, lora_rank=2, lora_targets=("nothing_here",))
    assert Path(policy_dir).is_dir()


def test_rl_run_with_lora_autocast_and_checkpointing_from_the_config(tmp_path):
    """The learner settings travel from the RL config through the driver: a one-step
    in-process run with LoRA, bf16 autocast and gradient checkpointing moves only the
    adapted projections of the synced (merged) weights."""
    from tests.test_rl_driver import WORLD, small_config
    from trainers.data.oracle_data import world_texts
    from trainers.rl.driver import train

    policy = tmp_path / "policy"
    tokenizer = build_chatml_tokenizer(world_texts(WORLD), vocab_size=2048)
    build_tiny_causal_lm(tokenizer, hidden=64, layers=2, heads=2, seed=0).save_pretrained(policy)
    tokenizer.save_pretrained(policy)
    config = small_config(str(policy), tmp_path / "run", algorithm="grpo", steps=1)
    config.eval.before = False
    config.learner = dataclasses.replace(config.learner, lora_rank=4, autocast="bfloat16",
                                         gradient_checkpointing=True)
    result = train(config)
    base = load_policy(policy)[0].state_dict()
    assert result.weights.keys() == base.keys()
    moved = {k for k in base if not torch.equal(result.weights[k], base[k])}
    assert moved and all(k.rsplit(".", 2)[-2] in config.learner.lora_targets for k in moved)


def test_adam_eps_sets_how_far_weights_with_small_gradients_move(policy_dir):
    """AdamW's first step moves a weight by lr * g / (|g| + eps). With torch's eps 1e-8 every
    weight whose gradient is not ~0 moves by about lr (sign descent); with an eps far above
    the typical gradient the same step moves weights in proportion to their gradient, so the
    typical weight moves much less than lr while the weights with the largest gradients still
    move the most."""
    lr = 1e-4
    moves = {}
    for eps in (1e-8, 1e-2):
        learner = Learner(policy_dir, algorithm(), lr=lr, eps=eps)
        assert learner.optimizer.param_groups[0]["eps"] == eps
        before = learner.weights()
        update(learner)
        after = learner.weights()
        moves[eps] = torch.cat([(after[name] - before[name]).abs().flatten() for name in before])
    moved = moves[1e-8] > lr / 100
    assert moved.float().mean() > 0.5  # most weights got a gradient
    assert torch.allclose(moves[1e-8][moved].median(), torch.tensor(lr), rtol=0.02)
    assert moves[1e-2][moved].median() < lr / 10
    # the same weights, ordered by how far eps 1e-2 moved them, i.e. by gradient size
    assert moves[1e-2].max() > 10 * moves[1e-2][moved].median()


def test_a_bad_adam_eps_is_refused():
    config = RLConfig()
    config.policy.path = "warm-start"
    config.learner = dataclasses.replace(config.learner, eps=0.0)
    with pytest.raises(ValueError, match="learner.eps must be a finite number > 0, got 0.0"):
        config.validate()
