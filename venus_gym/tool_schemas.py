"""The tools' JSON schemas and the check of a call's arguments against them.

    schema = tool_schema("search")                 # a built-in or registered plug-in tool
    register_tool_schema(plugin_schema)            # let the parser accept a plug-in's calls
    check_arguments("visit", {"url": [...], "goal": "..."})   # ArgumentProblem if not valid

The built-in tools are `search` and `visit` (TOOL_SCHEMAS, offered by default:
DEFAULT_TOOLS). Plug-in tools (venus_gym.tools.plugin) register their OpenAI-style function
schemas here; the turn parser (venus_gym.protocol, rule 9) checks every call's arguments
with `check_arguments`, and the compact system prompt writes each argument's type with
`type_label`.
"""

from __future__ import annotations

import json
import re
from typing import Any

_PREVIEW_CHARS = 40


class ArgumentProblem(ValueError):
    """A tool call's arguments break the tool's schema; the message is the reason."""


def _short(fragment: str) -> str:
    """A short repr of model text for a reason message (reasons must stay one-liners)."""
    if len(fragment) > _PREVIEW_CHARS:
        fragment = fragment[:_PREVIEW_CHARS] + "..."
    return repr(fragment)


TOOL_SCHEMAS: dict[str, dict] = {
    "search": {
        "type": "function",
        "function": {
            "name": "search",
            "description": (
                "Perform web searches and return the top results (title, URL and snippet) "
                "for each query. Send several related queries at once."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {
                        "type": "array",
                        "items": {"type": "string", "minLength": 1},
                        "minItems": 1,
                        "description": "One or more search queries.",
                    }
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
    "visit": {
        "type": "function",
        "function": {
            "name": "visit",
            "description": (
                "Read one or more web pages and return the evidence they contain for "
                "the given goal, with a short summary."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "url": {
                        "type": "array",
                        "items": {"type": "string", "minLength": 1},
                        "minItems": 1,
                        "description": "The URL(s) of the page(s) to read.",
                    },
                    "goal": {
                        "type": "string",
                        "minLength": 1,
                        "description": "What information to look for on the page(s).",
                    },
                },
                "required": ["url", "goal"],
                "additionalProperties": False,
            },
        },
    },
}


DEFAULT_TOOLS: tuple[str, ...] = ("search", "visit")


# Plug-in tools' schemas (venus_gym.tools.plugin), registered by whoever offers them. Kept
# apart from TOOL_SCHEMAS so that the built-in tools, and every message naming them, stay
# as they are until a plug-in is actually offered.
_PLUGIN_SCHEMAS: dict[str, dict] = {}


# The JSON Schema types rule 9 can check. A property may also be an `enum`, a union
# (`anyOf` / `oneOf` / a list of types) of checkable schemas, or carry no type at all
# (any JSON value, e.g. a `$ref` the server resolves). Objects are checked to be objects;
# their members are the tool's business.
_ARGUMENT_TYPES = ("string", "array", "number", "integer", "boolean", "object", "null")


def tool_schema(name: str) -> dict:
    """The JSON schema of a built-in or registered plug-in tool (KeyError if neither)."""
    if name in TOOL_SCHEMAS:
        return TOOL_SCHEMAS[name]
    return _PLUGIN_SCHEMAS[name]


def tool_names() -> list[str]:
    """Every tool the parser accepts: the built-in ones, then the registered plug-ins."""
    return [*TOOL_SCHEMAS, *_PLUGIN_SCHEMAS]


def unregister_tool_schema(name: str, schema: dict) -> bool:
    """Forget a plug-in tool's schema if `schema` is the one registered under `name`;
    returns whether it was."""
    if _PLUGIN_SCHEMAS.get(name) == schema:
        del _PLUGIN_SCHEMAS[name]
        return True
    return False


def register_tool_schema(schema: dict) -> str:
    """Let the parser accept calls to a plug-in tool; returns its name.

    `schema` is an OpenAI-style function schema, `{"type": "function", "function": {"name",
    "description", "parameters": {"type": "object", "properties", "required"}}}`, whose
    argument schemas use the JSON Schema types "string", "array", "number", "integer",
    "boolean", "object" and "null", `enum`, `anyOf` / `oneOf` of such schemas, or no type
    (any value). Registering the same schema again is a no-op.

    Raises:
        ValueError: a malformed schema, an unsupported argument type, a built-in tool's
            name, or a name already registered with a different schema.
    """
    function = schema.get("function") if isinstance(schema, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][\w.-]{0,63}", name):
        raise ValueError("a tool schema needs {'type': 'function', 'function': {'name': "
                         f"<identifier>, ...}}}}, got {str(schema)[:200]}")
    parameters = function.get("parameters")
    if (not isinstance(parameters, dict) or not isinstance(parameters.get("properties"), dict)
            or not isinstance(parameters.get("required", []), list)):
        raise ValueError(f"tool {name!r}: 'parameters' must be an object schema with "
                         f"'properties' (and a 'required' list)")
    for arg, spec in parameters["properties"].items():
        problem = _schema_problem(spec)
        if problem is not None:
            raise ValueError(f"tool {name!r}: argument {arg!r} {problem}; supported: the "
                             f"JSON Schema types {', '.join(_ARGUMENT_TYPES)}, enum, "
                             "anyOf / oneOf of them, or no type (any value)")
    missing = [k for k in parameters.get("required", []) if k not in parameters["properties"]]
    if missing:
        raise ValueError(f"tool {name!r}: required argument(s) {missing} are not properties")
    if name in TOOL_SCHEMAS:
        raise ValueError(f"{name!r} is a built-in tool; give the plug-in another name")
    if name in _PLUGIN_SCHEMAS and _PLUGIN_SCHEMAS[name] != schema:
        raise ValueError(f"a different tool named {name!r} is already registered")
    _PLUGIN_SCHEMAS[name] = schema
    return name


def _schema_problem(spec: Any) -> str | None:
    """Why rule 9 cannot check an argument schema; None when it can."""
    if not isinstance(spec, dict):
        return f"has the schema {str(spec)[:60]!r}, which is not a JSON object"
    for union in ("anyOf", "oneOf"):
        if union in spec:
            arms = spec[union]
            if not isinstance(arms, list) or not arms:
                return f"has a {union} that is not a non-empty list"
            for arm in arms:
                problem = _schema_problem(arm)
                if problem is not None:
                    return problem
    if "enum" in spec and (not isinstance(spec["enum"], list) or not spec["enum"]):
        return "has an enum that is not a non-empty list"
    kinds = _schema_types(spec)
    for kind in kinds:
        if kind not in _ARGUMENT_TYPES:
            return f"has type {kind!r}"
    if "array" in kinds and "items" in spec:
        return _schema_problem(spec["items"])
    return None


def _schema_types(spec: dict) -> list[Any]:
    kind = spec.get("type")
    if kind is None:
        return []
    return list(kind) if isinstance(kind, list) else [kind]


_TYPE_LABELS = {"string": "str", "object": "{}", "integer": "int", "number": "float",
                "boolean": "bool", "null": "null"}


def type_label(spec: dict) -> str:
    """A short type for the compact prompt: str, int, [str], str|null, any, ..."""
    for union in ("anyOf", "oneOf"):
        if union in spec:
            return "|".join(dict.fromkeys(type_label(arm) for arm in spec[union]))
    kinds = _schema_types(spec)
    if not kinds:
        return "any"
    labels = []
    for kind in kinds:
        if kind == "array":
            items = spec.get("items")
            labels.append(f"[{type_label(items) if isinstance(items, dict) else 'any'}]")
        else:
            labels.append(_TYPE_LABELS.get(kind, str(kind)))
    return "|".join(labels)


def type_name(value: Any) -> str:
    """The Python type name of a decoded JSON value, with JSON's null spelled out."""
    return "null" if value is None else type(value).__name__


def check_arguments(tool_name: str, arguments: dict) -> None:
    """Check the arguments against the tool's schema (rule 9).

    Interprets the schema constructs TOOL_SCHEMAS uses, "string" and "array" of strings
    with "minItems" (default 1), and for plug-in tools "number", "integer", "boolean",
    "object", "null", arrays of those, `enum`, unions and untyped arguments
    (`_check_json_value`). Strings must also be non-blank, which is stricter than the
    schema's minLength of 1: a blank query or URL is no more usable than an empty one.
    """
    parameters = tool_schema(tool_name)["function"]["parameters"]
    properties = parameters["properties"]
    unexpected = sorted(key for key in arguments if key not in properties)
    if unexpected:
        raise ArgumentProblem(
            f"unexpected argument(s) {', '.join(map(repr, unexpected))} for tool "
            f"{tool_name!r}; allowed: {', '.join(properties)}"
        )
    for key in parameters.get("required", []):
        if key not in arguments:
            raise ArgumentProblem(f"missing required argument {key!r} for tool {tool_name!r}")
    for key, value in arguments.items():
        spec = properties[key]
        kind = spec.get("type")
        plain = not any(construct in spec for construct in ("enum", "anyOf", "oneOf"))
        if plain and kind == "string":
            _check_string_argument(key, value)
        elif plain and kind == "array" and (spec.get("items") or {}).get("type") == "string":
            _check_string_list_argument(key, value, spec.get("minItems", 1))
        elif plain and kind in ("number", "integer", "boolean"):
            _check_scalar_argument(key, value, kind)
        else:
            problem = _json_value_problem(spec, value)
            if problem is not None:
                raise ArgumentProblem(f"argument {key!r} {problem}")


_JSON_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str) and bool(v.strip()),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def _json_value_problem(spec: dict, value: Any) -> str | None:
    """What is wrong with `value` under a (registered, checkable) argument schema; None if
    nothing. Strings must be non-blank here too; enum members compare with their JSON type
    (true is not 1)."""
    if "enum" in spec and not any(type(value) is type(option) and value == option
                                  for option in spec["enum"]):
        options = ", ".join(json.dumps(option) for option in spec["enum"][:10])
        return f"must be one of {options}, got {_short(json.dumps(value))}"
    for union in ("anyOf", "oneOf"):
        if union in spec and all(_json_value_problem(arm, value) is not None
                                 for arm in spec[union]):
            return f"must be {type_label(spec)}, got {type_name(value)}"
    kinds = _schema_types(spec)
    if kinds and not any(_JSON_TYPE_CHECKS[kind](value) for kind in kinds):
        blank = isinstance(value, str) and "string" in kinds
        got = "a blank string" if blank else type_name(value)
        return f"must be {' or '.join(map(str, kinds))}, got {got}"
    if isinstance(value, list) and "array" in kinds:
        if len(value) < spec.get("minItems", 0):
            return f"must have at least {spec['minItems']} item(s), got {len(value)}"
        if isinstance(spec.get("items"), dict):
            for index, item in enumerate(value):
                problem = _json_value_problem(spec["items"], item)
                if problem is not None:
                    return f"item {index} {problem}"
    return None


def _check_scalar_argument(key: str, value: Any, kind: str) -> None:
    """Require a JSON number, integer or boolean (bool is not a number here, as in JSON)."""
    expected = {"number": (int, float), "integer": (int,), "boolean": (bool,)}[kind]
    if isinstance(value, bool) != (kind == "boolean") or not isinstance(value, expected):
        article = "an" if kind == "integer" else "a"
        raise ArgumentProblem(f"argument {key!r} must be {article} {kind}, got "
                             f"{type_name(value)}")


def _check_string_argument(key: str, value: Any) -> None:
    """Require a non-blank string."""
    if not isinstance(value, str):
        raise ArgumentProblem(f"argument {key!r} must be a non-empty string, got {type_name(value)}")
    if not value.strip():
        raise ArgumentProblem(f"argument {key!r} must be a non-empty string, got a blank string")


def _check_string_list_argument(key: str, value: Any, min_items: int) -> None:
    """Require a list of at least `min_items` non-blank strings."""
    expected = f"argument {key!r} must be a non-empty list of strings"
    if not isinstance(value, list):
        raise ArgumentProblem(f"{expected}, got {type_name(value)}")
    if len(value) < min_items:
        raise ArgumentProblem(f"{expected}, got a list of {len(value)} item(s)")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise ArgumentProblem(f"{expected}, got {type_name(item)} at index {index}")
        if not item.strip():
            raise ArgumentProblem(f"{expected}, got a blank string at index {index}")
