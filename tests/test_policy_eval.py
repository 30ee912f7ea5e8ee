"""trainers.policy and trainers.evaluation: episodes played by a policy, and the evaluation summary's cut-turn rate
(turns that hit the token cap without an end-of-turn token: how repetition loops show up)."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import torch

import envs  # noqa: F401  (registers the environments)
from trainers.evaluation import Evaluation, evaluate
from trainers.models import (
    build_chatml_tokenizer,
    build_tiny_causal_lm,
    kv_cache_argument,
    returned_kv_cache,
)
from trainers.policy import (
    GeneratedTurn,
    TransformersPolicy,
    retry_reason,
    run_episode,
)
from trainers.sft.pipeline import build_chat

ENV = {"world_size": 300, "world_seed": 3, "hops": (1,), "max_turns": 2}


class Replies(TransformersPolicy):
    """Returns the given texts in turn, encoded, with or without the end-of-turn id."""

    def __init__(self, model, chat, replies: list[tuple[str, bool]]):
        super().__init__(model, chat)
        self.replies = replies
        self.calls = 0

    def generate_turn(self, prompt_ids):
        text, closed = self.replies[self.calls % len(self.replies)]
        self.calls += 1
        ids = self.chat.tokenizer.encode(text, add_special_tokens=False)
        return GeneratedTurn(ids + [self.chat.end_of_turn_id] * closed, text, [0.0] * (
            len(ids) + closed))


def make_chat():
    return build_chat(build_chatml_tokenizer(["search visit answer think"] * 10,
                                             vocab_size=300))


def test_cut_turns_are_counted_per_episode_and_summarised():
    chat = make_chat()
    model = build_tiny_causal_lm(chat.tokenizer, hidden=32, layers=1, heads=1)
    env = gym.make("DeepResearch-v0", **ENV)
    # max_turns 2: two turns, then the forced final turn; the first and last are cut.
    policy = Replies(model, chat, [("loop loop loop", False), ("<think>x</think>", True),
                                   ("<think>y", False)])
    trajectory, stats = run_episode(env, policy, task_index=0, seed=0)
    assert stats.turns == 3 and stats.cut_turns == 2
    assert trajectory.input_ids[trajectory.turn_spans[0][1]] == chat.end_of_turn_id
    evaluation = evaluate(Replies(model, chat, [("<think>z", False)]), chat, ENV,
                          num_tasks=2, progress=False)
    summary = evaluation.summary()
    assert summary["cut_turn_rate"] == 1.0 and summary["format_valid_rate"] == 0.0


class PastKeyValuesModel(torch.nn.Module):
    """A model as transformers < 5.20 has it: the KV cache goes in and comes out as
    `past_key_values` (5.2x calls both `cache`)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.caches_given: list[bool] = []

    def forward(self, input_ids, position_ids=None, past_key_values=None, use_cache=None,
                logits_to_keep=0):
        self.caches_given.append(past_key_values is not None)
        output = self.inner(input_ids=input_ids, position_ids=position_ids,
                            use_cache=use_cache, logits_to_keep=logits_to_keep,
                            **{kv_cache_argument(self.inner): past_key_values})
        return SimpleNamespace(logits=output.logits, past_key_values=returned_kv_cache(output))


def test_policy_keeps_its_kv_cache_under_either_argument_name():
    chat = make_chat()
    model = build_tiny_causal_lm(chat.tokenizer, hidden=32, layers=1, heads=1, seed=4)
    prompt = chat.tokenizer.encode("search visit answer", add_special_tokens=False)
    expected = TransformersPolicy(model, chat, max_new_tokens=6).generate_turn(prompt)
    old = PastKeyValuesModel(model)
    turn = TransformersPolicy(old, chat, max_new_tokens=6).generate_turn(prompt)
    assert turn.token_ids == expected.token_ids
    assert torch.allclose(torch.tensor(turn.logprobs), torch.tensor(expected.logprobs),
                          atol=1e-5)
    # The prompt goes in without a cache; each generated token (the cut turn has no
    # end-of-turn token) goes in alone with the cache the previous call returned.
    assert turn.token_ids[-1] != chat.end_of_turn_id
    assert old.caches_given == [False] + [True] * len(turn.token_ids)


