"""Untrusted text made safe to show a model: what `venus_gym.protocol` re-exports as
`clean_text`, `sanitize_observation` and `sanitize_value` (tool output, the model's own
strings echoed back, anything else that leaves the environment).

Sanitising is a fixed point: `sanitize_observation(sanitize_observation(x)) ==
sanitize_observation(x)`, and no output holds a chat control token (`CHAT_CONTROL_TOKEN`)
or a tool_response tag (`RESPONSE_TAG`). The order of the two rewrites is what makes it
so (see `sanitize_observation`).
"""

from __future__ import annotations

import re
from typing import Any

# A chat template's control token (`<|im_end|>`, `<|endoftext|>`, ...), and the tags that
# frame a tool result.
CHAT_CONTROL_TOKEN = re.compile(r"<\|([^|<>\s]{1,64})\|>")
RESPONSE_TAG = re.compile(r"<(/?tool_response)>")
# C0 controls but tab and newline, DEL, C1 controls, and surrogates (in a str always lone).
_UNSAFE_CHARS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
REPLACEMENT_CHARACTER = "\ufffd"


def clean_text(text: str) -> str:
    """Text without control characters or lone surrogates, for anything shown to a model.

    Carriage returns become newlines ("\\r\\n" one newline); every other C0 control but
    tab and newline, DEL, every C1 control (U+0080-U+009F) and every lone surrogate
    (from a `"\\ud800"` JSON escape; UTF-8 cannot encode it) becomes U+FFFD, so an
    escape sequence or a NUL stays visible as a replacement but can do nothing. Text
    without such characters is returned unchanged.
    """
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if _UNSAFE_CHARS.search(text):
        text = _UNSAFE_CHARS.sub(REPLACEMENT_CHARACTER, text)
    return text


def sanitize_observation(text: str) -> str:
    """Make untrusted text safe to place inside an observation, or anywhere else text
    leaves the environment (its transcript, `ChatHistory`'s messages, `info`).

    Tool output (web pages, search hits, summaries) and the model's own strings echoed back
    (queries, urls, goals, decoded from JSON escapes, the action itself in a transcript)
    can carry what must never reach a chat template as-is:
    - control characters and lone surrogates: `clean_text` (C0 but tab and newline, DEL,
      C1, surrogates -> U+FFFD; carriage returns -> newlines);
    - `<tool_response>` / `</tool_response>`, which would fake the frame: rewritten as
      `&lt;tool_response&gt;`;
    - chat control tokens such as `<|im_end|>`, which would close the message early and
      be tokenised as specials: rewritten as `< |im_end| >`.

    The tags go first: their rewrite drops a `<` and a `>`, which can complete a control
    token around them (`<|</tool_response>endoftext|>` becomes `<|&lt;/tool_response&gt;
    endoftext|>`), so the control tokens are rewritten after it. That rewrite only adds
    spaces, which can make no tag and no new token, so one pass reaches the fixed point.
    """
    text = clean_text(text)
    if "<" in text:
        text = RESPONSE_TAG.sub(r"&lt;\1&gt;", text)
        text = CHAT_CONTROL_TOKEN.sub(r"< |\1| >", text)
    return text


def sanitize_value(value: Any) -> Any:
    """`value` with `sanitize_observation` applied to every string in it (dict keys
    included, through lists, tuples and dicts); other values are returned as they are.
    For structured data that leaves the environment (`info["tool_calls"]` arguments)."""
    if isinstance(value, str):
        return sanitize_observation(value)
    if isinstance(value, dict):
        return {sanitize_value(k): sanitize_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(sanitize_value(v) for v in value)
    return value
