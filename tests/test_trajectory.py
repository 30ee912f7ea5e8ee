"""Tests for trainers.trajectory: the schema, its JSONL form, and the invariant checker.

Each invariant test starts from one good trajectory (built token in, token out with the
local ChatML tokenizer), breaks exactly one rule, and checks that the checker names it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainers.batch import TurnKind
from trainers.modeling.models import build_chatml_tokenizer
from trainers.modeling.tokenization import ChatTokenizer, ConversationBuilder
from trainers.trajectory import (
    TURN_KINDS,
    Trajectory,
    TrajectoryInvariantError,
    Turn,
    check_invariants,
    read_trajectories,
    token_rewards,
    write_trajectories,
)
from venus_gym.corpus import DataFormatError
from venus_gym.protocol import (
    format_answer_turn,
    format_error_notice,
    format_tool_response,
    format_tool_turn,
    render_system_prompt,
)

SEARCH = format_tool_turn("Search first.", "search", {"query": ["Ada Lovelace birthplace"]})
BROKEN = "<think>\nno closing tag"
VISIT = format_tool_turn("Read it.", "visit", {"url": ["https://venus.world/wiki/Ada"],
                                                "goal": "birthplace"})
ANSWER = format_answer_turn("The page says London.", "London")
REPLIES = [format_tool_response("1. [Ada](https://venus.world/wiki/Ada)\nA mathematician."),
           format_error_notice("no closing </think> tag"),
           format_tool_response("Evidence in page: born in London. ünïcödé 日本")]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_chatml_tokenizer([render_system_prompt(), SEARCH, VISIT, ANSWER, *REPLIES] * 3)


@pytest.fixture(scope="module")
def chat(tokenizer: Any) -> ChatTokenizer:
    return ChatTokenizer(tokenizer)


@pytest.fixture(scope="module")
def good_trajectory(tokenizer: Any, chat: ChatTokenizer) -> Trajectory:
    question = "Where was Ada Lovelace born?"
    prompt = [{"role": "system", "content": render_system_prompt()},
              {"role": "user", "content": question}]
    builder = ConversationBuilder(chat, prompt)
    for k, text in enumerate([SEARCH, BROKEN, VISIT, ANSWER]):
        ids = tokenizer.encode(text, add_special_tokens=False) + [chat.end_of_turn_id]
        builder.add_generation(ids, text, [-0.1 * (k + 1)] * len(ids))
        if k < len(REPLIES):
            builder.add_env_reply(REPLIES[k])
    turns = [
        Turn("search", True, SEARCH, REPLIES[0], ig_reward=0.25),
        Turn("invalid", False, BROKEN, REPLIES[1], reason="no closing </think> tag",
             format_reward=-1.0),
        Turn("visit", True, VISIT, REPLIES[2], ig_reward=0.5),
        Turn("answer", True, ANSWER, None, forced_final=True, outcome_reward=1.0),
    ]
    trajectory = Trajectory(
        id="task-7/0", messages=builder.messages, task_id="task-7", question=question,
        answers=["London", "London, England"], turns=turns, outcome=1.0,
        metadata={"model": "tiny", "seed": 0})
    return trajectory.with_tokens(builder.finish(), builder.rollout_logprobs)


def broken(trajectory: Trajectory, change: Callable[[Trajectory], None]) -> Trajectory:
    copied = copy.deepcopy(trajectory)
    change(copied)
    return copied


def assert_breaks(trajectory: Trajectory, rule: str, tokenizer: Any = None) -> None:
    with pytest.raises(TrajectoryInvariantError) as caught:
        check_invariants(trajectory, tokenizer)
    assert caught.value.rule == rule, str(caught.value)
    assert trajectory.id in str(caught.value) and f"'{rule}'" in str(caught.value)


def first_tool_token(trajectory: Trajectory) -> int:
    """A token inside the first tool response (mask 0)."""
    assert trajectory.turn_spans is not None and trajectory.turn_boundaries is not None
    return trajectory.turn_boundaries[0] - 3


# --- the good trajectory ---------------------------------------------------------------
def test_good_trajectory_passes_every_check(good_trajectory: Trajectory, tokenizer: Any,
                                            chat: ChatTokenizer) -> None:
    check_invariants(good_trajectory)
    check_invariants(good_trajectory, tokenizer)
    check_invariants(good_trajectory, chat)
    assert good_trajectory.turn_kinds == ["search", "invalid", "visit", "answer"]
    assert good_trajectory.turn_rewards == [0.25, -1.0, 0.5, 1.0]


def test_text_only_trajectory_passes(good_trajectory: Trajectory) -> None:
    text_only = Trajectory(id="sft-1", messages=good_trajectory.messages,
                           turns=good_trajectory.turns)
    check_invariants(text_only)
    assert not text_only.has_tokens


def test_turn_kinds_match_the_batch_codes() -> None:
    assert list(TURN_KINDS) == [kind.name.lower() for kind in TurnKind]


def test_token_rewards_land_on_each_turns_last_policy_token(good_trajectory: Trajectory) -> None:
    rewards = token_rewards(good_trajectory)
    assert good_trajectory.turn_spans is not None and good_trajectory.input_ids is not None
    assert len(rewards) == len(good_trajectory.input_ids)
    expected = {end - 1: turn.reward for turn, (_, end)
                in zip(good_trajectory.turns, good_trajectory.turn_spans)}
    assert {i: r for i, r in enumerate(rewards) if r != 0.0} == expected


# --- each rule, broken once ------------------------------------------------------------
def test_flipped_tool_token_mask_is_caught(good_trajectory: Trajectory) -> None:
    position = first_tool_token(good_trajectory)
    assert good_trajectory.loss_mask is not None and good_trajectory.loss_mask[position] == 0

    def flip(t: Trajectory) -> None:
        assert t.loss_mask is not None
        t.loss_mask[position] = 1
    assert_breaks(broken(good_trajectory, flip), "mask_spans")


def test_policy_token_with_mask_zero_is_caught(good_trajectory: Trajectory) -> None:
    def unmask(t: Trajectory) -> None:
        assert t.loss_mask is not None and t.turn_spans is not None
        t.loss_mask[t.turn_spans[2][0]] = 0
    assert_breaks(broken(good_trajectory, unmask), "mask_spans")


def _untrained_broken_turn(good: Trajectory, chat: ChatTokenizer) -> Trajectory:
    """The good trajectory as SFT data whose malformed turn is kept as context (weight 0)."""
    messages = copy.deepcopy(good.messages)
    at = [i for i, m in enumerate(messages) if m["role"] == "assistant"][1]
    messages[at]["weight"] = 0
    turns = [dataclasses.replace(turn, format_reward=None) for turn in good.turns]
    text = Trajectory(id="sft-2", messages=messages, turns=turns)
    return text.with_tokens(chat.tokenize(messages))


def test_untrained_turn_is_masked_and_passes(good_trajectory: Trajectory,
                                             chat: ChatTokenizer) -> None:
    sft = _untrained_broken_turn(good_trajectory, chat)
    check_invariants(sft, chat)
    assert sft.input_ids == good_trajectory.input_ids
    assert sft.turn_spans == good_trajectory.turn_spans
    assert sft.loss_mask is not None and good_trajectory.loss_mask is not None
    start, end = sft.turn_spans[1]
    assert set(sft.loss_mask[start:end]) == {0}
    assert [m for i, m in enumerate(sft.loss_mask) if not start <= i < end] == \
        [m for i, m in enumerate(good_trajectory.loss_mask) if not start <= i < end]


def test_trained_token_in_an_untrained_turn_is_caught(good_trajectory: Trajectory,
                                                      chat: ChatTokenizer) -> None:
    def train_it(t: Trajectory) -> None:
        assert t.loss_mask is not None and t.turn_spans is not None
        t.loss_mask[t.turn_spans[1][0]] = 1
    assert_breaks(broken(_untrained_broken_turn(good_trajectory, chat), train_it), "mask_spans")


@pytest.mark.parametrize("where, weight", [("assistant", 2), ("assistant", True),
                                           ("user", 0)])
def test_bad_message_weight_is_caught(good_trajectory: Trajectory, where: str,
                                      weight: Any) -> None:
    def weigh(t: Trajectory) -> None:
        next(m for m in t.messages[1:] if m["role"] == where)["weight"] = weight
    assert_breaks(broken(good_trajectory, weigh), "messages")


def test_shifted_span_is_caught(good_trajectory: Trajectory, tokenizer: Any) -> None:
    def shift(t: Trajectory) -> None:
        assert t.turn_spans is not None
        start, end = t.turn_spans[1]
        t.turn_spans[1] = (start + 1, end + 1)
    assert_breaks(broken(good_trajectory, shift), "mask_spans")

    def shift_with_mask(t: Trajectory) -> None:
        # Span, mask and log-probs moved together: only the chat template can tell.
        assert t.turn_spans is not None and t.loss_mask is not None
        assert t.rollout_logprobs is not None
        start, end = t.turn_spans[1]
        t.turn_spans[1] = (start + 1, end + 1)
        t.loss_mask[start], t.loss_mask[end] = 0, 1
        t.rollout_logprobs[start], t.rollout_logprobs[end] = 0.0, t.rollout_logprobs[start]
    shifted = broken(good_trajectory, shift_with_mask)
    check_invariants(shifted)
    assert_breaks(shifted, "template", tokenizer)


def test_wrong_logprob_length_is_caught(good_trajectory: Trajectory) -> None:
    def drop(t: Trajectory) -> None:
        assert t.rollout_logprobs is not None
        t.rollout_logprobs.pop()
    assert_breaks(broken(good_trajectory, drop), "logprobs")


@pytest.mark.parametrize("where, value", [("policy", math.nan), ("policy", 0.5), ("tool", -0.3)])
def test_bad_logprob_values_are_caught(good_trajectory: Trajectory, where: str,
                                       value: float) -> None:
    def corrupt(t: Trajectory) -> None:
        assert t.rollout_logprobs is not None and t.turn_spans is not None
        position = t.turn_spans[0][0] if where == "policy" else first_tool_token(t)
        t.rollout_logprobs[position] = value
    assert_breaks(broken(good_trajectory, corrupt), "logprobs")


def test_mask_length_and_values_are_caught(good_trajectory: Trajectory) -> None:
    def shorten(t: Trajectory) -> None:
        assert t.loss_mask is not None
        t.loss_mask.pop()
    assert_breaks(broken(good_trajectory, shorten), "lengths")

    def two(t: Trajectory) -> None:
        assert t.loss_mask is not None
        t.loss_mask[0] = 2
    assert_breaks(broken(good_trajectory, two), "mask_values")


def test_reward_on_the_wrong_turn_is_caught(good_trajectory: Trajectory) -> None:
    def move_outcome(t: Trajectory) -> None:
        t.turns[0].outcome_reward, t.turns[3].outcome_reward = 1.0, None
    assert_breaks(broken(good_trajectory, move_outcome), "rewards")

    def ig_on_malformed(t: Trajectory) -> None:
        t.turns[1].ig_reward = 0.2
    assert_breaks(broken(good_trajectory, ig_on_malformed), "rewards")

    def ig_on_outcome_turn(t: Trajectory) -> None:
        t.turns[3].ig_reward = 0.2
    assert_breaks(broken(good_trajectory, ig_on_outcome_turn), "rewards")

    def penalty_on_valid(t: Trajectory) -> None:
        t.turns[2].format_reward = -1.0
    assert_breaks(broken(good_trajectory, penalty_on_valid), "rewards")


def test_spans_out_of_order_or_overlapping_are_caught(good_trajectory: Trajectory) -> None:
    def swap(t: Trajectory) -> None:
        assert t.turn_spans is not None
        t.turn_spans[0], t.turn_spans[1] = t.turn_spans[1], t.turn_spans[0]
    assert_breaks(broken(good_trajectory, swap), "spans")

    def overlap(t: Trajectory) -> None:
        assert t.turn_spans is not None
        t.turn_spans[1] = (t.turn_spans[0][1] - 1, t.turn_spans[1][1])
    assert_breaks(broken(good_trajectory, overlap), "spans")

    def missing(t: Trajectory) -> None:
        assert t.turn_spans is not None
        t.turn_spans.pop()
    assert_breaks(broken(good_trajectory, missing), "spans")


def test_boundaries_out_of_place_are_caught(good_trajectory: Trajectory) -> None:
    def inside_span(t: Trajectory) -> None:
        assert t.turn_boundaries is not None and t.turn_spans is not None
        t.turn_boundaries[0] = t.turn_spans[0][1] - 1
    assert_breaks(broken(good_trajectory, inside_span), "boundaries")

    def past_next_turn(t: Trajectory) -> None:
        assert t.turn_boundaries is not None and t.turn_spans is not None
        t.turn_boundaries[1] = t.turn_spans[2][0] + 1
    assert_breaks(broken(good_trajectory, past_next_turn), "boundaries")

    def late_question_end(t: Trajectory) -> None:
        assert t.turn_spans is not None
        t.question_end = t.turn_spans[0][0] + 1
    assert_breaks(broken(good_trajectory, late_question_end), "boundaries")


def test_boundary_moved_within_the_reply_is_caught_by_the_template(
        good_trajectory: Trajectory, tokenizer: Any) -> None:
    def earlier(t: Trajectory) -> None:
        assert t.turn_boundaries is not None
        t.turn_boundaries[0] -= 2
    moved = broken(good_trajectory, earlier)
    check_invariants(moved)
    assert_breaks(moved, "template", tokenizer)


def test_turn_annotations_are_checked(good_trajectory: Trajectory) -> None:
    def wrong_text(t: Trajectory) -> None:
        t.turns[0].assistant = "something else"
    assert_breaks(broken(good_trajectory, wrong_text), "turns")

    def invalid_but_valid(t: Trajectory) -> None:
        t.turns[1].valid = True
    assert_breaks(broken(good_trajectory, invalid_but_valid), "turns")

    def early_answer(t: Trajectory) -> None:
        t.turns[2].kind = "answer"
    assert_breaks(broken(good_trajectory, early_answer), "turns")

    def unknown_kind(t: Trajectory) -> None:
        t.turns[0].kind = "browse"
    assert_breaks(broken(good_trajectory, unknown_kind), "turns")

    def wrong_reply(t: Trajectory) -> None:
        t.turns[3].env_reply = "there is no reply after the answer"
    assert_breaks(broken(good_trajectory, wrong_reply), "turns")

    def one_turn_missing(t: Trajectory) -> None:
        t.turns.pop()
    assert_breaks(broken(good_trajectory, one_turn_missing), "turns")


def test_partial_token_fields_are_caught(good_trajectory: Trajectory) -> None:
    def drop_boundaries(t: Trajectory) -> None:
        t.turn_boundaries = None
    assert_breaks(broken(good_trajectory, drop_boundaries), "token_fields")


def test_changed_tool_token_is_caught_by_the_template(good_trajectory: Trajectory,
                                                      tokenizer: Any) -> None:
    def retoken(t: Trajectory) -> None:
        assert t.input_ids is not None
        position = first_tool_token(t)
        t.input_ids[position] = (t.input_ids[position] + 1) % len(tokenizer)
    changed = broken(good_trajectory, retoken)
    check_invariants(changed)
    assert_breaks(changed, "template", tokenizer)


def test_non_canonical_split_passes_but_wrong_text_does_not(
        good_trajectory: Trajectory, tokenizer: Any, chat: ChatTokenizer) -> None:
    """Engines may sample a different split of the same text; it must spell the message."""
    prompt = good_trajectory.messages[:2]
    builder = ConversationBuilder(chat, prompt)
    byte_ids = [i for ch in ANSWER for i in tokenizer.encode(ch, add_special_tokens=False)]
    assert byte_ids != tokenizer.encode(ANSWER, add_special_tokens=False)
    builder.add_generation(byte_ids + [chat.end_of_turn_id], ANSWER)
    split = Trajectory(id="split", messages=builder.messages).with_tokens(builder.finish())
    check_invariants(split, tokenizer)

    other = tokenizer.encode(ANSWER.replace("London", "Paris"), add_special_tokens=False)
    builder = ConversationBuilder(chat, prompt)
    builder.add_generation(other + [chat.end_of_turn_id], ANSWER)
    assert_breaks(Trajectory(id="lie", messages=builder.messages).with_tokens(builder.finish()),
                  "template", tokenizer)


def test_truncated_turn_passes_the_template_check(good_trajectory: Trajectory, tokenizer: Any,
                                                  chat: ChatTokenizer) -> None:
    builder = ConversationBuilder(chat, good_trajectory.messages[:2])
    cut = tokenizer.encode(SEARCH, add_special_tokens=False)  # stopped by a length limit
    builder.add_generation(cut, SEARCH, [-0.2] * len(cut))
    builder.add_env_reply(REPLIES[0])
    trajectory = Trajectory(id="cut", messages=builder.messages).with_tokens(
        builder.finish(), builder.rollout_logprobs)
    check_invariants(trajectory, tokenizer)
    # The builder closes the cut turn with an end-of-turn token the policy did not sample:
    # it is in the ids (the template needs it) but not a policy token.
    end = trajectory.turn_spans[0][1]
    assert trajectory.input_ids[end] == chat.end_of_turn_id
    assert trajectory.loss_mask[end] == 0 and trajectory.loss_mask[end - 1] == 1


# --- JSONL -------------------------------------------------------------------------------
def test_jsonl_round_trip(tmp_path: Path, good_trajectory: Trajectory) -> None:
    text_only = Trajectory(id="sft-1", messages=good_trajectory.messages,
                           turns=good_trajectory.turns, answers=["London"])
    path = tmp_path / "rollouts" / "trajectories.jsonl"
    assert write_trajectories(path, [good_trajectory, text_only]) == 2
    loaded = read_trajectories(path)
    assert loaded == [good_trajectory, text_only]
    spans = loaded[0].turn_spans
    assert spans is not None and all(isinstance(span, tuple) for span in spans)
    assert "日本" in path.read_text(encoding="utf-8")  # written as UTF-8, not escaped


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def test_malformed_jsonl_lines_name_file_and_line(tmp_path: Path,
                                                  good_trajectory: Trajectory) -> None:
    good = json.dumps(good_trajectory.to_json(), ensure_ascii=False)
    no_id = good_trajectory.to_json()
    del no_id["id"]
    bad_mask = good_trajectory.to_json()
    bad_mask["loss_mask"] = bad_mask["loss_mask"][:-1]
    unknown = {**good_trajectory.to_json(), "rewrad": 1}
    cases = {
        "{not json": "",
        json.dumps(no_id): "missing field 'id'",
        json.dumps(bad_mask): "breaks rule 'lengths'",
        json.dumps(unknown): "unknown trajectory field",
    }
    for bad_line, message in cases.items():
        path = tmp_path / "bad.jsonl"
        _write_lines(path, [good, "", bad_line])
        with pytest.raises(DataFormatError, match=rf"bad\.jsonl:3: .*{message}"):
            read_trajectories(path)

    path = tmp_path / "mixed.jsonl"
    _write_lines(path, [good, *cases])
    errors: list[str] = []
    assert read_trajectories(path, skip_bad=True, errors=errors) == [good_trajectory]
    assert [e.split(": ")[0] for e in errors] == [f"{path}:{n}" for n in range(2, 6)]


def test_bad_field_types_are_refused(good_trajectory: Trajectory) -> None:
    cases = [
        ("input_ids", [1, True], "list of integers"),
        ("turn_spans", [[1, 2, 3]], "turn_spans"),
        ("messages", [{"role": "user"}], r"messages\[0\]"),
        ("turns", [{"kind": "search"}], r"turns\[0\]: missing field 'valid'"),
        ("outcome", "1.0", "must be a number"),
    ]
    for field_name, value, message in cases:
        data = {**good_trajectory.to_json(), field_name: value}
        with pytest.raises(ValueError, match=message):
            Trajectory.from_json(data)


def test_read_without_checks_returns_broken_trajectories(tmp_path: Path,
                                                         good_trajectory: Trajectory) -> None:
    data = good_trajectory.to_json()
    data["loss_mask"] = data["loss_mask"][:-1]
    path = tmp_path / "unchecked.jsonl"
    _write_lines(path, [json.dumps(data)])
    assert len(read_trajectories(path, check=False)) == 1
