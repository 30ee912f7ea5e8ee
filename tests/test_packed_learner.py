"""The packed RL learner (learner.packing, the default): trajectories laid end to end in rows
scored and trained as the padded learner does, micro-batches by token budget; and rollouts of
several groups sharing engine calls (rollout.groups_per_call)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import synthetic_record
from trainers.algorithms import IGPOConfig, make_algorithm
from trainers.algorithms.losses import LossConfig
from trainers.batch import collate
from trainers.modeling.logprobs import PackedRow, policy_token_logprobs
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm
from trainers.modeling.varlen import pack_lengths
from trainers.rl.learner import Learner, LossTotals, policy_rows


@pytest.fixture(scope="module")
def policy_dir(phrase_policy_dir) -> str:
    return phrase_policy_dir


def uneven_batch(rows: int = 6, vocab_size: int = 300):
    """Trajectories of different lengths, so a padded batch holds padding."""
    return collate([synthetic_record(
        [("search", 4 + 3 * row, 5 + row), ("visit", 6, 7 + 2 * row), ("answer", 3 + row, 0)],
        group_id=row // 3, outcome=float(row % 2), vocab_size=vocab_size, seed=row)
        for row in range(rows)])


def test_a_packed_row_scores_what_the_padded_batch_scores(policy_dir):
    from trainers.modeling.models import load_policy

    model, _, _ = load_policy(policy_dir)
    batch = uneven_batch()
    assert not batch.attention_mask.all()  # there is padding to drop
    with torch.no_grad():
        padded, padded_entropy = policy_token_logprobs(model, batch, torch.device("cpu"))
        row = PackedRow(batch)
        with row.attention(model):
            packed, packed_entropy = row.policy_token_logprobs(model, torch.device("cpu"))
    assert row.tokens == int(batch.attention_mask.sum())  # no padding in the row
    mask = batch.loss_mask
    assert torch.allclose(packed[mask], padded[mask], atol=1e-5)
    assert torch.allclose(packed_entropy[mask], padded_entropy[mask], atol=1e-4)
    assert (packed[~mask] == 0).all()
    assert model.config._attn_implementation != "venus_varlen"  # restored after the row


def test_pack_lengths_fills_rows_within_the_budget_and_keeps_every_item():
    lengths = [70, 50, 40, 30, 30, 20, 200]
    rows = pack_lengths(lengths, 100)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert [6] in rows  # longer than a row: alone
    assert all(sum(lengths[i] for i in row) <= 100 for row in rows if row != [6])
    assert sum(1 for row in rows if sum(lengths[i] for i in row) == 100) >= 2


@pytest.mark.parametrize("kl_coef", [0.0, 0.01])
def test_the_packed_learner_makes_the_padded_learners_update(policy_dir, kl_coef):
    """Same batch, same start: the packed learner (micro-batches by tokens) and the padded
    one (micro-batches of 2 rows) compute the same gradient (compared element by element
    at lr 0: AdamW would turn float-rounding differences of near-zero gradients into
    lr-sized ones) and loss diagnostics, the reference log-probs and IG probe scores
    included."""
    algorithm = make_algorithm("igpo", IGPOConfig(loss=LossConfig(kl_coef=kl_coef)))
    batch = uneven_batch()
    answers = [["london"]] * batch.batch_size
    learners = {packing: Learner(policy_dir, algorithm, lr=0.0, micro_batch_size=2,
                                 packing=packing, micro_batch_tokens=120, use_gpu=False)
                for packing in (False, True)}
    outputs, metrics = {}, {}
    for packing, learner in learners.items():
        scored = learner.score(batch, answers)
        outputs[packing] = scored
        ready = batch.replace(**scored)
        ready = ready.replace(advantages=algorithm.advantages(
            ready, algorithm.turn_rewards(ready)).tokens)
        metrics[packing] = learner.update(ready, LossTotals(
            tokens=int(ready.loss_mask.sum()), sequences=policy_rows(ready)))
    mask = batch.loss_mask
    for name in outputs[False]:
        padded, packed = outputs[False][name], outputs[True][name]
        if name == "boundary_scores":
            assert torch.allclose(packed.nan_to_num(), padded.nan_to_num(), atol=1e-5)
        else:
            assert torch.allclose(packed[mask], padded[mask], atol=1e-5), name
    for key in ("policy_loss", "kl", "entropy", "grad_norm", "ratio_max"):
        if key in metrics[False]:
            assert metrics[True][key] == pytest.approx(metrics[False][key], rel=1e-3, abs=1e-6)
    padded = dict(learners[False].model.named_parameters())
    packed = dict(learners[True].model.named_parameters())
    assert metrics[True]["grad_norm"] > 1e-3  # a real gradient
    for name, parameter in padded.items():
        assert torch.allclose(packed[name].grad, parameter.grad, atol=1e-5, rtol=1e-3), name


def test_groups_sharing_engine_calls_give_the_groups_own_trajectories():
    """rollout_groups: two groups in lockstep send the requests and seeds each would send
    alone, in one engine call per turn."""
    from envs.group import DeepResearchGroupEnv
    from trainers.engines.hf import HFEngine
    from trainers.rollout import (
        GroupPlay,
        RolloutStats,
        SamplingConfig,
        rollout_group,
        rollout_groups,
    )
    from trainers.sft.pipeline import build_chat

    world = {"world_size": 300, "world_seed": 3, "max_turns": 2}
    chat = build_chat(build_chatml_tokenizer(["search visit answer think"] * 10,
                                             vocab_size=300))
    engine = HFEngine(build_tiny_causal_lm(chat.tokenizer, hidden=32, layers=1, heads=1,
                                           seed=2), chat.tokenizer)
    sampling = [SamplingConfig(max_turn_tokens=12, seed=s) for s in (5, 9)]
    alone = [rollout_group(engine, DeepResearchGroupEnv(group_size=2, **world), chat,
                           seed=s.seed, options={"task_index": t}, sampling=s)
             for s, t in zip(sampling, (0, 1))]
    stats = RolloutStats()
    together = rollout_groups(engine, [
        GroupPlay(DeepResearchGroupEnv(group_size=2, **world), seed=s.seed,
                  options={"task_index": t}, sampling=s) for s, t in zip(sampling, (0, 1))],
        chat, stats=stats)
    assert [[t.input_ids for t in group] for group in together] == \
        [[t.input_ids for t in group] for group in alone]
    assert stats.engine_calls == max(len(t.turns) for group in alone for t in group)


def test_a_checkpointed_backward_on_another_thread_still_sees_the_packed_spans(policy_dir):
    """On CUDA, autograd recomputes checkpointed layers on its own device thread, which does
    not inherit the caller's context variables; the packed row's spans must reach it."""
    import threading

    from trainers.modeling.models import load_policy

    model, _, _ = load_policy(policy_dir)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    batch = uneven_batch()
    row = PackedRow(batch)
    errors = []

    def backward(loss):
        try:
            loss.backward()
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    with row.attention(model):
        logprobs, _ = row.policy_token_logprobs(model, torch.device("cpu"))
        worker = threading.Thread(target=backward, args=(-logprobs.sum(),))
        worker.start()
        worker.join()
    assert not errors, errors
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
