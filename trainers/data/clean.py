"""Stages 2 and 3 of the SFT data pipeline: prune disallowed tools, drop duplicate calls.

Prune (turn level, design.md "SFT"): an assistant turn that calls a tool outside
the kept set (e.g. "python", "google_scholar") is removed together with its response (the
message right after it, when that is not an assistant message); the rest of the trajectory
is kept. Turns whose tool call does not parse are not "disallowed calls" and are kept (the
turn annotation marks them invalid; the correctness filter and the SFT masks see them).

Dedup: within one trajectory, a tool interaction that repeats an earlier one is removed
with its response. Two calls are the same interaction when they name the same tool with
the same *set* of queries (search) or URLs (visit): order and repeats inside the list do
not matter, surrounding whitespace is ignored, and visit's `goal` is ignored (the pages
read are what matters). For other kept tools the whole argument object is compared. The
first occurrence is kept.

Both stages count what they removed, by tool; a trajectory they change is rebuilt with
`convert.with_messages` (turns re-annotated, token-level view dropped).

Where we deviate from DR-Venus and why
* The duplicate key is order-insensitive (a set), matching the paper's description, while
  `venus_gym.protocol.tool_call_key` (the inference-time retry check) compares the exact
  sorted-key JSON. Training data wants the broader notion: re-issuing the same queries in
  another order teaches nothing new.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from trainers.data.convert import extract_tool_call, with_messages
from trainers.trajectory import Trajectory

# The list argument that identifies what a tool interaction fetched.
_IDENTIFYING_LIST_ARGUMENT = {"search": "query", "visit": "url"}


def _removal_span(messages: Sequence[dict[str, Any]], at: int) -> int:
    """How many messages to remove at assistant message `at`: the call and its response."""
    has_response = at + 1 < len(messages) and messages[at + 1]["role"] != "assistant"
    return 2 if has_response else 1


def prune_trajectory(trajectory: Trajectory, tools: Sequence[str]
                     ) -> tuple[Trajectory, Counter[str]]:
    """Remove every turn calling a tool outside `tools`, with its response.

    Returns the (possibly unchanged, same object) trajectory and the number of removed
    turns per disallowed tool name.
    """
    allowed = set(tools)
    removed: Counter[str] = Counter()
    kept: list[dict[str, Any]] = []
    messages = trajectory.messages
    at = 0
    while at < len(messages):
        message = messages[at]
        call = extract_tool_call(message["content"]) if message["role"] == "assistant" else None
        if call is not None and call[0] not in allowed:
            removed[call[0]] += 1
            at += _removal_span(messages, at)
            continue
        kept.append(message)
        at += 1
    if not removed:
        return trajectory, removed
    return with_messages(trajectory, kept, tools), removed


def interaction_key(name: str, arguments: dict[str, Any]) -> tuple[str, Any]:
    """What makes two tool interactions the same (module docstring)."""
    list_argument = _IDENTIFYING_LIST_ARGUMENT.get(name)
    items = arguments.get(list_argument) if list_argument else None
    if isinstance(items, str):
        items = [items]
    if isinstance(items, list) and all(isinstance(item, str) for item in items):
        return name, frozenset(item.strip() for item in items)
    return name, json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def dedup_trajectory(trajectory: Trajectory, tools: Sequence[str]
                     ) -> tuple[Trajectory, Counter[str]]:
    """Remove repeated tool interactions (keep the first) with their responses.

    Returns the (possibly unchanged, same object) trajectory and the number of removed
    interactions per tool name.
    """
    seen: set[tuple[str, Any]] = set()
    removed: Counter[str] = Counter()
    kept: list[dict[str, Any]] = []
    messages = trajectory.messages
    at = 0
    while at < len(messages):
        message = messages[at]
        call = extract_tool_call(message["content"]) if message["role"] == "assistant" else None
        if call is not None:
            key = interaction_key(*call)
            if key in seen:
                removed[call[0]] += 1
                at += _removal_span(messages, at)
                continue
            seen.add(key)
        kept.append(message)
        at += 1
    if not removed:
        return trajectory, removed
    return with_messages(trajectory, kept, tools), removed


def prune_stream(trajectories: Iterable[Trajectory], tools: Sequence[str],
                 removed_turns: Counter[str], changed: Counter[str]) -> Iterator[Trajectory]:
    """`prune_trajectory` over a stream; adds removed turns per tool to `removed_turns` and
    the number of changed trajectories to changed["trajectories"]."""
    for trajectory in trajectories:
        pruned, removed = prune_trajectory(trajectory, tools)
        if removed:
            removed_turns.update(removed)
            changed["trajectories"] += 1
        yield pruned


def dedup_stream(trajectories: Iterable[Trajectory], tools: Sequence[str],
                 removed_interactions: Counter[str], changed: Counter[str]
                 ) -> Iterator[Trajectory]:
    """`dedup_trajectory` over a stream; counts like `prune_stream`."""
    for trajectory in trajectories:
        deduped, removed = dedup_trajectory(trajectory, tools)
        if removed:
            removed_interactions.update(removed)
            changed["trajectories"] += 1
        yield deduped
