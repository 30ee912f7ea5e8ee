"""Small, realistic data-pipeline inputs built by hand (no big files are shipped).

`drvenus_record` writes a REDSearcher-style record: a source system prompt with its own
date line, the question, assistant turns with `<tool_call>` JSON, tool results as user
`<tool_response>` messages, and a final `<answer>`. The helpers here hold no tests.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from venus_gym.protocol import format_answer_turn, format_tool_response, format_tool_turn

SOURCE_SYSTEM_PROMPT = ("You are a web agent. Tools: search, visit, python, google_scholar.\n"
                        "Current date: 2025-06-01")

Step = tuple[str, dict[str, Any]]


def search(*queries: str) -> Step:
    return "search", {"query": list(queries)}


def visit(*urls: str, goal: str = "find the fact") -> Step:
    return "visit", {"url": list(urls), "goal": goal}


def tool_turn(index: int, step: Step) -> str:
    return format_tool_turn(f"Step {index}: I call {step[0]}.", step[0], step[1])


def tool_reply(index: int) -> str:
    return format_tool_response(f"result {index}")


def drvenus_record(record_id: str, steps: Sequence[Step], final_answer: str | None,
                   gold: str | list[str] | None = "Paris",
                   question: str = "What is the capital of France?") -> dict[str, Any]:
    """One source record; final_answer None leaves the conversation without an answer."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SOURCE_SYSTEM_PROMPT},
                                      {"role": "user", "content": question}]
    for index, step in enumerate(steps):
        messages.append({"role": "assistant", "content": tool_turn(index, step)})
        messages.append({"role": "user", "content": tool_reply(index)})
    if final_answer is not None:
        messages.append({"role": "assistant",
                         "content": format_answer_turn("I know it now.", final_answer)})
    record: dict[str, Any] = {"id": record_id, "question": question, "messages": messages}
    if gold is not None:
        record["answer"] = gold
    return record


def long_record(record_id: str, tool_turns: int, final_answer: str = "Paris") -> dict[str, Any]:
    """A record with `tool_turns` distinct searches and an answer (tool_turns + 1 turns)."""
    return drvenus_record(record_id, [search(f"query {i}") for i in range(tool_turns)],
                          final_answer)


def write_lines(path: Path, rows: Sequence[dict[str, Any] | str]) -> Path:
    """Write JSONL; a str row is written verbatim (to plant malformed lines)."""
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path
