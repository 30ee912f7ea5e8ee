"""Kept KV caches (trainers.engines.kv_cache, HFEngine(kv_cache=True)): a conversation's next turn
prefills only the ids its prompt adds, with the same ids and log-probs as re-encoding the
whole conversation; prompts that do not extend a kept conversation fall back; caches are
freed when episodes end, on new weights and beyond the cap."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trainers.engines.base import GenerationRequest, GenerationResult
from trainers.engines.hf import HFEngine
from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm

CORPUS = ["the mayor of the city by the river met the painter <tool_response> at noon"] * 30
# Re-encoding and cached prefill sum attention in different orders: float32 rounding only
# (worst seen: 1.03e-5 on one token of ~100 sampled ones; a wrong cache position or mask
# is off by 1e-2 or more).
TOLERANCE = 2e-5


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_chatml_tokenizer(CORPUS, vocab_size=320)


@pytest.fixture(scope="module")
def model(tokenizer: Any) -> Any:
    # A wide init spread makes a random model's greedy output vary from step to step.
    return build_tiny_causal_lm(tokenizer, hidden=64, layers=2, seed=0, initializer_range=0.3)


def _openings(tokenizer: Any) -> list[list[int]]:
    return [tokenizer.encode(text) for text in
            ("the mayor", "the city by the river met the painter at noon",
             "painter at noon the mayor of")]


def _reply(tokenizer: Any, turn: int, row: int) -> list[int]:
    # Replies of different lengths per row and turn, so row lengths drift apart.
    return tokenizer.encode(" ".join(["the river", "met", "at noon the city"][(turn + row) % 3]
                                     for _ in range(1 + row)))


def _play(engine: HFEngine, tokenizer: Any, settings: dict[str, Any], turns: int = 4
          ) -> list[list[tuple[list[int], list[float]]]]:
    """Several turns of three conversations in one batch; each next prompt is the prompt,
    the generated ids and a reply. Rows stop after different numbers of tokens."""
    prompts = _openings(tokenizer)
    played = []
    for turn in range(turns):
        requests = [GenerationRequest(prompt, max_new_tokens=4 + 3 * row,
                                      seed=None if "seed" not in settings else
                                      settings["seed"] + 10 * turn + row,
                                      **{k: v for k, v in settings.items() if k != "seed"})
                    for row, prompt in enumerate(prompts)]
        results = engine.generate(requests)
        played.append([(r.token_ids, r.logprobs) for r in results])
        prompts = [prompt + result.token_ids + _reply(tokenizer, turn, row)
                   for row, (prompt, result) in enumerate(zip(prompts, results))]
    return played


@pytest.mark.parametrize("settings", [{"temperature": 0.0},
                                      {"temperature": 1.0, "seed": 11},
                                      {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "seed": 3}],
                         ids=["greedy", "sampled", "top-p-top-k"])
def test_kept_caches_give_the_ids_and_logprobs_of_re_encoding(model, tokenizer, settings):
    cached = HFEngine(model, tokenizer)
    # The engine before kept caches, reserved decode buffers and lean decode steps.
    plain = HFEngine(model, tokenizer, kv_cache=False, reserve_decode=False, lean_decode=False)
    with_cache = _play(cached, tokenizer, settings)
    re_encoded = _play(plain, tokenizer, settings)
    worst = 0.0
    for turn_cached, turn_plain in zip(with_cache, re_encoded):
        for (ids, logprobs), (ids_plain, logprobs_plain) in zip(turn_cached, turn_plain):
            assert ids == ids_plain
            worst = max([worst] + [abs(a - b) for a, b in zip(logprobs, logprobs_plain)])
    assert worst < TOLERANCE
    # The cache did the work: after the first turn only replies (and the last generated id,
    # which never went through the model) were prefilled.
    assert plain.cache_stats.reused_tokens == 0
    assert cached.cache_stats.reused_tokens > 2 * cached.cache_stats.prefilled_tokens
    assert cached.cached_conversations == 3
    assert len({tuple(ids) for turn in with_cache for ids, _ in turn}) > 3  # varied output


def test_only_the_new_ids_are_prefilled(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    prompt = _openings(tokenizer)[1]
    first = engine.generate([GenerationRequest(prompt, max_new_tokens=6, temperature=0)])[0]
    assert engine.cache_stats.prefilled_tokens == len(prompt)
    reply = _reply(tokenizer, 0, 1)
    engine.generate([GenerationRequest(prompt + first.token_ids + reply, max_new_tokens=3,
                                       temperature=0)])
    # The last generated id was sampled, not yet fed: it is prefilled with the reply.
    assert engine.cache_stats.reused_tokens == len(prompt) + len(first.token_ids) - 1
    assert engine.cache_stats.prefilled_tokens == len(prompt) + 1 + len(reply)


def test_a_prompt_that_does_not_extend_a_kept_conversation_falls_back(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    plain = HFEngine(model, tokenizer, kv_cache=False)
    prompt = _openings(tokenizer)[1]
    generated = engine.generate([GenerationRequest(prompt, max_new_tokens=8,
                                                   temperature=0)])[0].token_ids
    history = prompt + generated
    # Another conversation (first id differs), a rewritten history (an id in the middle
    # differs, as a context cut or a forced final turn would) and a shorter prompt.
    other = [tokenizer.encode("painter")[0]] + history[1:]
    rewritten = history[:5] + [history[5] + 1] + history[6:]
    shorter = history[:4]
    expected_reuse = {0: 0, 1: 5, 2: 3}
    for k, new in enumerate((other, rewritten, shorter)):
        before = engine.cache_stats.reused_tokens
        request = GenerationRequest(new, max_new_tokens=6, temperature=0)
        result = engine.generate([request])[0]
        assert engine.cache_stats.reused_tokens - before == expected_reuse[k]
        reference = plain.generate([request])[0]
        assert result.token_ids == reference.token_ids
        assert result.logprobs == pytest.approx(reference.logprobs, abs=TOLERANCE)


def test_rows_reusing_different_amounts_share_a_batch(model, tokenizer):
    """One batch mixing a long kept conversation, a short one and a fresh prompt."""
    engine = HFEngine(model, tokenizer)
    plain = HFEngine(model, tokenizer, kv_cache=False)
    long_prompt, short_prompt, fresh = _openings(tokenizer)[1], _openings(tokenizer)[0], \
        _openings(tokenizer)[2]
    first = engine.generate([GenerationRequest(long_prompt, max_new_tokens=12, temperature=0),
                             GenerationRequest(short_prompt, max_new_tokens=2, temperature=0)])
    requests = [GenerationRequest(long_prompt + first[0].token_ids + [5, 6], max_new_tokens=7,
                                  temperature=0),
                GenerationRequest(fresh, max_new_tokens=9, temperature=0),
                GenerationRequest(short_prompt + first[1].token_ids + [7] * 9, max_new_tokens=5,
                                  temperature=0)]
    for result, reference in zip(engine.generate(requests), plain.generate(requests)):
        assert result.token_ids == reference.token_ids
        assert result.logprobs == pytest.approx(reference.logprobs, abs=TOLERANCE)


def test_caches_are_freed_when_episodes_end_on_new_weights_and_beyond_the_cap(model, tokenizer):
    engine = HFEngine(model, tokenizer, max_cached_conversations=2)
    requests = [GenerationRequest(p, max_new_tokens=3, temperature=0)
                for p in _openings(tokenizer)]
    engine.generate(requests)
    assert engine.cached_conversations == 2  # three conversations, capped at two
    engine.forget_conversations()
    assert engine.cached_conversations == 0
    engine.generate(requests[:1])
    # A conversation extended by the next turn replaces its kept cache rather than adding one.
    result = engine.generate(requests[:1])[0]
    assert engine.cached_conversations == 1
    engine.generate([GenerationRequest(requests[0].prompt_ids + result.token_ids + [4],
                                       max_new_tokens=3, temperature=0)])
    assert engine.cached_conversations == 1
    engine.update_weights(model.state_dict())
    assert engine.cached_conversations == 0
    with pytest.raises(ValueError, match="max_cached_conversations"):
        HFEngine(model, tokenizer, max_cached_conversations=0)


def test_group_rollouts_are_the_same_with_and_without_kept_caches(tokenizer):
    """rollout_group through the real engine (oracle ids forced): identical trajectories,
    and every cache is freed when the group's episodes end."""
    from envs.group import DeepResearchGroupEnv
    from tests.helpers import check_group
    from trainers.engines.scripted import ForcedHFEngine
    from trainers.modeling.tokenization import ChatTokenizer
    from trainers.rollout import SamplingConfig, rollout_group
    from venus_gym.worlds.oracle import OracleAgent

    group = DeepResearchGroupEnv(group_size=3, max_turns=4, world_size=300, world_seed=3)
    world = group.envs[0].world
    texts = [group.system_prompt] + [f"{p.title}\n{p.url}\n{p.text}" for p in world.corpus]
    chat = ChatTokenizer(build_chatml_tokenizer(texts[:300], vocab_size=600))
    lm = build_tiny_causal_lm(chat.tokenizer, hidden=64, layers=2, seed=0)

    def respond(observations: list[str]) -> str:
        agent = OracleAgent(group.task, rng_seed=0, detour_prob=0.5)
        action = ""
        for observation in observations:
            action = agent.act(observation)
        return action

    runs = []
    for kv_cache in (True, False):
        engine = ForcedHFEngine(lm, chat.tokenizer, respond, chat.end_of_turn_id)
        engine.kv_cache = kv_cache
        trajectories = rollout_group(engine, group, chat, seed=4,
                                     sampling=SamplingConfig(max_turn_tokens=300))
        check_group(trajectories, chat)
        assert engine.cached_conversations == 0
        runs.append((trajectories, engine.cache_stats))
    (cached, stats), (plain, plain_stats) = runs
    assert max(len(t.turns) for t in cached) >= 3
    assert stats.reused_tokens > 0 and plain_stats.reused_tokens == 0
    assert stats.prefilled_tokens < plain_stats.prefilled_tokens / 2
    for a, b in zip(cached, plain):
        assert a.input_ids == b.input_ids and a.loss_mask == b.loss_mask
        assert a.rollout_logprobs == pytest.approx(b.rollout_logprobs, abs=TOLERANCE)
    group.close()


