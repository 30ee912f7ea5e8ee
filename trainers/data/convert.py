"""Stage 1 of the SFT data pipeline: bring every input into our Trajectory schema.

Two input formats are read, one JSON object per line:

* DR-Venus / REDSearcher records: `{"messages": [{"role", "content"}, ...], "question"?,
  "answer"?, "prediction"?, "id"?}`. Assistant tool calls sit in the content as
  `<tool_call>{json}</tool_call>`, tool results are user messages
  `<tool_response>...</tool_response>`. OpenAI-style records are accepted too: assistant
  `tool_calls` fields become `<tool_call>` blocks, `role: "tool"` messages become user
  `<tool_response>` messages, `reasoning_content` becomes the `<think>` block.
* Our own Trajectory JSONL (`trainers.trajectory`, e.g. written by
  `trainers.data.oracle_data`): already in schema, validated and passed through unchanged.

Every converted trajectory has one message schema, identical to inference: our system
prompt (`venus_gym.protocol.render_system_prompt`, offering exactly the tools the pipeline
keeps), the question as the user message, then assistant turns each answered by a user
`<tool_response>` message; `turns` are annotated with `parse_turn`.

A line that cannot be decoded or is not JSON, or a record that cannot be converted, raises
`DataFormatError` naming file:line; with `skip_bad` it is appended to a `bad_lines` list
instead (and shows up in the report). Nothing is dropped or coerced silently: wrong types
are refused with a reason, except gold answers, whose rule (`_gold_answers`) converts
numbers and drops nulls with a count; duplicate ids are kept and counted.

This module also holds the small schema helpers the later stages share (turn counting,
lenient tool-call and answer extraction, rebuilding a trajectory after messages change).

Where we deviate from DR-Venus and why
* The source system prompt is replaced by ours rather than kept: the model must be trained
  on the prompt it will see at inference. The source's "Current date:" line is kept when
  present (the date changes what "latest" means in the questions).
* Qwen3 chat templates put `<think>\\n` in the generation prompt, so exported assistant
  content often starts inside the think block (reasoning, then `</think>`). We restore the
  opening tag so the turn parses as the agent would have written it, and count the repairs.
* An assistant message with several OpenAI `tool_calls` is refused (a bad record), not
  split: our protocol has one call per turn and splitting would invent reasoning.
* A trajectory whose messages a later stage changes loses its token-level view (ids, masks,
  spans) and per-turn rewards: they described other messages. SFT re-tokenises from the
  messages; RL rollouts never pass through these stages.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from trainers.trajectory import Trajectory, Turn, check_invariants
from venus_gym.corpus import DataFormatError, read_jsonl
from venus_gym.protocol import (
    DEFAULT_TOOLS,
    format_tool_call,
    format_tool_response,
    parse_turn,
    render_system_prompt,
)

INPUT_FORMATS: tuple[str, ...] = ("auto", "drvenus", "trajectory")

_TRAJECTORY_FIELDS = frozenset(f.name for f in dataclasses.fields(Trajectory))
# Non-greedy bodies between literal tags: linear scans, no nested quantifiers.
_TOOL_CALL_BODY = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ANSWER_BODY = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_DATE_LINE = re.compile(r"Current date:\s*(.+)")
_TOOL_RESPONSE_OPEN = "<tool_response>"


class ConversionError(ValueError):
    """A record that is valid JSON but cannot be brought into the schema."""


# --- shared schema helpers ---------------------------------------------------------------
def count_turns(trajectory: Trajectory) -> int:
    """Interaction turns of a trajectory: its assistant messages (tool calls + final answer)."""
    return sum(1 for message in trajectory.messages if message["role"] == "assistant")


def extract_tool_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """The (name, arguments) of the last `<tool_call>` block in a turn, whatever the tool.

    Lenient on purpose, unlike `parse_turn`: pruning must recognise calls to tools the
    protocol does not offer ("python", "google_scholar"). Returns None when there is no
    block or its body is not `{"name": str, "arguments": object or JSON-object string}`.
    """
    bodies = _TOOL_CALL_BODY.findall(text)
    if not bodies:
        return None
    try:
        payload = json.loads(bodies[-1].strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return payload["name"], arguments


def extract_answer(trajectory: Trajectory) -> str | None:
    """The stripped `<answer>` body of the last assistant message, None if it has none."""
    for message in reversed(trajectory.messages):
        if message["role"] == "assistant":
            bodies = _ANSWER_BODY.findall(message["content"])
            return bodies[-1].strip() if bodies else None
    return None


def annotate_turns(messages: Sequence[dict[str, Any]], tools: Sequence[str]) -> list[Turn]:
    """One `Turn` per assistant message, judged by `parse_turn` with the kept tools."""
    assistant_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    turns = []
    for k, at in enumerate(assistant_at):
        text = messages[at]["content"]
        parsed = parse_turn(text, tools)
        kind, valid, reason = parsed.kind, parsed.valid, ("" if parsed.valid else parsed.reason)
        if kind == "answer" and k != len(assistant_at) - 1:
            # The schema (and the environment) end an episode at its answer; an answer in
            # the middle of a source conversation cannot be replayed, so it counts as invalid.
            kind, valid, reason = "invalid", False, "answer before the end of the conversation"
        following = messages[at + 1] if at + 1 < len(messages) else None
        reply = None if following is None or following["role"] == "assistant" else following["content"]
        turns.append(Turn(kind=kind, valid=valid, assistant=text, env_reply=reply, reason=reason))
    return turns


def with_messages(trajectory: Trajectory, messages: list[dict[str, Any]],
                  tools: Sequence[str]) -> Trajectory:
    """A copy with new messages, re-annotated turns and no token-level view (see module doc)."""
    return dataclasses.replace(
        trajectory, messages=messages, turns=annotate_turns(messages, tools),
        input_ids=None, loss_mask=None, rollout_logprobs=None, turn_spans=None,
        turn_boundaries=None, question_end=None)


# --- DR-Venus / OpenAI-style records -------------------------------------------------------
def _text(value: Any, where: str, null_ok: bool = False) -> str:
    if value is None:
        if null_ok:
            return ""
        raise ConversionError(f"{where}: content is null")
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # OpenAI content parts: [{"type": "text", "text": ...}]
        parts = [part.get("text") for part in value if isinstance(part, dict)]
        if all(isinstance(part, str) for part in parts) and len(parts) == len(value):
            return "".join(parts)
    raise ConversionError(f"{where}: content must be a string, got {type(value).__name__}")


def _openai_tool_call(call: Any, where: str) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ConversionError(f"{where}: tool_calls entry needs function.name")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as e:
            raise ConversionError(f"{where}: tool call arguments are not JSON: {e}") from None
    if not isinstance(arguments, dict):
        raise ConversionError(f"{where}: tool call arguments must be an object")
    return format_tool_call(function["name"], arguments)


def _assistant_content(message: dict[str, Any], where: str, counters: Counter[str]) -> str:
    # Null content is the OpenAI form of a turn that only calls a tool or only reasons; a
    # turn left with nothing at all is refused below, never written as an empty turn.
    content = _text(message.get("content"), where, null_ok=True).strip()
    reasoning = message.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise ConversionError(f"{where}: reasoning_content must be a string, got "
                              f"{_json_type(reasoning)}")
    if isinstance(reasoning, str) and reasoning.strip() and "<think>" not in content:
        content = "\n".join(filter(None, [f"<think>\n{reasoning.strip()}\n</think>", content]))
        counters["reasoning_content_converted"] += 1
    if "</think>" in content and "<think>" not in content:
        content = "<think>\n" + content
        counters["think_tags_restored"] += 1
    calls = message.get("tool_calls")
    calls = [] if calls is None else calls
    if not isinstance(calls, list):
        raise ConversionError(f"{where}: tool_calls must be a list, got {_json_type(calls)}")
    if len(calls) > 1:
        raise ConversionError(f"{where}: {len(calls)} tool calls in one assistant message; the "
                              "protocol allows one per turn")
    if calls:
        if "<tool_call>" in content:
            raise ConversionError(f"{where}: both a tool_calls field and a <tool_call> block")
        content = "\n".join(filter(None, [content, _openai_tool_call(calls[0], where)]))
        counters["openai_tool_calls_converted"] += 1
    if not content:
        raise ConversionError(f"{where}: an assistant message with no content and no tool "
                              "call (it would train an empty turn)")
    return content


def _as_tool_response(content: str, counters: Counter[str], key: str) -> str:
    stripped = content.strip()
    if stripped.startswith(_TOOL_RESPONSE_OPEN):
        return stripped
    counters[key] += 1
    return format_tool_response(stripped)


_ANSWER_KEYS = ("answers", "answer", "ground_truth", "gold")


def _json_type(value: Any) -> str:
    """JSON's name for a decoded value's type (for reasons in the report)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def _gold_answers(record: dict[str, Any], counters: Counter[str]) -> list[str]:
    """The gold answers of a record, by a fixed rule (docs/failure_behaviour.md).

    The first of "answers", "answer", "ground_truth", "gold" that is present and not
    null, "" or [] is the answer field; none of them gives [] (the filter stage drops such
    a trajectory as "no gold answer", or keeps it with judge 'none'). The field is a string
    or a list of them. A number or boolean becomes its JSON text (42 -> "42", true ->
    "true") and is counted in `answers_coerced_to_string`; null, NaN, infinities, arrays
    and objects inside a list are dropped and counted in `answers_dropped`. A field that
    leaves no answer at all, or that is an object, refuses the record.
    """
    for key in _ANSWER_KEYS:
        value = record.get(key)
        if value is None or value == "" or value == []:
            continue
        values = value if isinstance(value, list) else [value]
        answers: list[str] = []
        dropped = coerced = 0
        for item in values:
            if isinstance(item, str):
                answers.append(item)
            elif isinstance(item, bool | int) or (isinstance(item, float)
                                                   and math.isfinite(item)):
                answers.append(json.dumps(item))
                coerced += 1
            else:
                dropped += 1
        if isinstance(value, dict) or not answers:
            shown = ", ".join(sorted({_json_type(v) for v in values}))
            raise ConversionError(f"{key!r} holds no usable answer (got {shown}); gold "
                                  "answers are strings (numbers are converted)")
        if coerced:
            counters["answers_coerced_to_string"] += coerced
        if dropped:
            counters["answers_dropped"] += dropped
        return answers
    return []


