"""trainers.rollout.play_episode / rollout_group as the one episode runner of evaluation:
cut turns, DR-Venus turn retries and their record, and the evaluation summary's rates."""

from __future__ import annotations

import gymnasium as gym

import envs  # noqa: F401  (registers the environments)
from tests.helpers import RepliesEngine
from trainers.evaluation.evaluate import Evaluation, evaluate, turn_counts
from trainers.modeling.models import build_chatml_tokenizer
from trainers.rollout import play_episode, retry_reason
from trainers.sft.pipeline import build_chat

ENV = {"world_size": 300, "world_seed": 3, "hops": (1,), "max_turns": 2}


def make_chat():
    return build_chat(build_chatml_tokenizer(["search visit answer think"] * 10,
                                             vocab_size=300))


def test_cut_turns_are_counted_per_episode_and_summarised():
    chat = make_chat()
    env = gym.make("DeepResearch-v0", **ENV)
    # max_turns 2: two turns, then the forced final turn; the first and last are cut.
    engine = RepliesEngine(chat, [("loop loop loop", False), ("<think>x</think>", True),
                                  ("<think>y", False)])
    trajectory = play_episode(engine, env, chat, task_index=0, seed=0)
    counts = turn_counts(trajectory)
    assert counts.turns == 3 and counts.cut == 2
    # A cut turn is closed by the builder with a (mask-0) end-of-turn id.
    assert trajectory.input_ids[trajectory.turn_spans[0][1]] == chat.end_of_turn_id
    evaluation = evaluate(RepliesEngine(chat, [("<think>z", False)]), chat, ENV,
                          num_tasks=2, progress=False)
    summary = evaluation.summary()
    assert summary["cut_turn_rate"] == 1.0 and summary["format_valid_rate"] == 0.0


def test_retries_discard_rejected_attempts_keep_them_on_record_and_count_them():
    from venus_gym.protocol import format_answer_turn, format_tool_turn

    chat = make_chat()
    env = gym.make("DeepResearch-v0", **{**ENV, "max_turns": 4})
    search = format_tool_turn("Look it up.", "search", {"query": ["alpha"]})
    answer = format_answer_turn("Done.", "beta")
    # Turn 1: a malformed attempt, then the search. Turn 2: the same search again (a
    # duplicate call), then the answer.
    engine = RepliesEngine(chat, [("<think>x", False), (search, True), (search, True),
                                  (answer, True)])
    trajectory = play_episode(engine, env, chat, task_index=0, seed=0, max_retries=2)
    assert engine.calls == 4
    counts = turn_counts(trajectory)
    assert (counts.turns, counts.valid, counts.retried, counts.cut) == (2, 2, 2, 1)
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
    env = gym.make("DeepResearch-v0", **ENV)  # max_turns 2, then the forced final turn
    engine = RepliesEngine(chat, [("", True)])
    trajectory = play_episode(engine, env, chat, task_index=0, seed=0, max_retries=2)
    counts = turn_counts(trajectory)
    assert (counts.turns, counts.retried, engine.calls) == (3, 6, 9)
    assert {d["reason"] for d in trajectory.metadata["discarded_turns"]} == {"empty"}
    assert not any(t.valid for t in trajectory.turns)
    with_retries = Evaluation(per_task=[[trajectory]]).summary()
    assert with_retries["format_valid_rate"] == 0.0 and with_retries["retried_turn_rate"] == 6 / 9
    plain = play_episode(RepliesEngine(chat, [("", True)]), env, chat, task_index=0, seed=0)
    assert turn_counts(plain).retried == 0 and turn_counts(plain).turns == 3
    assert "discarded_turns" not in plain.metadata
    evaluation = evaluate(RepliesEngine(chat, [("", True)]), chat, ENV, num_tasks=2,
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


def test_evaluate_refuses_what_is_not_an_engine():
    import pytest

    chat = make_chat()
    with pytest.raises(TypeError, match="Engine"):
        evaluate(object(), chat, ENV, num_tasks=1)
