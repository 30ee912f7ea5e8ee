"""Tests for venus_gym.protocol: the turn parser, the writers and the prompt."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from venus_gym.protocol import (
    FORCED_FINAL_NOTICE,
    TOOL_SCHEMAS,
    ParsedTurn,
    ToolCall,
    format_answer_turn,
    format_error_notice,
    format_tool_call,
    format_tool_response,
    format_tool_turn,
    is_repetitive,
    parse_turn,
    render_system_prompt,
    tool_call_key,
)

STRUCTURAL_TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<answer>", "</answer>"]
TAG_PATTERN = re.compile("|".join(map(re.escape, STRUCTURAL_TAGS)))

SEARCH_TURN = (
    "<think>\nI should look this up.\n</think>\n<tool_call>\n"
    '{"name": "search", "arguments": {"query": ["capital of France", "France capital city"]}}\n'
    "</tool_call>"
)
VISIT_TURN = (
    "<think>\nThe first hit looks right.\n</think>\n<tool_call>\n"
    '{"name": "visit", "arguments": {"url": ["https://example.org/france"], '
    '"goal": "find the capital"}}\n</tool_call>'
)
ANSWER_TURN = "<think>\nThe page says Paris.\n</think>\n<answer>\nParis\n</answer>"

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_well_formed(result: ParsedTurn) -> None:
    """The invariants every ParsedTurn must satisfy, valid or not."""
    assert isinstance(result, ParsedTurn)
    assert result.kind in {"search", "visit", "answer", "invalid"}
    assert isinstance(result.valid, bool)
    assert isinstance(result.reason, str)
    assert isinstance(result.think, str)
    assert result.think == result.think.strip()
    assert result.intent in {"tool", "answer", "unknown"}
    if result.valid:
        assert result.reason == "ok"
        assert result.kind != "invalid"
        if result.kind == "answer":
            assert result.tool_call is None
            assert isinstance(result.answer, str) and result.answer
            assert result.answer == result.answer.strip()
            assert result.intent == "answer"
        else:
            assert isinstance(result.tool_call, ToolCall)
            assert result.tool_call.name == result.kind == result.tool_name
            assert isinstance(result.tool_call.arguments, dict)
            assert result.answer is None
            assert result.intent == "tool"
    else:
        assert result.kind == "invalid"
        assert result.reason and result.reason != "ok"
        assert result.tool_call is None and result.tool_name is None
        assert result.answer is None


def parse_checked(text: str, **kwargs) -> ParsedTurn:
    result = parse_turn(text, **kwargs)
    assert_well_formed(result)
    return result


def tool_turn(body: str, think: str = "plan") -> str:
    """A tool turn with a hand-written (possibly broken) tool_call body."""
    return f"<think>\n{think}\n</think>\n<tool_call>\n{body}\n</tool_call>"


# --------------------------------------------------------------------------- schemas, prompt


def test_tool_schemas_describe_search_and_visit():
    assert set(TOOL_SCHEMAS) == {"search", "visit"}
    for name, schema in TOOL_SCHEMAS.items():
        assert schema["type"] == "function"
        assert schema["function"]["name"] == name
        assert schema["function"]["description"]
    search = TOOL_SCHEMAS["search"]["function"]["parameters"]
    assert search["required"] == ["query"]
    assert search["properties"]["query"]["type"] == "array"
    assert search["properties"]["query"]["items"]["type"] == "string"
    assert search["properties"]["query"]["minItems"] == 1
    visit = TOOL_SCHEMAS["visit"]["function"]["parameters"]
    assert visit["required"] == ["url", "goal"]
    assert visit["properties"]["url"]["minItems"] == 1
    assert visit["properties"]["goal"]["type"] == "string"


def test_system_prompt_lists_one_schema_per_line_inside_tools_block():
    prompt = render_system_prompt()
    tools_block = prompt.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    lines = tools_block.split("\n")
    assert [json.loads(line) for line in lines] == [TOOL_SCHEMAS["search"], TOOL_SCHEMAS["visit"]]
    assert prompt.index("deep research") < prompt.index("# Tools") < prompt.index("<tools>")


def test_system_prompt_explains_call_think_and_answer_format_and_date():
    prompt = render_system_prompt(date="2031-12-24")
    assert (
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        in prompt
    )
    assert "<think></think>" in prompt
    assert "<answer>\n...\n</answer>" in prompt
    assert prompt.endswith("Current date: 2031-12-24")


def test_system_prompt_is_deterministic_and_follows_tool_selection_and_order():
    assert render_system_prompt() == render_system_prompt()
    only_search = render_system_prompt(("search",))
    assert '"name": "visit"' not in only_search
    reordered = render_system_prompt(("visit", "search"))
    assert reordered.index('"name": "visit"') < reordered.index('"name": "search"')


@pytest.mark.parametrize("tools", [("browse",), ("search", "browse"), ()])
def test_system_prompt_rejects_unknown_or_missing_tools(tools):
    with pytest.raises(ValueError, match="search, visit"):
        render_system_prompt(tools)


def test_compact_system_prompt_states_the_same_rules_for_each_offered_tool():
    full, compact = render_system_prompt(), render_system_prompt(style="compact")
    assert len(compact) < len(full) / 2
    for rule in ("<think></think>", "<tool_call>\n", "\n</tool_call>", "<answer>\n...\n</answer>"):
        assert rule in compact
    assert '- search {"query": [str]}:' in compact
    assert '- visit {"url": [str], "goal": str}:' in compact
    assert compact.endswith("Current date: 2025-01-01")
    assert render_system_prompt(style="compact") == compact
    only_visit = render_system_prompt(("visit",), date="2030-02-03", style="compact")
    assert "- search" not in only_visit and "- visit" in only_visit
    assert only_visit.endswith("Current date: 2030-02-03")


def test_system_prompt_rejects_an_unknown_style_naming_the_valid_ones():
    with pytest.raises(ValueError, match="'tiny'.*full, compact"):
        render_system_prompt(style="tiny")


def test_system_prompt_rejects_repeated_tools():
    with pytest.raises(ValueError, match="unique"):
        render_system_prompt(("search", "search"))


# --------------------------------------------------------------------------- valid turns


def test_valid_search_turn():
    result = parse_checked(SEARCH_TURN)
    assert result.valid and result.kind == "search" and result.reason == "ok"
    assert result.think == "I should look this up."
    assert result.tool_call == ToolCall(
        "search", {"query": ["capital of France", "France capital city"]}
    )
    assert result.tool_name == "search"
    assert result.answer is None
    assert result.intent == "tool"


def test_valid_visit_turn():
    result = parse_checked(VISIT_TURN)
    assert result.valid and result.kind == "visit"
    assert result.tool_call.arguments == {
        "url": ["https://example.org/france"],
        "goal": "find the capital",
    }


def test_valid_answer_turn():
    result = parse_checked(ANSWER_TURN)
    assert result.valid and result.kind == "answer"
    assert result.answer == "Paris"
    assert result.think == "The page says Paris."
    assert result.tool_call is None and result.tool_name is None
    assert result.intent == "answer"


def test_several_think_blocks_are_joined_in_order():
    text = "<think>\nfirst idea\n</think>\n\n<think>  </think>\n<think>second idea</think>\n" + (
        "<answer>42</answer>"
    )
    result = parse_checked(text)
    assert result.valid
    assert result.think == "first idea\n\nsecond idea"
    assert result.answer == "42"


def test_surrounding_whitespace_and_empty_think_are_accepted():
    result = parse_checked("\n  <think></think><answer> Paris </answer>\n\n")
    assert result.valid and result.answer == "Paris" and result.think == ""


def test_text_between_thinking_and_action_is_allowed_but_not_thought():
    text = "<think>plan</think>\nLet me search.\n" + format_tool_call("search", {"query": ["x"]})
    result = parse_checked(text)
    assert result.valid and result.think == "plan"


def test_arguments_encoded_as_json_string_are_accepted():
    body = json.dumps({"name": "search", "arguments": json.dumps({"query": ["a", "b"]})})
    result = parse_checked(tool_turn(body))
    assert result.valid and result.tool_call.arguments == {"query": ["a", "b"]}


def test_tag_text_inside_escaped_json_string_is_not_a_tag():
    body = '{"name": "search", "arguments": {"query": ["what does \\u003c/tool_call> mean"]}}'
    result = parse_checked(tool_turn(body))
    assert result.valid and result.tool_call.arguments["query"] == ["what does </tool_call> mean"]


# --------------------------------------------------------------------------- invalid turns

INVALID_CASES = [
    # (test id, turn text, expected reason (substring), expected intent)
    ("empty", "", "empty turn", "unknown"),
    ("whitespace only", " \n\t ", "empty turn", "unknown"),
    ("no think", "Paris", "no <think> block", "unknown"),
    ("answer without think", "<answer>Paris</answer>", "no <think> block", "answer"),
    ("text before think", "Sure! " + ANSWER_TURN, "text before the first <think>: 'Sure!'", "answer"),
    (
        "nested think",
        "<think>a<think>b</think></think><answer>x</answer>",
        "nested <think> inside a <think> block",
        "answer",
    ),
    (
        "stray closer",
        "<think>a</think></think><answer>x</answer>",
        "</think> without a matching <think>",
        "answer",
    ),
    ("unclosed think", "<think>a <answer>x</answer>", "<think> block is never closed", "answer"),
    (
        "think opened after the last closer",
        "<think>a</think><think><answer>x</answer>",
        "<think> block is never closed",
        "answer",
    ),
    (
        "stray closer balanced by a late opener",
        "<think>a</think></think><think><answer>x</answer>",
        "</think> without a matching <think>",
        "answer",
    ),
    (
        "answer and tool call",
        ANSWER_TURN.replace("<answer>", format_tool_call("search", {"query": ["q"]}) + "<answer>"),
        "both <tool_call> and <answer>",
        "unknown",
    ),
    (
        "two tool calls",
        SEARCH_TURN + "\n" + format_tool_call("search", {"query": ["again"]}),
        "2 <tool_call> and 2 </tool_call> tags; exactly one <tool_call>...</tool_call> block",
        "tool",
    ),
    (
        "two answers",
        ANSWER_TURN + "<answer>Lyon</answer>",
        "2 <answer> and 2 </answer> tags",
        "answer",
    ),
    (
        "tool call inside think",
        "<think>" + format_tool_call("search", {"query": ["q"]}) + "</think><answer>x</answer>",
        "<tool_call> inside a <think> block",
        "unknown",
    ),
    (
        "tool call between think blocks",
        "<think>a</think>"
        + format_tool_call("search", {"query": ["q"]})
        + "<think>b</think><answer>x</answer>",
        "<tool_call> before the last </think>",
        "unknown",
    ),
    (
        "answer tag inside think of a tool turn",
        SEARCH_TURN.replace("look this up.", "answer in <answer> later"),
        "<answer> inside a <think> block",
        "unknown",
    ),
    ("no action", "<think>hmm</think>\nI give up.", "no <tool_call> or <answer> after the last </think>", "unknown"),
    ("unclosed tool call", "<think>a</think><tool_call>{}", "<tool_call> is never closed", "tool"),
    ("closer without opener", "<think>a</think>{}</tool_call>", "</tool_call> without a matching <tool_call>", "tool"),
    ("closer before opener", "<think>a</think></tool_call>{}<tool_call>", "</tool_call> comes before <tool_call>", "tool"),
    ("unclosed answer", "<think>a</think><answer>Paris", "<answer> is never closed", "answer"),
    ("invalid JSON", tool_turn("not json"), "tool_call body is not valid JSON: Expecting value at char 0", "tool"),
    ("empty body", tool_turn(""), "tool_call body is not valid JSON: Expecting value at char 0", "tool"),
    ("body not an object", tool_turn('["search"]'), "tool_call body must be a JSON object, got list", "tool"),
    ("missing name", tool_turn('{"arguments": {"query": ["q"]}}'), "tool_call JSON has no 'name'", "tool"),
    ("missing arguments", tool_turn('{"name": "search"}'), "tool_call JSON has no 'arguments'", "tool"),
    (
        "extra top-level key",
        tool_turn('{"name": "search", "arguments": {"query": ["q"]}, "id": 1}'),
        "unexpected key(s) 'id' in tool_call JSON",
        "tool",
    ),
    ("name not a string", tool_turn('{"name": 7, "arguments": {}}'), "tool_call 'name' must be a string, got int", "tool"),
    (
        "arguments not a dict",
        tool_turn('{"name": "search", "arguments": ["q"]}'),
        "tool_call 'arguments' must be a JSON object, got list",
        "tool",
    ),
    (
        "arguments null",
        tool_turn('{"name": "search", "arguments": null}'),
        "tool_call 'arguments' must be a JSON object, got null",
        "tool",
    ),
    (
        "arguments string not JSON",
        tool_turn('{"name": "search", "arguments": "query=q"}'),
        "tool_call 'arguments' string is not valid JSON",
        "tool",
    ),
    (
        "arguments string decodes to a list",
        tool_turn('{"name": "search", "arguments": "[1]"}'),
        "got list (decoded from a string)",
        "tool",
    ),
    (
        "unknown tool",
        tool_turn('{"name": "browse", "arguments": {"query": ["q"]}}'),
        "unknown tool 'browse'; available: search, visit",
        "tool",
    ),
    (
        "query is a string",
        tool_turn('{"name": "search", "arguments": {"query": "capital of France"}}'),
        "argument 'query' must be a non-empty list of strings, got str",
        "tool",
    ),
    (
        "query is empty",
        tool_turn('{"name": "search", "arguments": {"query": []}}'),
        "argument 'query' must be a non-empty list of strings, got a list of 0 item(s)",
        "tool",
    ),
    (
        "query item not a string",
        tool_turn('{"name": "search", "arguments": {"query": ["ok", 3]}}'),
        "got int at index 1",
        "tool",
    ),
    (
        "query item blank",
        tool_turn('{"name": "search", "arguments": {"query": [" "]}}'),
        "got a blank string at index 0",
        "tool",
    ),
    (
        "url not a list",
        tool_turn('{"name": "visit", "arguments": {"url": "https://a.org", "goal": "g"}}'),
        "argument 'url' must be a non-empty list of strings, got str",
        "tool",
    ),
    (
        "goal not a string",
        tool_turn('{"name": "visit", "arguments": {"url": ["https://a.org"], "goal": ["g"]}}'),
        "argument 'goal' must be a non-empty string, got list",
        "tool",
    ),
    (
        "goal blank",
        tool_turn('{"name": "visit", "arguments": {"url": ["https://a.org"], "goal": ""}}'),
        "argument 'goal' must be a non-empty string, got a blank string",
        "tool",
    ),
    (
        "missing goal",
        tool_turn('{"name": "visit", "arguments": {"url": ["https://a.org"]}}'),
        "missing required argument 'goal' for tool 'visit'",
        "tool",
    ),
    (
        "unknown argument",
        tool_turn('{"name": "search", "arguments": {"query": ["q"], "topk": 3}}'),
        "unexpected argument(s) 'topk' for tool 'search'; allowed: query",
        "tool",
    ),
    ("empty answer", "<think>a</think>\n<answer>\n  \n</answer>", "empty <answer> block", "answer"),
    ("text after tool call", SEARCH_TURN + "\nDone.", "text after </tool_call>: 'Done.'", "tool"),
    ("text after answer", ANSWER_TURN + " (I think)", "text after </answer>: '(I think)'", "answer"),
    (
        "stop string left in",
        SEARCH_TURN + "\n<tool_response>",
        "text after </tool_call>: '<tool_response>' (the <tool_response> stop string must be stripped",
        "tool",
    ),
    ("deeply nested body", tool_turn("[" * 100_000), "tool_call body is not valid JSON", "tool"),
    ("integer beyond digit limit", tool_turn("1" * 5000), "tool_call body is not valid JSON", "tool"),
]


@pytest.mark.parametrize(
    ("text", "expected_reason", "expected_intent"),
    [case[1:] for case in INVALID_CASES],
    ids=[case[0] for case in INVALID_CASES],
)
def test_invalid_turn_reports_reason(text, expected_reason, expected_intent):
    result = parse_checked(text)
    assert not result.valid
    assert expected_reason in result.reason
    assert result.intent == expected_intent


def test_invalid_tool_turn_keeps_its_thinking():
    result = parse_checked(tool_turn("not json", think="I was thinking"))
    assert not result.valid and result.think == "I was thinking"


def test_tool_selection_restricts_what_may_be_called():
    result = parse_checked(VISIT_TURN, tools=("search",))
    assert result.reason == "unknown tool 'visit'; available: search"
    assert parse_checked(SEARCH_TURN, tools=()).reason == "unknown tool 'search'; available: none"
    assert parse_checked(ANSWER_TURN, tools=()).valid


@pytest.mark.parametrize("not_text", [None, b"<think></think><answer>x</answer>", 42])
def test_non_string_turn_raises_type_error(not_text):
    with pytest.raises(TypeError, match="str"):
        parse_turn(not_text)


def test_bad_tool_configuration_raises():
    with pytest.raises(TypeError, match="collection of tool names"):
        parse_turn(SEARCH_TURN, tools="search")
    with pytest.raises(ValueError, match="valid tools: search, visit"):
        parse_turn(SEARCH_TURN, tools=("browse",))


# --------------------------------------------------------------------------- writers, notices


def test_format_tool_call_layout_and_unicode():
    assert format_tool_call("search", {"query": ["a"]}) == (
        '<tool_call>\n{"name": "search", "arguments": {"query": ["a"]}}\n</tool_call>'
    )
    assert "Zürich 東京" in format_tool_call("search", {"query": ["Zürich 東京"]})


def test_format_tool_call_escapes_tags_inside_strings():
    arguments = {"query": ["<think>", "a </tool_call> b", "<answer>x</answer>"]}
    written = format_tool_call("search", arguments)
    assert written.count("<tool_call>") == 1 and written.count("</tool_call>") == 1
    result = parse_checked(format_tool_turn("t", "search", arguments))
    assert result.valid and result.tool_call.arguments == arguments


def test_format_turn_layouts():
    assert format_tool_turn("why", "search", {"query": ["q"]}) == (
        '<think>\nwhy\n</think>\n<tool_call>\n{"name": "search", "arguments": {"query": ["q"]}}'
        "\n</tool_call>"
    )
    assert format_answer_turn("why", "Paris") == "<think>\nwhy\n</think>\n<answer>\nParis\n</answer>"


@pytest.mark.parametrize("tag", STRUCTURAL_TAGS)
def test_writers_refuse_free_text_containing_tags(tag):
    with pytest.raises(ValueError, match="think text"):
        format_tool_turn(f"a {tag} b", "search", {"query": ["q"]})
    with pytest.raises(ValueError, match="think text"):
        format_answer_turn(f"a {tag} b", "x")
    with pytest.raises(ValueError, match="answer text"):
        format_answer_turn("ok", f"a {tag} b")


def test_environment_messages():
    assert format_tool_response("1. [T](u)\nsnippet") == (
        "<tool_response>\n1. [T](u)\nsnippet\n</tool_response>"
    )
    notice = format_error_notice("unknown tool 'browse'; available: search, visit")
    assert notice.startswith("<tool_response>\n") and notice.endswith("\n</tool_response>")
    assert "unknown tool 'browse'; available: search, visit" in notice
    assert "malformed" in notice
    assert "<answer></answer>" in notice and "<tool_call>" in notice
    assert "maximum number of interaction turns" in FORCED_FINAL_NOTICE
    assert "<answer></answer>" in FORCED_FINAL_NOTICE


def test_tool_call_key_ignores_key_order_but_not_values():
    first = ToolCall("visit", {"url": ["u"], "goal": "g"})
    reordered = ToolCall("visit", {"goal": "g", "url": ["u"]})
    assert tool_call_key(first) == tool_call_key(reordered)
    assert tool_call_key(first) != tool_call_key(ToolCall("visit", {"url": ["u"], "goal": "h"}))
    assert tool_call_key(ToolCall("search", {"query": ["a", "b"]})) != tool_call_key(
        ToolCall("search", {"query": ["b", "a"]})
    )
    assert "visit" in tool_call_key(first)


def test_tool_call_key_matches_parsed_duplicate_calls():
    spaced = tool_turn('{"arguments": {"query": ["q"]},   "name": "search"}')
    compact = tool_turn('{"name":"search","arguments":{"query":["q"]}}')
    assert tool_call_key(parse_turn(spaced).tool_call) == tool_call_key(parse_turn(compact).tool_call)


def test_is_repetitive():
    assert is_repetitive("intro " + "x" * 300)  # 6 disjoint copies of the 50-char tail
    assert not is_repetitive("x" * 250)  # exactly 5 copies is still acceptable
    assert not is_repetitive("x" * 49)  # shorter than the window
    assert is_repetitive("ab" * 10, window=4, times=4)
    varied = " ".join(f"word{index}" for index in range(500))
    assert not is_repetitive(varied)
    with pytest.raises(ValueError):
        is_repetitive("text", window=0)


# --------------------------------------------------------------------------- properties

free_text = st.text(max_size=200).filter(lambda text: not TAG_PATTERN.search(text))
non_blank_text = st.text(min_size=1, max_size=60).filter(lambda text: text.strip())
search_arguments = st.fixed_dictionaries({"query": st.lists(non_blank_text, min_size=1, max_size=4)})
visit_arguments = st.fixed_dictionaries(
    {"url": st.lists(non_blank_text, min_size=1, max_size=3), "goal": non_blank_text}
)
valid_calls = st.one_of(
    st.tuples(st.just("search"), search_arguments), st.tuples(st.just("visit"), visit_arguments)
)
valid_answer = non_blank_text.filter(lambda text: not TAG_PATTERN.search(text))


@st.composite
def valid_turns(draw) -> str:
    """A well-formed turn of either kind, possibly with trailing whitespace."""
    think = draw(free_text)
    if draw(st.booleans()):
        name, arguments = draw(valid_calls)
        turn = format_tool_turn(think, name, arguments)
    else:
        turn = format_answer_turn(think, draw(valid_answer))
    return turn + draw(st.sampled_from(["", "\n", " \n\t"]))


@FAST
@given(think=free_text, call=valid_calls)
def test_tool_turn_round_trips(think, call):
    name, arguments = call
    result = parse_checked(format_tool_turn(think, name, arguments))
    assert result.valid, result.reason
    assert result.kind == name
    assert result.tool_call == ToolCall(name, arguments)
    assert result.think == think.strip()


@FAST
@given(think=free_text, answer=valid_answer)
def test_answer_turn_round_trips(think, answer):
    result = parse_checked(format_answer_turn(think, answer))
    assert result.valid, result.reason
    assert result.answer == answer.strip()
    assert result.think == think.strip()


@FAST
@given(text=st.text(max_size=3000))
def test_any_text_parses_without_raising(text):
    result = parse_checked(text)
    assert result.valid == (result.reason == "ok")


TOKENS = STRUCTURAL_TAGS + [
    "<tool_response>",
    "</tool_response>",
    "{", "}", "[", "]", '"', ":", ",", "\\", "<", ">", "/", "\n", " ",
    '"name"', '"arguments"', '"search"', '"visit"', '"browse"', '"query"', '"url"', '"goal"',
    '["q"]', '"x"', "1", "null", "true",
    '{"name": "search", "arguments": {"query": ["q"]}}',
    '{"name": "visit", "arguments": {"url": ["u"], "goal": "g"}}',
]  # fmt: skip
tag_soup = st.lists(
    st.one_of(st.sampled_from(TOKENS), st.text(max_size=6)), max_size=40
).map("".join)


@FAST
@given(text=tag_soup)
def test_tag_soup_parses_without_raising(text):
    result = parse_checked(text)
    assert result.valid == (result.reason == "ok")


@FAST
@given(turn=valid_turns())
def test_truncated_valid_turns_are_invalid(turn):
    assert parse_checked(turn).valid
    for cut in range(len(turn)):
        prefix = turn[:cut]
        only_whitespace_removed = not turn[cut:].strip()
        assert parse_checked(prefix).valid == only_whitespace_removed, repr(prefix)


@st.composite
def turns_with_an_extra_tag(draw) -> str:
    """A valid turn with one structural tag inserted anywhere except inside another tag."""
    turn = draw(valid_turns())
    inside_tags = {
        position for tag in TAG_PATTERN.finditer(turn) for position in range(tag.start() + 1, tag.end())
    }
    allowed_positions = [position for position in range(len(turn) + 1) if position not in inside_tags]
    position = draw(st.sampled_from(allowed_positions))
    return turn[:position] + draw(st.sampled_from(STRUCTURAL_TAGS)) + turn[position:]


@FAST
@given(text=turns_with_an_extra_tag())
def test_one_extra_tag_always_breaks_a_valid_turn(text):
    assert not parse_checked(text).valid


@FAST
@given(turn=valid_turns(), repeats=st.integers(2, 50), tag=st.sampled_from(STRUCTURAL_TAGS))
def test_repeated_and_nested_tags_parse_without_raising(turn, repeats, tag):
    parse_checked(tag * repeats + turn)
    parse_checked(turn.replace(tag, tag * repeats))
    assert not parse_checked(turn.replace(tag, tag * repeats)).valid or tag not in turn
    nested = "".join(STRUCTURAL_TAGS) * repeats + turn + "".join(reversed(STRUCTURAL_TAGS))
    assert not parse_checked(nested).valid


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
argument_dicts = st.one_of(
    search_arguments,
    visit_arguments,
    st.dictionaries(st.sampled_from(["query", "url", "goal", "topk"]), json_values, max_size=3),
)


def arguments_if_conforming(name: object, arguments: object) -> dict | None:
    """An independent statement of rules 8-9: the decoded arguments if the call is valid."""

    def non_blank_strings(value: object) -> bool:
        return (
            isinstance(value, list)
            and len(value) > 0
            and all(isinstance(item, str) and item.strip() for item in value)
        )

    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    if name == "search":
        valid = set(arguments) == {"query"} and non_blank_strings(arguments["query"])
    elif name == "visit":
        goal = arguments.get("goal")
        valid = (
            set(arguments) == {"url", "goal"}
            and non_blank_strings(arguments["url"])
            and isinstance(goal, str)
            and bool(goal.strip())
        )
    else:
        valid = False
    return arguments if valid else None


@FAST
@given(
    name=st.one_of(st.sampled_from(["search", "visit", "browse", ""]), json_values),
    arguments=st.one_of(argument_dicts, json_values),
)
def test_tool_call_valid_exactly_when_it_matches_the_schema(name, arguments):
    result = parse_checked(format_tool_turn("t", name, arguments))
    expected_arguments = arguments_if_conforming(name, arguments)
    assert result.valid == (expected_arguments is not None), result.reason
    if result.valid:
        assert result.tool_call.arguments == expected_arguments


LARGE_INPUTS = {
    "2 MB of plain text": "a" * 2_000_000,
    "2 MB answer turn": format_answer_turn("x" * 1_000_000, "y" * 1_000_000),
    "2 MB of opening think tags": "<think>" * 300_000,
    "1 MB of empty think blocks": "<think></think>" * 70_000,
    "many answer tags": "<think>x</think>" + "<answer>" * 250_000,
    "many closing think tags": "<think>" + "</think>" * 250_000,
    "deep array body": tool_turn("[" * 100_000),
    "deep object body": tool_turn('{"a":' * 100_000),
    "deep arguments string": tool_turn('{"name": "search", "arguments": "' + "[" * 100_000 + '"}'),
    "unterminated string body": tool_turn('"' + "x" * 1_000_000),
    "huge valid call": format_tool_turn("t", "search", {"query": ["q"] * 100_000}),
}


VALID_LARGE_INPUTS = {"2 MB answer turn", "huge valid call"}


@pytest.mark.parametrize("name", LARGE_INPUTS.keys())
def test_large_and_deep_inputs_parse_without_raising(name):
    # Linear-time parsing takes tens of milliseconds here; a backtracking regex would hang
    # the suite for minutes (no timed assertion: speed claims live in benchmarks/).
    result = parse_checked(LARGE_INPUTS[name])
    assert result.valid == (name in VALID_LARGE_INPUTS), result.reason
