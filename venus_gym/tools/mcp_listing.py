"""What an MCP server's tool listing may put into the system prompt.

A server's tool names, descriptions and input schemas are untrusted text like any tool
output, and they go into the system prompt of every episode. So, before a tool is offered:

- every string in them (names, descriptions, schema keys and values) gets the observations'
  sanitiser (`venus_gym.protocol.sanitize_value`): no chat control tokens such as
  `<|im_end|>`, no fake `<tool_response>` frame, no control characters;
- its description is cut to MAX_DESCRIPTION_CHARS, and a tool whose schema is still over
  MAX_SCHEMA_CHARS (as the JSON line the prompt lists) is not offered;
- `ToolSection` bounds what all MCP tools of one environment add to the system prompt
  (a share of its context budget); tools past it are not offered.

Each cut or dropped tool is named in an `MCPToolWarning`. A tool the agent cannot see in
full is better than a prompt that leaves no room for the episode (a 1 MB description made
a 262,710-token system prompt against a 6,144-token context).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

from venus_gym.protocol import sanitize_observation, sanitize_value

MAX_DESCRIPTION_CHARS = 2_000
MAX_SCHEMA_CHARS = 16_000
SECTION_SHARE = 4  # MCP tools take at most 1/SECTION_SHARE of max_context_tokens


class MCPToolWarning(UserWarning):
    """An MCP server's tool was cut or left out of the system prompt."""


def _parameters(input_schema: dict[str, Any]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {}, **input_schema}
    parameters.setdefault("required", [])
    return parameters


def offered_schema(listed: dict[str, Any], name: str, label: str) -> dict[str, Any] | None:
    """The function schema under which the listed tool is offered as `name` (sanitised,
    its description cut), or None when it is too large to offer (with a warning)."""
    description = sanitize_observation(str(listed.get("description") or ""))
    if len(description) > MAX_DESCRIPTION_CHARS:
        warnings.warn(f"{label}: the description of tool {name!r} was cut from "
                      f"{len(description):,} to {MAX_DESCRIPTION_CHARS:,} characters",
                      MCPToolWarning, stacklevel=3)
        description = description[:MAX_DESCRIPTION_CHARS]
    parameters = sanitize_value(_parameters(dict(listed.get("input_schema") or {})))
    schema = {"type": "function", "function": {
        "name": sanitize_observation(name), "description": description,
        "parameters": parameters}}
    size = len(json.dumps(schema, ensure_ascii=False))
    if size > MAX_SCHEMA_CHARS:
        warnings.warn(f"{label}: tool {name!r} is not offered: its schema is {size:,} "
                      f"characters, over the {MAX_SCHEMA_CHARS:,} an MCP tool may have",
                      MCPToolWarning, stacklevel=3)
        return None
    return schema


class ToolSection:
    """The share of an environment's system prompt its MCP tools may fill: `tokens`
    tokens (by `count_tokens`) of schema lines, for all its servers together."""

    def __init__(self, tokens: int, count_tokens: Callable[[str], int]):
        self.left = tokens
        self.tokens = tokens
        self.count_tokens = count_tokens

    def admit(self, schema: dict[str, Any], label: str) -> bool:
        """Whether the tool fits in what is left (taking its share), else a warning."""
        cost = self.count_tokens(json.dumps(schema, ensure_ascii=False))
        if cost > self.left:
            name = schema["function"]["name"]
            warnings.warn(f"{label}: tool {name!r} is not offered: its schema ({cost:,} "
                          f"tokens) does not fit in the {self.tokens:,} tokens the system "
                          f"prompt gives MCP tools (1/{SECTION_SHARE} of max_context_tokens)",
                          MCPToolWarning, stacklevel=3)
            return False
        self.left -= cost
        return True
