"""Convert stage: DR-Venus / OpenAI-style records and our own trajectories -> Trajectory."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.test_data_fixtures import (
    drvenus_record,
    search,
    tool_reply,
    tool_turn,
    visit,
    write_lines,
)
from trainers.data.convert import (
    ConversionError,
    convert_drvenus_record,
    count_turns,
    detect_format,
    extract_answer,
    extract_tool_call,
    read_inputs,
)
from trainers.trajectory import Trajectory, check_invariants, write_trajectories
from venus_gym.corpus import DataFormatError
from venus_gym.protocol import (
    DEFAULT_TOOLS,
    format_answer_turn,
    format_tool_response,
    format_tool_turn,
    render_system_prompt,
)

TOOLS = DEFAULT_TOOLS


def test_drvenus_record_gets_our_system_prompt_and_annotated_turns():
    record = drvenus_record("r1", [search("capital France"), ("python", {"code": "1+1"}),
                                   visit("https://fr.example/paris")], "Paris")
    trajectory = convert_drvenus_record(record, "fallback", TOOLS)
    check_invariants(trajectory)
    assert trajectory.id == "r1"
    assert trajectory.answers == ["Paris"]
    assert trajectory.question == "What is the capital of France?"
    # The source prompt is replaced, its date kept.
    assert trajectory.messages[0] == {"role": "system",
                                      "content": render_system_prompt(TOOLS, "2025-06-01")}
    assert trajectory.messages[1] == {"role": "user", "content": "What is the capital of France?"}
    assert trajectory.messages[2:] == record["messages"][2:]
    # python is not offered by our prompt, so that turn is invalid until pruned.
    assert trajectory.turn_kinds == ["search", "invalid", "visit", "answer"]
    assert count_turns(trajectory) == 4
    assert extract_answer(trajectory) == "Paris"


def test_prompt_date_override_and_missing_id_uses_fallback():
    record = drvenus_record("x", [search("a")], "Paris")
    del record["id"]
    trajectory = convert_drvenus_record(record, "file-7", TOOLS, prompt_date="2030-01-01")
    assert trajectory.id == "file-7"
    assert trajectory.messages[0]["content"].endswith("Current date: 2030-01-01")


def test_openai_style_record_is_brought_into_our_protocol():
    record = {
        "id": "oa",
        "answer": ["Paris", "Paris, France"],
        "messages": [
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": None, "reasoning_content": "Search first.",
             "tool_calls": [{"type": "function", "function": {
                 "name": "search", "arguments": "{\"query\": [\"capital of France\"]}"}}]},
            {"role": "tool", "content": "1. [Paris](https://p) capital"},
            {"role": "assistant", "content": "It is Paris.\n</think>\n<answer>\nParis\n</answer>"},
        ],
    }
    counters: Counter[str] = Counter()
    trajectory = convert_drvenus_record(record, "f", TOOLS, counters=counters)
    assert trajectory.messages[2:] == [
        {"role": "assistant",
         "content": format_tool_turn("Search first.", "search", {"query": ["capital of France"]})},
        {"role": "user", "content": format_tool_response("1. [Paris](https://p) capital")},
        # Qwen3 exports start inside the think block: the opening tag is restored.
        {"role": "assistant", "content": format_answer_turn("It is Paris.", "Paris")},
    ]
    assert trajectory.turn_kinds == ["search", "answer"]
    assert trajectory.answers == ["Paris", "Paris, France"]
    assert trajectory.messages[0]["content"] == render_system_prompt(TOOLS)
    assert counters == {"reasoning_content_converted": 1, "openai_tool_calls_converted": 1,
                        "tool_role_messages_converted": 1, "think_tags_restored": 1}


def test_bare_user_tool_reply_is_wrapped_and_counted():
    record = drvenus_record("b", [search("q")], "Paris")
    record["messages"][3]["content"] = "raw result text"
    counters: Counter[str] = Counter()
    trajectory = convert_drvenus_record(record, "f", TOOLS, counters=counters)
    assert trajectory.messages[3]["content"] == format_tool_response("raw result text")
    assert counters["bare_tool_replies_wrapped"] == 1


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.update(messages=[]), "no non-empty 'messages'"),
    (lambda r: r["messages"].__setitem__(1, {"role": "critic", "content": "x"}), "'critic'"),
    (lambda r: r["messages"][2].update(tool_calls=[{"function": {"name": "search"}}] * 2),
     "2 tool calls in one assistant message"),
])
def test_unconvertible_records_raise(mutate, message):
    record = drvenus_record("bad", [search("q")], "Paris")
    mutate(record)
    with pytest.raises(ConversionError, match=message):
        convert_drvenus_record(record, "f", TOOLS)


def test_malformed_line_names_file_and_line_and_skip_bad_lists_it(tmp_path):
    path = write_lines(tmp_path / "src.jsonl", [
        drvenus_record("a", [search("q")], "Paris"),
        "{not json",
        drvenus_record("c", [search("q")], "Paris") | {"messages": "oops"},
        drvenus_record("d", [visit("u")], "Paris"),
    ])
    with pytest.raises(DataFormatError, match=rf"^{path}:2: "):
        list(read_inputs([path], TOOLS))
    bad: list[str] = []
    kept = list(read_inputs([path], TOOLS, skip_bad=True, bad_lines=bad))
    assert [t.id for t in kept] == ["a", "d"]
    assert len(bad) == 2
    assert bad[0].startswith(f"{path}:2: ")
    assert bad[1].startswith(f"{path}:3: ") and "messages" in bad[1]


def test_our_trajectories_pass_through_unchanged(tmp_path):
    ours = convert_drvenus_record(drvenus_record("own", [search("q")], "Paris"), "f", TOOLS)
    assert detect_format(ours.to_json()) == "trajectory"
    assert detect_format(drvenus_record("x", [], "P")) == "drvenus"
    bare = {"id": "x", "messages": ours.messages[1:]}  # DR-Venus shape that fits our keys
    assert detect_format(bare) == "drvenus"
    path = tmp_path / "ours.jsonl"
    write_trajectories(path, [ours])
    counters: Counter[str] = Counter()
    [read_back] = read_inputs([path], TOOLS, counters=counters)
    assert read_back == ours
    assert counters == {"records_trajectory": 1}


def test_schema_breaking_trajectory_line_is_a_bad_line(tmp_path):
    ours = convert_drvenus_record(drvenus_record("own", [search("q")], "Paris"), "f", TOOLS)
    data = ours.to_json()
    data["turns"][0]["assistant"] = "not the message"  # breaks check_invariants
    path = write_lines(tmp_path / "ours.jsonl", [data])
    with pytest.raises(DataFormatError, match=rf"{path}:1: .*turn 0's assistant text"):
        list(read_inputs([path], TOOLS, input_format="trajectory"))


def test_extract_tool_call_is_lenient_about_tool_names_only():
    assert extract_tool_call(tool_turn(0, ("python", {"code": "x"}))) == ("python", {"code": "x"})
    assert extract_tool_call('<tool_call>{"name": "s", "arguments": "{\\"a\\": 1}"}</tool_call>'
                             ) == ("s", {"a": 1})
    assert extract_tool_call("<tool_call>{broken</tool_call>") is None
    assert extract_tool_call('<tool_call>{"arguments": {}}</tool_call>') is None
    assert extract_tool_call(tool_reply(0)) is None


def test_trajectory_fixture_round_trip_is_exact():
    trajectory = convert_drvenus_record(drvenus_record("rt", [search("q")], "Paris"), "f", TOOLS)
    assert Trajectory.from_json(trajectory.to_json()) == trajectory
