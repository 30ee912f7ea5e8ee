"""The DR-Venus turn protocol: what the agent writes, what the environment answers.

An episode is a ChatML conversation. The system prompt (`render_system_prompt`) describes
the tools; the user message is the question. Each assistant turn is one *action*:

    tool turn:   <think>\\n...\\n</think>\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>
    final turn:  <think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>

The environment answers a tool turn with a user message `<tool_response>\\n...\\n</tool_response>`
(`format_tool_response`), a malformed turn with an error notice wrapped the same way
(`format_error_notice`), and, when turns or context run out, replaces the last message with
`FORCED_FINAL_NOTICE` and allows one last turn.

`parse_turn` decides whether a turn is well formed. It is total: any `str` yields a
`ParsedTurn`, never an exception. The six *structural tags* are `<think>`, `</think>`,
`<tool_call>`, `</tool_call>`, `<answer>`, `</answer>`; they are matched literally wherever
they occur, including inside JSON strings (the writers below escape `<` as `\\u003c` there,
so what they write always parses back). "Whitespace" means what `str.strip` removes.

Validity rules (design.md "RL", "Turn-level format penalty"):

Both kinds of turn
  1. The turn is not empty or whitespace only.
  2. Nothing but whitespace precedes the first `<think>`.
  3. Think tags form one or more `<think>...</think>` blocks: no nesting, no `</think>`
     without an open `<think>`, no block left open.
  4. No `<tool_call>`, `</tool_call>`, `<answer>` or `</answer>` inside a think block or
     before the last `</think>`.
  5. Exactly one action block follows the last `</think>`: one `<tool_call>...</tool_call>`
     or one `<answer>...</answer>`, never both kinds, never two blocks.
  6. Only whitespace follows the action's closing tag.
Tool turn
  7. The tool_call body is a JSON object with exactly the keys "name" (a string) and
     "arguments" (an object).
  8. "name" is one of the tools offered to this parse (default: search and visit; a
     plug-in tool once its schema is registered with `register_tool_schema`).
  9. The arguments match the tool's schema (`tool_schema`): every required argument is
     present, no other argument is, and each has the right type. Strings must be non-blank
     and lists non-empty (search: `query` a list of strings; visit: `url` a list of strings
     and `goal` a string); plug-in tools (MCP servers' among them) may also take numbers,
     integers, booleans, objects, null, arrays of any of these, `enum` values, unions
     (`anyOf` / `oneOf` / a list of types) and untyped arguments (any JSON value).
Final turn
  10. The stripped answer text is not empty.

A turn that breaks any rule has kind "invalid" and a `reason` naming the first rule it
broke, in the order above; `intent` still says which action the model seemed to attempt.

Where we deviate from DR-Venus, and why
  * Argument checking (rules 8-9) is stricter than DR-Venus, whose check stops at "the body
    parses to {name, arguments: dict}". A call that names an unknown tool or passes wrong
    types cannot run, so rewarding it with information gain like a real tool turn would be
    wrong; it is a format error and takes the format penalty instead. Extra keys next to
    "name" and "arguments" are rejected for the same reason.
  * "arguments" may also be a JSON *string* that decodes to an object. OpenAI-style function
    calling emits arguments that way and many models copy it; the encoding is unambiguous,
    so penalising it would only punish a harmless habit.
  * Text outside think blocks but before the action (between two think blocks, or between
    the last `</think>` and the action, e.g. "Let me search for that.") is allowed and
    ignored. The reference rules do not forbid it and Qwen3 models often write it. It is
    not part of `ParsedTurn.think`.
  * Stop strings. Generation stops on `<tool_response>`; the engine must strip the stop
    string (and special tokens such as `<|im_end|>`) before parsing. If a turn still ends in
    `<tool_response>`, rule 6 makes it invalid, with a reason that says the stop string was
    left in. We do not forgive it here because those characters would then sit among the
    policy's tokens and be trained on: the bug belongs in the engine and should be loud.
  * Chat templates that put `<think>\\n` into the generation prompt (Qwen3-Thinking) make the
    model's output start inside the think block. The parser judges the whole turn as it will
    appear in the conversation, so the engine prepends that prefix before parsing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

# Re-exported: the sanitiser lives in its own module, protocol's names stay valid.
from venus_gym.sanitize import REPLACEMENT_CHARACTER as REPLACEMENT_CHARACTER
from venus_gym.sanitize import clean_text as clean_text
from venus_gym.sanitize import sanitize_observation as sanitize_observation
from venus_gym.sanitize import sanitize_value
from venus_gym.tool_schemas import DEFAULT_TOOLS as DEFAULT_TOOLS
from venus_gym.tool_schemas import TOOL_SCHEMAS as TOOL_SCHEMAS
from venus_gym.tool_schemas import (
    ArgumentProblem,
    check_arguments,
    tool_names,
    type_label,
    type_name,
)
from venus_gym.tool_schemas import register_tool_schema as register_tool_schema
from venus_gym.tool_schemas import tool_schema as tool_schema

FORCED_FINAL_NOTICE = (
    "You have reached the maximum number of interaction turns (or context). Based on all "
    "the information above, provide the entire final answer in <answer></answer> tags now."
)

# Literal alternations without nested quantifiers: every scan is one linear pass.
_STRUCTURAL_TAG = re.compile(r"</?(?:think|tool_call|answer)>")
_ACTION_TAG = re.compile(r"</?(?:tool_call|answer)>")
_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
_STOP_STRING = "<tool_response>"
_PREVIEW_CHARS = 40

_ROLE_PARAGRAPH = (
    "You are a deep research assistant. Your job is to answer the user's question "
    "correctly by searching the web and reading pages. Work step by step: plan, search, "
    "visit the most promising pages (search snippets are short and often incomplete), "
    "check every fact against the evidence, and answer only when you are confident."
)


@dataclass(frozen=True)
class ToolCall:
    """One tool invocation parsed from (or written into) an assistant turn.

    name:      the tool's name, a key of TOOL_SCHEMAS.
    arguments: the decoded JSON arguments. The dataclass is frozen but the dict is not
               hashable, so compare calls with `tool_call_key` rather than by hashing.
    """

    name: str
    arguments: dict


@dataclass(frozen=True)
class ParsedTurn:
    """The verdict of `parse_turn` on one assistant turn.

    kind:      "search" or "visit" for a valid tool turn, "answer" for a valid final
               turn, "invalid" otherwise.
    valid:     whether the turn follows every rule in the module docstring.
    reason:    "ok" when valid, else a short human-readable description of the first
               broken rule (it is shown to the model in the error notice).
    think:     the stripped contents of the think block(s), non-empty blocks joined by a
               blank line; "" when rules 1-4 (the think structure) are broken.
    tool_call: the parsed call of a valid tool turn, else None.
    answer:    the stripped answer of a valid final turn, else None.
    intent:    what the model tried to do, judged only by which action tags occur anywhere
               in the text: "tool", "answer", or "unknown" (neither kind, or both).
    """

    kind: str
    valid: bool
    reason: str
    think: str
    tool_call: ToolCall | None
    answer: str | None
    intent: str

    @property
    def tool_name(self) -> str | None:
        """The called tool's name for a valid tool turn, else None."""
        return self.tool_call.name if self.tool_call is not None else None


