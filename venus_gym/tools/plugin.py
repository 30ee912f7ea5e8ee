"""Plug-in tools: anything with a name, a JSON schema and `call(arguments) -> str`.

A plug-in lives in one file:

    class Clock:
        name = "clock"
        schema = {"type": "function", "function": {
            "name": "clock", "description": "The current time in a time zone.",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                           "required": ["zone"], "additionalProperties": False}}}

        def call(self, arguments: dict) -> str:
            ...

and is offered with `gym.make("DeepResearch-v0", extra_tools=[Clock()])` (or
`extra_tools=["my_package.tools:Clock"]`, or the name of a registered plug-in such as
"calculator"). The environment lists its schema in the system prompt next to search and
visit, the parser accepts calls to it (`venus_gym.protocol.register_tool_schema`) and
checks their arguments against the schema, and `step` returns what `call` returns as the
observation, sanitised and wrapped like any tool result.

Deviation from DR-Venus: its agent has exactly search and visit. Peers' environments let
users add tools (GEM's tool wrappers, SkyRL's ToolGroups); so does this module, without
changing how the two built-in tools behave.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from venus_gym.tool_schemas import register_tool_schema, unregister_tool_schema

from .base import CacheMissError
from .toolbox import ToolOutcome


@runtime_checkable
class Tool(Protocol):
    """A plug-in tool. `call` may raise: the environment shows the error to the agent."""

    name: str
    schema: dict

    def call(self, arguments: dict) -> str:
        """The observation text for one call with already schema-checked arguments."""
        ...


_REGISTRY: dict[str, Callable[[], Tool]] = {}
# How many offered tools (resolve_tool) use each registered schema name, so that the
# parser's process-wide registry forgets a schema once the last tool using it is released
# (release_tool): a closed environment's MCP tool must not block a different tool of the
# same name in the next one.
_SCHEMA_USERS: dict[str, int] = {}
_SCHEMA_LOCK = threading.Lock()


def register_tool(name: str, factory: Callable[[], Tool]) -> None:
    """Make `name` usable in `extra_tools`; `factory()` builds a fresh tool per env."""
    _REGISTRY[name] = factory


def registered_tools() -> tuple[str, ...]:
    """Names `extra_tools` accepts as they are."""
    return tuple(sorted(_REGISTRY))


def load_object(spec: str) -> Any:
    """The object named by "package.module:attribute" (attribute may be dotted).

    Raises ValueError with the reason when the module or attribute cannot be found.
    """
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f"expected 'package.module:attribute', got {spec!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import {module_name!r} (from {spec!r}): {e}") from e
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{module_name!r} has no attribute {attribute!r} (from {spec!r})")
        obj = getattr(obj, part)
    return obj


def resolve_tool(spec: Any) -> Tool:
    """A Tool from a Tool object, a registered name, or "module:attribute" naming a Tool,
    a Tool class or a zero-argument factory. Registers the tool's schema with the parser.

    Raises:
        ValueError: an unknown name, or an object that is not a tool (the message says
            what a tool needs), or a schema the parser cannot check.
    """
    tool = spec
    if isinstance(spec, str):
        if spec in _REGISTRY:
            tool = _REGISTRY[spec]()
        elif ":" in spec:
            tool = load_object(spec)
            if isinstance(tool, type) or (callable(tool) and not isinstance(tool, Tool)):
                tool = tool()
        else:
            raise ValueError(f"unknown plug-in tool {spec!r}; registered: "
                             f"{', '.join(registered_tools()) or 'none'}, or give "
                             f"'package.module:attribute'")
    if not isinstance(tool, Tool) or not isinstance(tool.name, str):
        raise ValueError(f"{spec!r} is not a tool: a tool has a 'name' (str), a 'schema' "
                         f"(an OpenAI function schema) and a method call(arguments) -> str")
    function = tool.schema.get("function") if isinstance(tool.schema, dict) else None
    if not isinstance(function, dict) or function.get("name") != tool.name:
        raise ValueError(f"tool {tool.name!r}: schema['function']['name'] must be "
                         f"{tool.name!r}")
    with _SCHEMA_LOCK:
        register_tool_schema(tool.schema)
        _SCHEMA_USERS[tool.name] = _SCHEMA_USERS.get(tool.name, 0) + 1
    return tool


def release_tool(tool: Tool) -> None:
    """Undo `resolve_tool` for a tool its environment is done with: the parser forgets its
    schema when no other resolved tool uses it, and the tool's `close()` (if any) runs
    (an MCP tool lets go of its server)."""
    with _SCHEMA_LOCK:
        users = _SCHEMA_USERS.get(tool.name, 0) - 1
        if users > 0:
            _SCHEMA_USERS[tool.name] = users
        elif users == 0:
            del _SCHEMA_USERS[tool.name]
            unregister_tool_schema(tool.name, tool.schema)
    close = getattr(tool, "close", None)
    if callable(close):
        close()


def run_tool(tool: Tool, arguments: dict) -> ToolOutcome:
    """Call a plug-in; a raised exception becomes an error observation, as for search and
    visit (CacheMissError excepted: a replay must not invent observations)."""
    try:
        text = tool.call(arguments)
    except CacheMissError:
        raise
    except Exception as e:
        error = f"{tool.name} failed: {type(e).__name__}: {e}"
        return ToolOutcome(text=error, ok=False, error=error)
    if not isinstance(text, str):
        error = f"{tool.name} returned {type(text).__name__}, not the observation text (str)"
        return ToolOutcome(text=error, ok=False, error=error)
    return ToolOutcome(text=text, ok=True)
