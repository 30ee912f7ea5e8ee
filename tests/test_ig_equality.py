"""Fast (one packed forward) vs reference (one forward per boundary) information gain.

Random tiny models, random trajectories, several boundaries and gold answers, fp32: the
probe scores, the log-prob and probability IGs and the fused old log-probs must agree
within 1e-4.
"""

import pytest
import torch

import trainers.algorithms.information_gain as information_gain
from tests.helpers import TurnSpec, synthetic_record
from tests.ig_reference import reference_policy_logprobs, reference_probe_scores
from trainers.algorithms.information_gain import (
    InformationGainConfig,
    best_answer_scores,
    boundary_positions,
    fast_probe_scores,
    score_batch,
)
from trainers.algorithms.packed_attention import BLOCKSPARSE, packed_probe_attention, plan_chunks
from trainers.algorithms.probes import ProbeTemplate
from trainers.algorithms.rewards import RewardConfig, probe_slots, turn_rewards
from trainers.batch import collate
from trainers.modeling.models import tiny_causal_lm

VOCAB = 300
TOLERANCE = 1e-4
pytestmark = [pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
              pytest.mark.usefixtures("single_thread")]


@pytest.fixture(scope="module")
def models():
    return {arch: tiny_causal_lm(arch, vocab_size=VOCAB, hidden_size=64, num_layers=2, seed=i)
            for i, arch in enumerate(("qwen3", "qwen2", "llama"))}


def random_probes(seed, answer_lengths=(1, 3, 5)):
    """Several gold answers of different lengths around a shared random template."""
    generator = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(0, VOCAB, (n,), generator=generator).tolist()

    template = ProbeTemplate(generation_prompt_ids=tuple(ids(3)), prefix_ids=tuple(ids(6)),
                             suffix_ids=tuple(ids(2)) + (0,))
    return [template.probe_for_ids(ids(n), answer=f"a{n}") for n in answer_lengths]


def random_trajectory(seed, length=240, boundaries=9):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (length,), generator=generator)
    inner = torch.randint(1, length, (boundaries - 3,), generator=generator)
    # include the edges (empty history, full trajectory) and a repeated boundary
    points = torch.cat([torch.tensor([0, length, int(inner[0])]), inner]).sort().values
    return ids, points


BACKENDS = [
    InformationGainConfig(backend="dense"),
    InformationGainConfig(backend="blocksparse"),
    InformationGainConfig(backend="blocksparse", max_mask_elements=3000),  # memory-bound chunks
    InformationGainConfig(backend="auto", temperature=0.7),
]
MANY_CHUNKS = InformationGainConfig(backend="blocksparse", chunk_query_tokens=20)


def check_against_reference(model, config, seed) -> float:
    """Asserts the fast path's shapes and properties; returns the largest score difference."""
    ids, boundaries = random_trajectory(seed=seed)
    probes = random_probes(seed=seed + 1)
    policy_mask = torch.rand(len(ids), generator=torch.Generator().manual_seed(seed)) > 0.4
    policy_mask[0] = False
    fast = fast_probe_scores(model, ids, boundaries, probes, config, policy_mask)
    reference = reference_probe_scores(model, ids, boundaries, probes, config.temperature)
    assert fast.scores.shape == (len(boundaries), len(probes))
    score_diff = (fast.scores - reference).abs().max().item()
    # the scores are informative: they differ across boundaries and answers
    assert reference.std().item() > 0.1
    old = reference_policy_logprobs(model, ids, policy_mask, config.temperature)
    assert (fast.policy_logprobs - old).abs().max().item() < TOLERANCE
    assert (fast.policy_logprobs[~policy_mask] == 0).all()
    return score_diff


@pytest.mark.parametrize("seed, arch", list(enumerate(["qwen3", "qwen2", "llama"])))
def test_fast_scores_equal_reference_across_architectures(models, seed, arch):
    assert check_against_reference(models[arch], MANY_CHUNKS, seed=10 * seed) < TOLERANCE


@pytest.mark.parametrize("seed, config", list(enumerate(BACKENDS)),
                         ids=["dense", "blocksparse", "memory-bound", "auto-temperature"])