def _record_id(record: dict[str, Any], key: str) -> str | None:
    """A string or integer id as text; None when absent or null; other types are refused."""
    value = record.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ConversionError(f"{key!r} must be a string or an integer, got {_json_type(value)}")


def convert_drvenus_record(record: dict[str, Any], fallback_id: str, tools: Sequence[str],
                           prompt_date: str | None = None,
                           counters: Counter[str] | None = None) -> Trajectory:
    """Convert one DR-Venus / REDSearcher (or OpenAI-style) record to a Trajectory.

    Args:
        record: the decoded JSON object (module docstring).
        fallback_id: the id to use when the record has no "id" (e.g. "file-line").
        tools: the tools our system prompt offers (the ones the pipeline keeps).
        prompt_date: the "Current date:" of our prompt; None keeps the source's date line
            (or the protocol default when the source has none).
        counters: receives counts of repairs made (restored think tags, wrapped replies).

    Raises:
        ConversionError: the record does not describe a conversation we can represent.
    """
    counters = counters if counters is not None else Counter()
    raw_messages = record.get("messages", record.get("conversations"))
    if not isinstance(raw_messages, list) or not raw_messages:
        raise ConversionError("record has no non-empty 'messages' list")
    source_date = None
    question_message: str | None = None
    messages: list[dict[str, Any]] = []
    for index, message in enumerate(raw_messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ConversionError(f"{where} must be an object with a string 'role'")
        role = message["role"]
        if role == "system":
            if messages or question_message is not None:
                raise ConversionError(f"{where}: a system message after the conversation began")
            # Null is accepted here: the source system prompt is replaced by ours anyway.
            found = _DATE_LINE.search(_text(message.get("content"), where, null_ok=True))
            source_date = found.group(1).strip() if found else None
        elif role == "user" and question_message is None:
            question_message = _text(message.get("content"), where).strip()
            if not question_message:
                raise ConversionError(f"{where}: the question is empty")
        elif question_message is None:
            raise ConversionError(f"{where}: a {role!r} message before the user's question")
        elif role == "assistant":
            messages.append({"role": "assistant",
                             "content": _assistant_content(message, where, counters)})
        elif role == "tool":
            content = _text(message.get("content"), where)
            messages.append({"role": "user", "content": _as_tool_response(
                content, counters, "tool_role_messages_converted")})
        elif role == "user":
            content = _text(message.get("content"), where)
            messages.append({"role": "user", "content": _as_tool_response(
                content, counters, "bare_tool_replies_wrapped")})
        else:
            raise ConversionError(f"{where}: unknown role {role!r}")
    if question_message is None:
        raise ConversionError("record has no user message (the question)")
    if not any(m["role"] == "assistant" for m in messages):
        raise ConversionError("record has no assistant turn")
    date = prompt_date or source_date
    system = render_system_prompt(tools, date) if date else render_system_prompt(tools)
    full = [{"role": "system", "content": system}, {"role": "user", "content": question_message},
            *messages]
    task_id = _record_id(record, "task_id")
    record_id = _record_id(record, "id")
    if record_id is None:
        record_id = task_id
    if record_id is None:
        record_id = fallback_id
        counters["ids_from_file_and_line"] += 1
    question = record.get("question")
    if question is not None and not isinstance(question, str):
        raise ConversionError(f"'question' must be a string, got {_json_type(question)}")
    metadata: dict[str, Any] = {"source_format": "drvenus"}
    if isinstance(record.get("prediction"), str):
        metadata["source_prediction"] = record["prediction"]
    return Trajectory(
        id=record_id,
        messages=full,
        task_id=task_id or "",
        question=question if isinstance(question, str) and question.strip() else question_message,
        answers=_gold_answers(record, counters),
        turns=annotate_turns(full, tools),
        metadata=metadata,
    )


# --- reading ---------------------------------------------------------------------------
def detect_format(record: dict[str, Any]) -> str:
    """"trajectory" for a record as `Trajectory.to_json` writes it, else "drvenus".

    Our records carry only schema keys, always including "id", "answers" and "turns", and
    plain {role, content} messages. A bare {"id", "messages"} record is read as DR-Venus, so
    it gets our system prompt; pass input_format="trajectory" for hand-written minimal ones.
    """
    if not {"id", "answers", "turns"} <= set(record) or not set(record) <= _TRAJECTORY_FIELDS:
        return "drvenus"
    messages = record.get("messages")
    plain = isinstance(messages, list) and all(
        isinstance(m, dict) and set(m) == {"role", "content"} and isinstance(m["content"], str)
        and m["role"] in ("system", "user", "assistant") for m in messages)
    return "trajectory" if plain else "drvenus"


def _report_bad(message: str, skip_bad: bool, bad_lines: list[str] | None) -> None:
    if not skip_bad:
        raise DataFormatError(message)
    if bad_lines is not None:
        bad_lines.append(message)


#: Exceptions a conversion may raise on hostile input; each becomes a bad line, not a crash.
_RECORD_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError)
#: Duplicate ids listed one by one in the report; the count covers all of them.
MAX_LISTED_DUPLICATES = 20