class _MalformedTurn(Exception):
    """Raised inside the parser at the first broken rule; carries the reason text."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _check_tool_names(tools: Collection[str]) -> tuple[str, ...]:
    """Return `tools` as a tuple after checking every name is a known tool.

    Raises TypeError for a bare string (a likely slip for a one-element tuple) and
    ValueError for unknown or repeated names.
    """
    if isinstance(tools, str):
        raise TypeError(f"tools must be a collection of tool names, not the string {tools!r}")
    names = tuple(tools)
    known = tool_names()
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(
            f"unknown tool(s) {', '.join(map(repr, unknown))}; "
            f"valid tools: {', '.join(known)}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"tool names must be unique, got {names!r}")
    return names


PROMPT_STYLES: tuple[str, ...] = ("full", "compact")


def render_system_prompt(tools: Sequence[str] = DEFAULT_TOOLS, date: str = "2025-01-01",
                         style: str = "full") -> str:
    """Build the system prompt offering `tools`.

    The prompt is plain text, independent of any chat template. Same arguments, same string.

    style "full" is DR-Venus's prompt: a role paragraph, a `# Tools` block with one JSON
    schema per line inside <tools></tools>, how to call a tool, how to think and answer, and
    the current date (~300 words; 1,251 tokens with a 1,024-id world tokenizer).
    style "compact" gives the turn format and each tool's arguments in ~80 words. It is meant
    for tiny models trained from scratch on a CPU, where the full prompt is half of every
    episode's tokens (experiments/HISTORY.md, part 7); a model trained with one style
    must be run with the same style.

    Args:
        tools: names of the tools to offer, in the order they are listed (keys of
            TOOL_SCHEMAS, at least one, no repeats).
        date: the text after "Current date: " (a fixed default keeps prompts reproducible).
        style: "full" or "compact" (PROMPT_STYLES).

    Raises:
        ValueError: an unknown or repeated tool name, no tools at all, or an unknown style.
    """
    names = _check_tool_names(tools)
    if not names:
        raise ValueError(f"offer at least one tool; valid tools: {', '.join(TOOL_SCHEMAS)}")
    if style == "compact":
        return _render_compact_prompt(names, date)
    if style != "full":
        raise ValueError(f"unknown prompt style {style!r}; valid styles: "
                         f"{', '.join(PROMPT_STYLES)}")
    schema_lines = "\n".join(json.dumps(tool_schema(name), ensure_ascii=False) for name in names)
    return (
        f"{_ROLE_PARAGRAPH}\n\n"
        "# Tools\n\n"
        "You may call one function per turn to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{schema_lines}\n</tools>\n\n"
        "For the function call, return a json object with the function name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n'
        "# Format\n\n"
        "In every turn, first think inside <think></think>. Then either call exactly one tool "
        "as shown above, or, once you are confident, give the final answer as:\n"
        "<answer>\n...\n</answer>\n"
        "Write nothing after the closing </tool_call> or </answer> tag. Tool results are "
        "returned to you inside <tool_response></tool_response>.\n\n"
        f"Current date: {date}"
    )


def _render_compact_prompt(names: tuple[str, ...], date: str) -> str:
    """The "compact" style: one line per tool, `name {"arg": type}: first sentence`."""
    lines = []
    for name in names:
        function = tool_schema(name)["function"]
        arguments = ", ".join(f'"{arg}": {type_label(spec)}'
                              for arg, spec in function["parameters"]["properties"].items())
        summary = function["description"].split(". ")[0].rstrip(".")
        lines.append(f"- {name} {{{arguments}}}: {summary}.")
    return (
        "You are a research assistant. Answer the question by searching and reading pages.\n"
        "Each turn, think inside <think></think>, then either call one tool:\n"
        '<tool_call>\n{"name": <tool>, "arguments": {...}}\n</tool_call>\n'
        "or give the final answer:\n<answer>\n...\n</answer>\n"
        "Tools:\n" + "\n".join(lines) + "\n"
        f"Current date: {date}"
    )


def parse_turn(text: str, tools: Collection[str] = DEFAULT_TOOLS) -> ParsedTurn:
    """Parse one assistant turn and judge it against the rules in the module docstring.

    Never raises for a `str` input, whatever it contains (deeply nested or broken JSON,
    megabytes of text, stray tags): every problem becomes an invalid `ParsedTurn` with a
    reason. Runs in time linear in len(text).

    Args:
        text: the complete assistant turn, without stop strings or special tokens.
        tools: names of the tools the model may call in this turn (keys of TOOL_SCHEMAS;
            may be empty, which makes every tool call invalid).

    Raises:
        TypeError: `text` is not a str, or `tools` is a bare string.
        ValueError: `tools` names an unknown tool (a configuration error, not a bad turn).
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_turn expects the turn as a str, got {type(text).__name__}")
    allowed_tools = _check_tool_names(tools)
    intent = _guess_intent(text)
    think = ""
    try:
        think_blocks, after_thinking = _split_thinking(text)
        think = "\n\n".join(filter(None, map(str.strip, think_blocks)))
        action_name, body = _extract_action(after_thinking)
        if action_name == "answer":
            answer = body.strip()
            if not answer:
                raise _MalformedTurn("empty <answer> block")
            return ParsedTurn("answer", True, "ok", think, None, answer, intent)
        call = _decode_tool_call(body, allowed_tools)
        return ParsedTurn(call.name, True, "ok", think, call, None, intent)
    except _MalformedTurn as error:
        return ParsedTurn("invalid", False, error.reason, think, None, None, intent)