def test_kv_cache_helpers_cut_by_slicing():
    from trainers.engines.kv_cache import (
        cache_from_rows,
        cache_rows,
        common_prefix_length,
        reusable_prefix,
    )

    assert common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix_length([1, 2, 3], [1, 9, 3]) == 1
    assert common_prefix_length([], [1]) == 0
    assert reusable_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert reusable_prefix([1, 2, 3, 4], [1, 2, 3]) == 2  # the last prompt id is fed again
    assert reusable_prefix([5], [1, 2]) == 0
    keys = torch.arange(2 * 3 * 5 * 4, dtype=torch.float32).reshape(2, 3, 5, 4)
    cache = cache_from_rows([(keys, -keys)])
    rows = cache_rows(cache)
    assert torch.equal(rows[0][0], keys) and torch.equal(rows[0][1], -keys)
    assert cache.get_seq_length() == 5


def test_reserved_cache_writes_in_place_and_grows_past_its_reserve():
    from trainers.engines.kv_cache import cache_from_rows, cache_rows, reserved_cache

    keys = torch.randn(2, 3, 4, 5)
    cache = reserved_cache(cache_from_rows([(keys, keys + 1)]), 1)
    extra = torch.randn(2, 3, 3, 5)
    cache.update(extra[:, :, :1], extra[:, :, :1] + 1, 0)
    cache.update(extra[:, :, 1:], extra[:, :, 1:] + 1, 0)  # past the reserve: grows
    stored_keys, stored_values = cache_rows(cache)[0]
    assert torch.equal(stored_keys, torch.cat([keys, extra], dim=2))
    assert torch.equal(stored_values, torch.cat([keys, extra], dim=2) + 1)
    assert cache.get_seq_length() == 7