def test_retries_discard_rejected_attempts_keep_them_on_record_and_count_them():
    from venus_gym.protocol import format_answer_turn, format_tool_turn

    chat = make_chat()
    model = build_tiny_causal_lm(chat.tokenizer, hidden=32, layers=1, heads=1)
    env = gym.make("DeepResearch-v0", **{**ENV, "max_turns": 4})
    search = format_tool_turn("Look it up.", "search", {"query": ["alpha"]})
    answer = format_answer_turn("Done.", "beta")
    # Turn 1: a malformed attempt, then the search. Turn 2: the same search again (a
    # duplicate call), then the answer.
    policy = Replies(model, chat, [("<think>x", False), (search, True), (search, True),
                                   (answer, True)])
    trajectory, stats = run_episode(env, policy, task_index=0, seed=0, max_retries=2)
    assert policy.calls == 4
    assert (stats.turns, stats.valid_turns, stats.retried_turns, stats.cut_turns) == (2, 2, 2, 1)
    assert [t.kind for t in trajectory.turns] == ["search", "answer"]
    discarded = trajectory.metadata["discarded_turns"]
    assert [(d["turn"], d["attempt"], d["reason"]) for d in discarded] == [
        (1, 1, "malformed"), (2, 1, "duplicate tool call")]
    assert discarded[0]["text"] == "<think>x" and discarded[0]["cut"]
    # Discarded attempts never enter the conversation the model and the env see.
    assistant = [m["content"] for m in trajectory.messages if m["role"] == "assistant"]
    assert assistant == [search, answer]
    assert [text for role, text in env.unwrapped.transcript if role == "assistant"] == [
        search, answer]
    summary = Evaluation(per_task=[[trajectory]]).summary()
    assert summary["format_valid_rate"] == 0.5  # 2 valid of 4 generated turns
    assert summary["retried_turn_rate"] == 0.5 and summary["cut_turn_rate"] == 0.25


def test_retries_send_the_last_attempt_whatever_it_is():
    chat = make_chat()
    model = build_tiny_causal_lm(chat.tokenizer, hidden=32, layers=1, heads=1)
    env = gym.make("DeepResearch-v0", **ENV)  # max_turns 2, then the forced final turn
    policy = Replies(model, chat, [("", True)])
    trajectory, stats = run_episode(env, policy, task_index=0, seed=0, max_retries=2)
    assert (stats.turns, stats.retried_turns, policy.calls) == (3, 6, 9)
    assert {d["reason"] for d in trajectory.metadata["discarded_turns"]} == {"empty"}
    assert not any(t.valid for t in trajectory.turns)
    with_retries = Evaluation(per_task=[[trajectory]]).summary()
    assert with_retries["format_valid_rate"] == 0.0 and with_retries["retried_turn_rate"] == 6 / 9
    _, plain = run_episode(env, Replies(model, chat, [("", True)]), task_index=0, seed=0)
    assert plain.retried_turns == 0 and plain.turns == 3
    evaluation = evaluate(Replies(model, chat, [("", True)]), chat, ENV, num_tasks=2,
                          progress=False, max_retries=1)
    assert evaluation.summary()["retried_turn_rate"] == 0.5  # 3 retried of 6 per episode
    assert all(len(t.metadata["discarded_turns"]) == 3 for t in evaluation.trajectories)


def test_retry_reason_follows_dr_venus_conditions():
    from venus_gym.protocol import format_tool_turn, parse_turn, tool_call_key

    search = format_tool_turn("Look.", "search", {"query": ["alpha"]})
    parsed = parse_turn(search)
    assert retry_reason(search, True, parsed, set()) == ""
    assert retry_reason(search, True, parsed, {tool_call_key(parsed.tool_call)}) == \
        "duplicate tool call"
    assert retry_reason(" \n", False, parse_turn(" \n"), set()) == "empty"
    loop = "<think>" + "the same words again " * 20
    assert retry_reason(loop, False, parse_turn(loop), set()) == "repetition"
    assert retry_reason("<think>x", False, parse_turn("<think>x"), set()) == "malformed"


def test_a_retried_turn_is_generated_from_its_prompt_again():
    """The retry's prompt is the cache minus the discarded attempt: the policy must not
    continue from the attempt's ids, it must decode as a fresh policy would."""
    chat = make_chat()
    torch.manual_seed(0)
    model = build_tiny_causal_lm(chat.tokenizer, hidden=32, layers=2, heads=2)
    policy = TransformersPolicy(model, chat, max_new_tokens=6)
    prompt = chat.tokenizer.encode("search visit answer think " * 5, add_special_tokens=False)
    first = policy.generate_turn(prompt)
    again = policy.generate_turn(prompt)
    fresh = TransformersPolicy(model, chat, max_new_tokens=6).generate_turn(prompt)
    assert again.token_ids == first.token_ids == fresh.token_ids
    assert torch.allclose(torch.tensor(again.logprobs), torch.tensor(fresh.logprobs), atol=1e-5)
    # An attempt that ends at once (end-of-turn first) leaves the cache exactly at the
    # prompt: the retry must not run the prompt's last id a second time.
    primed = TransformersPolicy(model, chat, max_new_tokens=6)
    primed._forward(prompt)
    retried = primed.generate_turn(prompt)
    assert retried.token_ids == fresh.token_ids
    assert torch.allclose(torch.tensor(retried.logprobs), torch.tensor(fresh.logprobs),
                          atol=1e-5)
    # The usual case still extends the cache: a longer prompt keeps the cached ids.
    longer = prompt + first.token_ids
    policy.generate_turn(longer)
    assert policy._cached_ids[:len(longer)] == longer