def read_inputs(paths: Iterable[str | Path], tools: Sequence[str] = DEFAULT_TOOLS,
                input_format: str = "auto", prompt_date: str | None = None,
                skip_bad: bool = False, bad_lines: list[str] | None = None,
                counters: Counter[str] | None = None,
                duplicates: list[str] | None = None) -> Iterator[Trajectory]:
    """Stream trajectories from JSONL files in either input format (module docstring).

    Args:
        paths: input JSONL files, read in order (UTF-8, or UTF-16 by byte-order mark:
            `venus_gym.corpus.iter_lines`).
        tools: tools kept by the pipeline (our system prompt offers exactly these).
        input_format: "auto" (per record, `detect_format`), "drvenus" or "trajectory".
        prompt_date: see `convert_drvenus_record`.
        skip_bad: skip bad lines (appending "file:line: why" to `bad_lines`) instead of
            raising DataFormatError.
        counters: receives per-format record counts, conversion repair counts and
            `duplicate_ids_kept`.
        duplicates: receives "file:line: duplicate id ..." for the first
            MAX_LISTED_DUPLICATES trajectories whose id an earlier one already had. They
            are kept (several trajectories of one question are legitimate), only counted.
    """
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"unknown input format {input_format!r}; one of {list(INPUT_FORMATS)}")
    counters = counters if counters is not None else Counter()
    first_seen: dict[str, str] = {}
    for path in paths:
        for lineno, record in read_jsonl(path, skip_bad=skip_bad, errors=bad_lines):
            kind = detect_format(record) if input_format == "auto" else input_format
            try:
                if kind == "trajectory":
                    trajectory = Trajectory.from_json(record)
                    check_invariants(trajectory)
                else:
                    trajectory = convert_drvenus_record(
                        record, f"{Path(path).stem}-{lineno}", tools, prompt_date, counters)
            except _RECORD_ERRORS as e:
                why = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
                _report_bad(f"{path}:{lineno}: {why}", skip_bad, bad_lines)
                continue
            counters[f"records_{kind}"] += 1
            where = f"{path}:{lineno}"
            first = first_seen.setdefault(trajectory.id, where)
            if first != where:
                counters["duplicate_ids_kept"] += 1
                if duplicates is not None and len(duplicates) < MAX_LISTED_DUPLICATES:
                    duplicates.append(f"{where}: duplicate id {trajectory.id!r} (first at "
                                      f"{first}); kept")
            yield trajectory