def test_a_retried_turn_reuses_the_common_prefix_of_a_kept_cache(model, tokenizer):
    """A retry sends the same prompt again after a discarded attempt, and a later prompt may
    leave the kept ids: each reuses the common prefix and matches an engine without caches."""
    from trainers.engines.hf import HFEngine

    engine, fresh = HFEngine(model, tokenizer), HFEngine(model, tokenizer, kv_cache=False)
    prompt = _openings(tokenizer)[1]

    def turn(which: HFEngine, ids: list[int]) -> GenerationResult:
        return which.generate([GenerationRequest(ids, max_new_tokens=10, temperature=0.0)])[0]

    attempt = turn(engine, prompt)
    extended = prompt + attempt.token_ids + _reply(tokenizer, 0, 0)
    for new in (prompt, extended, prompt + _reply(tokenizer, 1, 2), extended):
        reused = engine.cache_stats.reused_tokens
        result = turn(engine, new)
        assert engine.cache_stats.reused_tokens > reused  # some prefix came from a kept cache
        expected = turn(fresh, new)
        assert result.token_ids == expected.token_ids
        assert result.logprobs == pytest.approx(expected.logprobs, abs=TOLERANCE)


@pytest.mark.parametrize("arch,shape", [("qwen3", {}), ("llama", {"kv_heads": 1}),
                                        ("qwen2", {"kv_heads": 1})],
                         ids=["qwen3", "llama-gqa", "qwen2-bias-gqa"])