def test_fast_scores_equal_reference_across_backends(models, seed, config):
    assert check_against_reference(models["qwen3"], config, seed=100 + 10 * seed) < TOLERANCE


def test_flex_backend_equals_reference(models):
    """flex_attention run eagerly (compiling would take ~30 s on CPU); same mask_mod."""
    model = models["qwen3"]
    ids, boundaries = random_trajectory(seed=5, length=150, boundaries=5)
    probes = random_probes(seed=4, answer_lengths=(2, 4))
    config = InformationGainConfig(backend="flex", compile_flex=False)
    fast = fast_probe_scores(model, ids, boundaries, probes, config)
    reference = reference_probe_scores(model, ids, boundaries, probes)
    assert (fast.scores - reference).abs().max().item() < TOLERANCE


def ig_batch():
    turns = [[("search", 5, 12), ("visit", 7, 30), ("invalid", 4, 6, False), ("visit", 6, 25),
              ("search", 5, 10), ("answer", 8, 0)],
             [("visit", 9, 40), ("visit", 3, 20), ("answer", 5, 0)],
             [("search", 4, 8), ("search", 4, 8), ("answer", 6, 0, False)]]
    records = [synthetic_record([TurnSpec(*t) for t in spec], group_id=0, outcome=float(i % 2),
                                question_tokens=11, vocab_size=VOCAB, seed=20 + i)
               for i, spec in enumerate(turns)]
    return collate(records)


@pytest.mark.parametrize("browse_aware", [True, False])
def test_log_and_probability_ig_agree_through_the_batch_api(models, browse_aware):
    model, batch = models["llama"], ig_batch()
    probes = [random_probes(seed=7, answer_lengths=(2, 1, 4))] * batch.batch_size
    reward_config = RewardConfig(browse_aware=browse_aware)
    slots = probe_slots(batch, reward_config)
    fast_batch = score_batch(model, batch, probes, slots,
                             InformationGainConfig(chunk_query_tokens=30))

    positions = boundary_positions(batch)
    reference_scores = torch.full(positions.shape, float("nan"))
    reference_old = torch.zeros(batch.input_ids.shape)
    for row in range(batch.batch_size):
        length = int(batch.lengths[row])
        selected = slots[row].nonzero().flatten()
        scores = reference_probe_scores(model, batch.input_ids[row, :length],
                                        positions[row, selected], probes[row])
        reference_scores[row, selected] = best_answer_scores(scores)
        reference_old[row, :length] = reference_policy_logprobs(
            model, batch.input_ids[row, :length], batch.loss_mask[row, :length])
    reference_batch = batch.replace(boundary_scores=reference_scores)

    assert torch.equal(torch.isnan(fast_batch.boundary_scores), torch.isnan(reference_scores))
    assert (fast_batch.old_logprobs - reference_old).abs().max().item() < TOLERANCE
    for ig_kind in ("log", "prob"):
        config = RewardConfig(browse_aware=browse_aware, ig_kind=ig_kind)
        fast_ig = turn_rewards(fast_batch, config).information_gain
        reference_ig = turn_rewards(reference_batch, config).information_gain
        assert torch.equal(torch.isnan(fast_ig), torch.isnan(reference_ig))
        assert torch.isfinite(fast_ig).sum() >= 3
        finite = torch.isfinite(fast_ig)
        assert (fast_ig[finite] - reference_ig[finite]).abs().max().item() < TOLERANCE


def test_blocksparse_never_builds_the_dense_mask(models, monkeypatch):
    def forbidden(layout):
        raise AssertionError("dense mask built on the blocksparse path")

    monkeypatch.setattr(information_gain, "dense_mask", forbidden)
    ids, boundaries = random_trajectory(seed=9)
    config = InformationGainConfig(backend="blocksparse")
    fast_probe_scores(models["qwen3"], ids, boundaries, random_probes(seed=1), config)
    with pytest.raises(AssertionError, match="dense mask"):
        fast_probe_scores(models["qwen3"], ids, boundaries, random_probes(seed=1),
                          InformationGainConfig(backend="dense"))


