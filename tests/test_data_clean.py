"""Prune (disallowed tools, turn level) and dedup (repeated tool interactions)."""

from __future__ import annotations

import dataclasses
from collections import Counter

from tests.test_data_fixtures import drvenus_record, search, tool_reply, tool_turn, visit
from trainers.data.clean import (
    dedup_stream,
    dedup_trajectory,
    interaction_key,
    prune_stream,
    prune_trajectory,
)
from trainers.data.convert import convert_drvenus_record
from trainers.trajectory import Trajectory, check_invariants
from venus_gym.protocol import DEFAULT_TOOLS

TOOLS = DEFAULT_TOOLS


def converted(steps, final_answer="Paris", record_id="t") -> Trajectory:
    return convert_drvenus_record(drvenus_record(record_id, steps, final_answer), "f", TOOLS)


def test_prune_removes_disallowed_calls_with_their_responses():
    steps = [search("a"), ("python", {"code": "2+2"}), visit("u1"),
             ("google_scholar", {"query": ["x"]}), ("python", {"code": "3"}), search("b")]
    trajectory = converted(steps)
    pruned, removed = prune_trajectory(trajectory, TOOLS)
    assert removed == {"python": 2, "google_scholar": 1}
    head = trajectory.messages[:2]
    # Steps 0, 2 and 5 stay, each with its own response; the answer stays.
    expected = head + [
        {"role": "assistant", "content": tool_turn(0, steps[0])},
        {"role": "user", "content": tool_reply(0)},
        {"role": "assistant", "content": tool_turn(2, steps[2])},
        {"role": "user", "content": tool_reply(2)},
        {"role": "assistant", "content": tool_turn(5, steps[5])},
        {"role": "user", "content": tool_reply(5)},
        trajectory.messages[-1],
    ]
    assert pruned.messages == expected
    assert pruned.turn_kinds == ["search", "visit", "search", "answer"]
    check_invariants(pruned)
    assert trajectory.turn_kinds.count("invalid") == 3  # the input is untouched


def test_prune_of_a_last_call_without_response_removes_only_the_call():
    trajectory = converted([search("a"), ("python", {"code": "1"})], final_answer=None)
    trajectory = dataclasses.replace(trajectory, messages=trajectory.messages[:-1], turns=[])
    pruned, removed = prune_trajectory(trajectory, TOOLS)
    assert removed == {"python": 1}
    assert [m["role"] for m in pruned.messages] == ["system", "user", "assistant", "user"]


def test_prune_keeps_unparseable_calls_and_returns_clean_trajectories_as_is():
    trajectory = converted([search("a")])
    broken = trajectory.messages[:2] + [
        {"role": "assistant", "content": "<think>\nx\n</think>\n<tool_call>\n{oops\n</tool_call>"},
        {"role": "user", "content": tool_reply(0)}] + trajectory.messages[2:]
    with_broken = dataclasses.replace(trajectory, messages=broken, turns=[])
    pruned, removed = prune_trajectory(with_broken, TOOLS)
    assert not removed and pruned is with_broken


def test_dedup_drops_repeats_by_tool_and_query_set_keeping_the_first():
    steps = [search("a", "b"), visit("u1", goal="g1"), search("b", " a", "b"), search("a"),
             visit("u1", goal="another goal"), visit("u1", "u2"), search("a", "b", "c")]
    trajectory = converted(steps)
    deduped, removed = dedup_trajectory(trajectory, TOOLS)
    # Step 2 repeats step 0 (same set, order/whitespace/repeats ignored); step 4 repeats
    # step 1 (goal ignored). Steps 3, 5 and 6 are new sets.
    assert removed == {"search": 1, "visit": 1}
    kept_steps = [0, 1, 3, 5, 6]
    assert deduped.messages[2:-1] == [
        message for i in kept_steps for message in (
            {"role": "assistant", "content": tool_turn(i, steps[i])},
            {"role": "user", "content": tool_reply(i)})]
    assert deduped.messages[-1] == trajectory.messages[-1]
    assert len(deduped.turns) == 6
    check_invariants(deduped)


def test_interaction_key_for_other_tools_compares_whole_arguments():
    assert interaction_key("python", {"code": "1", "x": 2}) == interaction_key(
        "python", {"x": 2, "code": "1"})
    assert interaction_key("python", {"code": "1"}) != interaction_key("python", {"code": "2"})
    assert interaction_key("search", {"query": ["a"]}) != interaction_key("visit", {"url": ["a"]})


def test_changed_trajectories_lose_token_view_and_streams_count():
    plain = converted([search("a")], record_id="plain")
    repeated = converted([search("a"), search("a"), search("a")], record_id="rep")
    # A stand-in token view: any change of messages must drop it.
    repeated = dataclasses.replace(repeated, input_ids=[1, 2], loss_mask=[0, 1])
    per_tool: Counter[str] = Counter()
    changed: Counter[str] = Counter()
    out = list(dedup_stream([plain, repeated], TOOLS, per_tool, changed))
    assert [t.id for t in out] == ["plain", "rep"]
    assert out[0] is plain
    assert out[1].input_ids is None and out[1].loss_mask is None
    assert per_tool == {"search": 2} and changed == {"trajectories": 1}
    per_tool.clear()
    changed.clear()
    list(prune_stream([plain, converted([("python", {"c": 1})])], TOOLS, per_tool, changed))
    assert per_tool == {"python": 1} and changed == {"trajectories": 1}