def _guess_intent(text: str) -> str:
    """Which action the text reaches for, from the presence of action tags alone."""
    wants_tool = "<tool_call>" in text or "</tool_call>" in text
    wants_answer = "<answer>" in text or "</answer>" in text
    if wants_tool == wants_answer:
        return "unknown"
    return "tool" if wants_tool else "answer"


def _preview(fragment: str) -> str:
    """A short repr of model text for a reason message (reasons must stay one-liners)."""
    if len(fragment) > _PREVIEW_CHARS:
        fragment = fragment[:_PREVIEW_CHARS] + "..."
    return repr(fragment)


def _split_thinking(text: str) -> tuple[list[str], str]:
    """Check rules 1-4; return the think blocks' contents and the text after the last </think>.

    All scanning is done by C-level string methods (split, count, replace) and one regex
    search, so megabyte turns full of tags still parse in tens of milliseconds; a Python
    loop over tags runs only to name the problem once a turn is known to be malformed.
    """
    if not text.strip():
        raise _MalformedTurn("empty turn")
    first_think = text.find(_THINK_OPEN)
    if first_think == -1:
        raise _MalformedTurn("no <think> block; a turn must start with <think>...</think>")
    leading_text = text[:first_think].strip()
    if leading_text:
        raise _MalformedTurn(f"text before the first <think>: {_preview(leading_text)}")

    # Think tags alternate <think>, </think>, ... exactly when every stretch of text that
    # ends at a </think> holds one <think>, and the text after the last </think> holds none.
    opens_before_each_close = list(map(str.count, text.split(_THINK_CLOSE), repeat(_THINK_OPEN)))
    well_nested = (
        opens_before_each_close[-1] == 0
        and opens_before_each_close.count(1) == len(opens_before_each_close) - 1
    )
    if not well_nested:
        raise _MalformedTurn(_think_nesting_problem(opens_before_each_close))

    last_close = text.rfind(_THINK_CLOSE)
    misplaced = _ACTION_TAG.search(text, 0, last_close)
    if misplaced:
        position = misplaced.start()
        if text.count(_THINK_OPEN, 0, position) > text.count(_THINK_CLOSE, 0, position):
            raise _MalformedTurn(f"{misplaced.group()} inside a <think> block")
        raise _MalformedTurn(
            f"{misplaced.group()} before the last </think>; "
            "the tool call or answer must come after all thinking"
        )

    # Both think tags are now known to alternate, so splitting on either one gives
    # [before, block 1, between, block 2, ..., block n, after].
    segments = text.replace(_THINK_CLOSE, _THINK_OPEN).split(_THINK_OPEN)
    return segments[1::2], segments[-1]