def test_lean_decode_gives_the_ids_and_logprobs_of_the_transformers_forward(tokenizer, arch,
                                                                            shape):
    """trainers.engines.lean_decode runs the decode steps (the model's forward only prefills);
    three rows of different lengths, stopping after different numbers of tokens (finished
    rows are fed padding), over several turns of kept caches."""
    from trainers.engines.lean_decode import lean_decode_supported

    lm = build_tiny_causal_lm(tokenizer, arch=arch, hidden=64, layers=2, seed=0,
                              initializer_range=0.3, **shape)
    assert lean_decode_supported(lm)
    forwards = []
    hook = lm.register_forward_hook(lambda module, args, output: forwards.append(1))
    try:
        lean = _play(HFEngine(lm, tokenizer), tokenizer, {"temperature": 0.0})
        lean_forwards = len(forwards)
        plain = _play(HFEngine(lm, tokenizer, lean_decode=False), tokenizer, {"temperature": 0.0})
    finally:
        hook.remove()
    assert lean_forwards == 4  # one prefill per turn; every decode step ran lean
    # Through the transformers forward: a prefill and 9 decode steps per turn (the longest
    # row's 10 tokens; the last one is never fed).
    assert len(forwards) - lean_forwards == 4 * 10
    worst = 0.0
    for turn_lean, turn_plain in zip(lean, plain):
        for (ids, logprobs), (ids_plain, logprobs_plain) in zip(turn_lean, turn_plain):
            assert ids == ids_plain
            worst = max([worst] + [abs(a - b) for a, b in zip(logprobs, logprobs_plain)])
    assert worst < TOLERANCE
    assert len({tuple(ids) for turn in lean for ids, _ in turn}) > 3  # varied output


def test_lean_decode_is_refused_for_sliding_window_layers(tokenizer):
    from trainers.engines.lean_decode import lean_decode_supported

    lm = build_tiny_causal_lm(tokenizer, arch="qwen2", hidden=64, layers=2, seed=0,
                              use_sliding_window=True, sliding_window=4,
                              layer_types=["sliding_attention", "sliding_attention"])
    assert not lean_decode_supported(lm)
    assert lean_decode_supported(build_tiny_causal_lm(tokenizer, arch="qwen2", hidden=64,
                                                      layers=2, seed=0))


def test_batched_log_probs_equal_the_per_row_ones_bit_for_bit():
    from trainers.engines.sampling import batch_log_probs, sample_token

    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(0)) * 5
    temperatures = [0.0, 1.0, 0.8, 0.37]
    batched = batch_log_probs(logits, temperatures)
    for row, temperature in zip(range(4), temperatures):
        per_row = torch.log_softmax(logits[row] / temperature if temperature > 0
                                    else logits[row], dim=-1)
        assert torch.equal(batched[row], per_row)
        seed = 5 + row
        assert sample_token(logits[row], temperature=temperature, top_p=0.9, seed=seed,
                            log_probs=batched[row]) == \
            sample_token(logits[row], temperature=temperature, top_p=0.9, seed=seed)