def test_model_attention_setting_is_restored(models):
    model = models["qwen2"]
    before = model.config._attn_implementation
    ids, boundaries = random_trajectory(seed=2, length=60, boundaries=4)
    fast_probe_scores(model, ids, boundaries, random_probes(seed=1))
    assert model.config._attn_implementation == before
    with pytest.raises(RuntimeError, match="boom"):
        with packed_probe_attention(model, None, BLOCKSPARSE):
            raise RuntimeError("boom")
    assert model.config._attn_implementation == before


def test_unsupported_models_and_inputs_are_rejected(models):
    model = tiny_causal_lm("qwen3", vocab_size=VOCAB, hidden_size=32, num_layers=1)
    model.config.final_logit_softcapping = 30.0
    ids, boundaries = random_trajectory(seed=2, length=40, boundaries=4)
    with pytest.raises(NotImplementedError, match="final_logit_softcapping"):
        fast_probe_scores(model, ids, boundaries, random_probes(seed=1))
    with pytest.raises(ValueError, match="boundaries must lie"):
        fast_probe_scores(models["qwen3"], ids, torch.tensor([41]), random_probes(seed=1))
    with pytest.raises(ValueError, match="backend"):
        InformationGainConfig(backend="sparse")


def test_chunk_plan_respects_both_budgets():
    lengths = torch.full((10,), 7)
    starts = torch.arange(10) * 7
    bounds = torch.arange(10) * 30 + 5
    chunks = plan_chunks(500, starts, starts + lengths, bounds, chunk_query_tokens=21,
                         max_mask_elements=10_000)
    covered = []
    for query_start, query_end, prefix in chunks:
        queries = query_end - query_start
        assert queries <= 21 or queries == 7  # a single probe always fits
        assert queries * (prefix + queries) <= 10_000 or queries == 7
        covered.extend(range(query_start, query_end))
    assert covered == list(range(500, 570))  # every probe token exactly once, in order
    assert [prefix for *_, prefix in chunks] == sorted(prefix for *_, prefix in chunks)


def test_scores_ignore_dropout_and_keep_the_training_mode():
    model = tiny_causal_lm("qwen3", vocab_size=VOCAB, hidden_size=32, num_layers=1, seed=3)
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5  # would make a training-mode forward random
    model.train()
    ids, boundaries = random_trajectory(seed=4, length=80, boundaries=4)
    probes = random_probes(seed=2)
    first = fast_probe_scores(model, ids, boundaries, probes).scores
    second = reference_probe_scores(model, ids, boundaries, probes)
    assert (first - second).abs().max().item() < TOLERANCE
    assert model.training


def test_contrastive_scores_are_gold_minus_mean_distractor_in_the_same_forward(models):
    model, batch = models["qwen3"], ig_batch()
    gold = [random_probes(seed=7, answer_lengths=(2, 1))] * batch.batch_size
    wrong = [random_probes(seed=8, answer_lengths=(3, 2, 1))] * batch.batch_size
    config = RewardConfig(ig_baseline="contrastive")
    slots = probe_slots(batch, config)
    temperature = InformationGainConfig(temperature=0.8)
    contrastive = score_batch(model, batch, gold, slots, temperature, distractors=wrong)
    plain = score_batch(model, batch, gold, slots, temperature)
    positions = boundary_positions(batch)
    for row in range(batch.batch_size):
        length = int(batch.lengths[row])
        selected = slots[row].nonzero().flatten()
        if not len(selected):
            continue  # no visit: nothing probed
        ids = batch.input_ids[row, :length]
        g = reference_probe_scores(model, ids, positions[row, selected], gold[row], 0.8)
        d = reference_probe_scores(model, ids, positions[row, selected], wrong[row], 0.8)
        expected = best_answer_scores(g) - d.mean(dim=-1)
        assert (contrastive.boundary_scores[row, selected] - expected).abs().max() < TOLERANCE
    # the same behaviour log-probs (up to float order: more probes can switch the backend)
    assert (contrastive.old_logprobs - plain.old_logprobs).abs().max() < TOLERANCE
    with pytest.raises(ValueError, match="at least one distractor"):
        score_batch(model, batch, gold, slots, distractors=[[]] * batch.batch_size)