def _think_nesting_problem(opens_before_each_close: list[int]) -> str:
    """Name the first think tag that breaks <think>...</think> alternation (rule 3).

    Args:
        opens_before_each_close: the number of <think> tags in each stretch of text that
            ends at a </think> (the last entry: after the last </think>, or the whole text).
    """
    last_index = len(opens_before_each_close) - 1
    for index, opens in enumerate(opens_before_each_close):
        if opens >= 2:
            return "nested <think> inside a <think> block"
        if opens == 0 and index < last_index:
            return "</think> without a matching <think>"
    return "<think> block is never closed with </think>"


def _extract_action(after_thinking: str) -> tuple[str, str]:
    """Check rules 5-6 on the text after the last </think>.

    Returns the action's name ("tool_call" or "answer") and the raw text of its body.
    """
    has_tool_tags = "<tool_call>" in after_thinking or "</tool_call>" in after_thinking
    has_answer_tags = "<answer>" in after_thinking or "</answer>" in after_thinking
    if not (has_tool_tags or has_answer_tags):
        raise _MalformedTurn("no <tool_call> or <answer> after the last </think>")
    if has_tool_tags and has_answer_tags:
        raise _MalformedTurn("turn has both <tool_call> and <answer>; give exactly one of them")
    action = "tool_call" if has_tool_tags else "answer"
    opener, closer = f"<{action}>", f"</{action}>"
    openers, closers = after_thinking.count(opener), after_thinking.count(closer)
    if openers == 0:
        raise _MalformedTurn(f"{closer} without a matching {opener}")
    if closers == 0:
        raise _MalformedTurn(f"{opener} is never closed with {closer}")
    if openers > 1 or closers > 1:
        raise _MalformedTurn(
            f"{openers} {opener} and {closers} {closer} tags; "
            f"exactly one {opener}...{closer} block is allowed per turn"
        )
    body_start = after_thinking.find(opener) + len(opener)
    body_end = after_thinking.find(closer)
    if body_end < body_start:
        raise _MalformedTurn(f"{closer} comes before {opener}")
    trailing_text = after_thinking[body_end + len(closer) :].strip()
    if trailing_text:
        hint = ""
        if trailing_text.startswith(_STOP_STRING):
            hint = f" (the {_STOP_STRING} stop string must be stripped from the turn)"
        raise _MalformedTurn(f"text after {closer}: {_preview(trailing_text)}{hint}")
    return action, after_thinking[body_start:body_end]


def _load_json(source: str, what: str) -> Any:
    """json.loads that reports every failure, including pathological nesting, as a reason."""
    try:
        return json.loads(source)
    except json.JSONDecodeError as error:
        raise _MalformedTurn(f"{what} is not valid JSON: {error.msg} at char {error.pos}") from None
    except RecursionError:
        raise _MalformedTurn(f"{what} is not valid JSON: nested too deeply") from None
    except ValueError as error:  # e.g. an integer literal past Python's digit limit
        raise _MalformedTurn(f"{what} is not valid JSON: {error}") from None


def _decode_tool_call(body: str, allowed_tools: tuple[str, ...]) -> ToolCall:
    """Check rules 7-9 on a tool_call body and return the call."""
    payload = _load_json(body.strip(), "tool_call body")
    if not isinstance(payload, dict):
        raise _MalformedTurn(f"tool_call body must be a JSON object, got {type_name(payload)}")
    missing = [key for key in ("name", "arguments") if key not in payload]
    if missing:
        raise _MalformedTurn(f"tool_call JSON has no {' or '.join(map(repr, missing))}")
    unexpected = sorted(key for key in payload if key not in ("name", "arguments"))
    if unexpected:
        raise _MalformedTurn(
            f"unexpected key(s) {', '.join(map(repr, unexpected))} in tool_call JSON; "
            "only 'name' and 'arguments' are allowed"
        )
    name = payload["name"]
    if not isinstance(name, str):
        raise _MalformedTurn(f"tool_call 'name' must be a string, got {type_name(name)}")
    if name not in allowed_tools:
        available = ", ".join(sorted(allowed_tools)) or "none"
        raise _MalformedTurn(f"unknown tool {name!r}; available: {available}")
    arguments = payload["arguments"]
    encoded_as_string = isinstance(arguments, str)
    if encoded_as_string:
        arguments = _load_json(arguments, "tool_call 'arguments' string")
    if not isinstance(arguments, dict):
        source = " (decoded from a string)" if encoded_as_string else ""
        raise _MalformedTurn(
            f"tool_call 'arguments' must be a JSON object, got {type_name(arguments)}{source}"
        )
    try:
        check_arguments(name, arguments)
    except ArgumentProblem as problem:
        raise _MalformedTurn(str(problem)) from None
    return ToolCall(name, arguments)


def _reject_structural_tags(text: str, field_name: str) -> None:
    """Refuse free text that would change the turn's structure (the parser scans tags literally)."""
    tag = _STRUCTURAL_TAG.search(text)
    if tag:
        raise ValueError(
            f"{field_name} contains the tag {tag.group()!r}, which would break the turn format"
        )


def _escape_tags_in_json(encoded: str) -> str:
    """Hide structural tags inside JSON text from the tag scanner.

    In json.dumps output a tag can only sit inside a string literal (tags contain no quote,
    backslash or JSON punctuation), where `\\u003c` decodes to the same `<`.
    """
    return _STRUCTURAL_TAG.sub(lambda tag: "\\u003c" + tag.group()[1:], encoded)


def format_tool_call(name: str, arguments: dict) -> str:
    """Write a `<tool_call>` block: `<tool_call>\\n{json}\\n</tool_call>`.

    The JSON keeps non-ASCII characters as they are (ensure_ascii=False); only a `<` that
    starts a structural tag is escaped, so any argument strings parse back unchanged.
    The name and arguments are written as given, not validated (tests need broken calls).

    Args:
        name: the tool name.
        arguments: JSON-serialisable arguments.

    Raises:
        TypeError: the name or arguments are not JSON-serialisable.
    """
    encoded = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{_escape_tags_in_json(encoded)}\n</tool_call>"


def _think_block(think: str) -> str:
    _reject_structural_tags(think, "think text")
    return f"<think>\n{think}\n</think>"


def format_tool_turn(think: str, name: str, arguments: dict) -> str:
    """Write a whole tool turn: `<think>\\n{think}\\n</think>\\n<tool_call>...</tool_call>`.

    Args:
        think: the reasoning text; must not contain a structural tag.
        name: the tool name.
        arguments: JSON-serialisable arguments.

    Raises:
        ValueError: `think` contains a structural tag.
    """
    return f"{_think_block(think)}\n{format_tool_call(name, arguments)}"


def format_answer_turn(think: str, answer: str) -> str:
    """Write a whole final turn: `<think>\\n{think}\\n</think>\\n<answer>\\n{answer}\\n</answer>`.

    Args:
        think: the reasoning text; must not contain a structural tag.
        answer: the final answer; must not contain a structural tag. A blank answer is
            written as given (and parses as invalid).

    Raises:
        ValueError: `think` or `answer` contains a structural tag.
    """
    _reject_structural_tags(answer, "answer text")
    return f"{_think_block(think)}\n<answer>\n{answer}\n</answer>"


def format_tool_response(text: str) -> str:
    """Wrap a tool result as the user message the model sees: `<tool_response>\\n...\\n</tool_response>`."""
    return f"<tool_response>\n{text}\n</tool_response>"


def format_error_notice(reason: str) -> str:
    """The environment's reply to a malformed turn, wrapped like a tool result.

    Args:
        reason: the parser's reason (ParsedTurn.reason), quoted to the model verbatim.
    """
    return format_tool_response(
        f"Your previous turn was malformed and was not executed: {reason}\n"
        "Think inside <think></think> first, then either call exactly one tool as "
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
        "or give your final answer in <answer></answer>."
    )


def tool_call_key(call: ToolCall) -> str:
    """A canonical string for duplicate-call detection: same tool and same arguments.

    Argument keys are sorted, so key order in the model's JSON does not matter; list order
    does (DR-Venus compares the sorted-key JSON, not sets of queries). Strings are taken as
    the environment shows them (`sanitize_value`), so a parsed call and the same call read
    back from `info["tool_calls"]` have one key.
    """
    payload = {"name": call.name, "arguments": sanitize_value(call.arguments)}
    return json.dumps(payload, sort_keys=True, ensure_ascii=False)


def is_repetitive(text: str, window: int = 50, times: int = 5) -> bool:
    """The DR-Venus degeneration check: does the text's tail recur more than `times` times?

    Counts non-overlapping occurrences (str.count) of the last `window` characters in the
    whole text, the tail itself included. Text shorter than `window` is never repetitive.

    Args:
        text: a generated turn.
        window: length of the tail to look for (>= 1).
        times: how many occurrences are still acceptable (>= 0).

    Raises:
        ValueError: window < 1 or times < 0.
    """
    if window < 1 or times < 0:
        raise ValueError(f"need window >= 1 and times >= 0, got window={window}, times={times}")
    if len(text) < window:
        return False
    return text.count(text[-window:]) > times
