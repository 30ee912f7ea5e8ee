"""Chat-template tokenisation with exact loss masks, and the token-in/token-out rollout API.

Two ways to get token ids for a conversation, which agree by construction:

* `tokenize_conversation(messages, tokenizer)` (SFT data, checks): renders the messages
  through the tokenizer's *own* chat template and derives the loss mask from renderings of
  the message prefixes, never by decoding and re-encoding text.
* `ConversationBuilder` (rollouts): starts from the template's prompt ids, appends the ids
  the engine generated *verbatim*, and appends each environment reply as the template's ids
  for "reply as a user message + next generation prompt", computed as the difference of two
  renderings. Training then sees exactly the ids the policy was sampled on.

The masking rule (what "policy token" means)
    An assistant message renders as `<generation prompt><content ids><end-of-turn><closing>`;
    for ChatML: `<|im_start|>assistant\\n` + content + `<|im_end|>` + `\\n`. Mask 1 exactly on
    the content ids and the end-of-turn id: those are what the policy generates (it must learn
    to stop). Mask 0 on the generation prompt (the template writes it, not the policy), on the
    closing `\\n` after `<|im_end|>` (the engine stops at the end-of-turn token and never
    samples it; the template adds it when the next message is appended) and on every token of
    system, user and tool-response messages.

How the mask is derived
    With R(k) = ids of the first k messages rendered by the template and G(k) = the same
    with the generation prompt, every step must extend the previous ids (prefix stability):
    R(i) ⊑ G(i) ⊑ R(i+1) when message i is the assistant's, R(i) ⊑ R(i+1) otherwise. The
    policy span of assistant message i starts at len(G(i)) and ends after the first
    end-of-turn id at or after it. A turn's *boundary* is where the history h_<=t ends: the
    start of the next assistant message's generation prompt (after the environment reply),
    or the end of the ids for the last turn. `question_end` is the boundary before turn 1.
    Information-gain probes are appended at boundaries (trainers.algorithms.probes).

Untrained assistant turns
    An assistant message with `"weight": 0` (OpenAI's chat fine-tuning convention) keeps its
    turn span and boundary but gets mask 0: the turn is context, not a target. SFT data uses
    it for a malformed attempt followed by the environment's error reply and the corrected
    turn, so a model learns to recover without learning the mistake. `weight` is 0 or 1
    (default 1) and only assistant messages may carry it; `turn_weights(messages)` lists it.

Templates that are not prefix-stable are refused with `TemplateNotPrefixStableError`
naming the message index; nothing is guessed. Two causes are common:
    * History rewriting. Qwen3's template strips `<think>` blocks from assistant turns
      before the last user message, so appending a tool reply changes the ids of earlier
      turns: the ids a rollout was sampled on are not the ids training would see. Use a
      template without history rewriting (e.g. `CHATML_TEMPLATE`, passed as `chat_template=`).
    * A BPE merge across the generation prompt and the content: with byte-level GPT-2 style
      pre-tokenisers (SmolLM2, Qwen) content that starts with a newline merges with the
      prompt's `\\n` into one `\\n\\n` token. Strip leading whitespace from assistant content.
Message content must not contain the tokenizer's special (control) tokens such as
`<|im_end|>`: the template would render them as structure. They are refused by name.

Where we deviate from DR-Venus / the public code, and why
    * The reference code finds turns by splitting decoded text and searching for special
      tokens, and re-tokenises rollouts for training (design.md "Pitfalls"). Here turns and
      masks come from template renderings of message prefixes, and rollouts keep engine ids.
    * Prefix checks re-render the growing conversation, so tokenising T messages costs
      O(T x length) tokenizer work. That is fine for this project's trajectories; a faster
      path (render once with offsets) would need assumptions about the tokenizer we do not
      verify, so it is not offered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Message = Mapping[str, Any]  # {"role": str, "content": str}; other keys reach the template

ASSISTANT_ROLE = "assistant"
WEIGHT_KEY = "weight"  # 0: an assistant turn kept as context, not trained on (mask 0)
ZERO_WIDTH_SPACE = "\u200b"  # defuses control-token strings in generated text

# Plain ChatML without a default system prompt and without history rewriting: each message
# renders the same whatever follows it, so every conversation is prefix-stable.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Rendered once when a ChatTokenizer is built, so a template that rewrites history (the
# Qwen3 think-stripping case needs a think block followed by another user message) fails at
# construction rather than in the middle of a rollout.
_TEMPLATE_PROBE: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "You are a research assistant."},
    {"role": "user", "content": "Where was Ada born?"},
    {"role": "assistant", "content": "<think>\nSearch first.\n</think>\n<tool_call>\n{}\n</tool_call>"},
    {"role": "user", "content": "<tool_response>\nAda was born in London.\n</tool_response>"},
    {"role": "assistant", "content": "<think>\nFound it.\n</think>\n<answer>\nLondon\n</answer>"},
)


class ChatTokenizationError(ValueError):
    """Messages or generated ids that cannot be tokenised with exact masks."""


class TemplateNotPrefixStableError(ChatTokenizationError):
    """The chat template renders a conversation prefix differently once more is appended."""


@dataclass(frozen=True)
class TokenizedConversation:
    """Token ids of a conversation and where its policy tokens are.

    input_ids:        all token ids, as the template renders the conversation.
    loss_mask:        1 on policy tokens (assistant content + end-of-turn), 0 elsewhere.
    turn_spans:       per assistant message, the [start, end) span of its policy tokens.
    turn_boundaries:  per assistant message, the end of history h_<=t: the index where the
                      next generation prompt starts (after the environment reply); for the
                      last turn, the end of the conversation (before a trailing generation
                      prompt, if one was asked for).
    question_end:     the end of the history before the first assistant turn (h_<1).
    """

    input_ids: list[int]
    loss_mask: list[int]
    turn_spans: list[tuple[int, int]]
    turn_boundaries: list[int]
    question_end: int


@dataclass(frozen=True)
class _ReplyStep:
    """The template's ids around one environment reply (see ChatTokenizer.reply_ids)."""

    reply_ids: list[int]
    generation_prompt_ids: list[int]
    rendering: list[int]  # the whole conversation rendered with the next generation prompt
    prompt_start: int  # where that generation prompt starts in `rendering`


def _unwrap_ids(rendered: Any) -> list[int]:
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True);
    # transformers 4 returned the list itself.
    if isinstance(rendered, Mapping):
        rendered = rendered["input_ids"]
    return [int(token_id) for token_id in rendered]


def weight_problem(message: Message) -> str | None:
    """Why `message`'s training weight is not allowed, or None (absent, or 0/1 on an
    assistant message)."""
    if WEIGHT_KEY not in message:
        return None
    weight = message[WEIGHT_KEY]
    if message.get("role") != ASSISTANT_ROLE or isinstance(weight, bool) or weight not in (0, 1):
        return f"'{WEIGHT_KEY}' must be 0 or 1 and only on an assistant message, got {weight!r}"
    return None


def message_weight(message: Message) -> int:
    """An assistant message's training weight: 1 unless it says `"weight": 0`."""
    return int(message.get(WEIGHT_KEY, 1))


def turn_weights(messages: Sequence[Message]) -> list[int]:
    """Each assistant message's training weight (message_weight), in order."""
    return [message_weight(m) for m in messages if m.get("role") == ASSISTANT_ROLE]


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return min(len(a), len(b))


class ChatTokenizer:
    """A tokenizer's chat template, checked for exact token-level masking.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        chat_template: a Jinja template to use instead of the tokenizer's own (e.g.
            CHATML_TEMPLATE for a model whose template rewrites history).
        end_of_turn_token: the token that ends an assistant turn. Default: `<|im_end|>` if
            the vocabulary has it, else the tokenizer's EOS token.
        **template_kwargs: passed to every `apply_chat_template` call (e.g. enable_thinking).

    Raises:
        ChatTokenizationError: no end-of-turn token, or the template adds no generation prompt.
        TemplateNotPrefixStableError: the template rewrites a probe conversation's history.
    """

    def __init__(self, tokenizer: Any, *, chat_template: str | None = None,
                 end_of_turn_token: str | None = None, **template_kwargs: Any):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.template_kwargs = template_kwargs
        self.end_of_turn_token = end_of_turn_token or self._default_end_of_turn_token()
        self.end_of_turn_id = self._vocabulary_id(self.end_of_turn_token)
        self.control_tokens = self._special_token_strings()
        vocabulary = tokenizer.get_vocab()
        # Ids of the control tokens (end-of-turn included): never inside message text.
        self.control_ids = frozenset(vocabulary[token] for token in self.control_tokens
                                     if token in vocabulary)
        self.generation_prompt_ids = self._measure_generation_prompt()
        self.tokenize(_TEMPLATE_PROBE)

    # --- template access -----------------------------------------------------------
    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> list[int]:
        """Token ids of `messages` rendered by the chat template (no decoding involved)."""
        if not messages and not add_generation_prompt:
            return []  # some templates refuse an empty conversation; its rendering is empty
        options = dict(self.template_kwargs)
        if self.chat_template is not None:
            options["chat_template"] = self.chat_template
        rendered = self.tokenizer.apply_chat_template(
            [dict(message) for message in messages], tokenize=True,
            add_generation_prompt=add_generation_prompt, **options)
        return _unwrap_ids(rendered)

    def validate_messages(self, messages: Sequence[Message], first_index: int = 0) -> None:
        """Raise ChatTokenizationError for a message without string role/content or with a
        control token in its content (`first_index` numbers the messages in errors)."""
        for index, message in enumerate(messages, start=first_index):
            if not isinstance(message, Mapping):
                raise ChatTokenizationError(
                    f"message {index} must be a mapping with 'role' and 'content', got "
                    f"{type(message).__name__}")
            role, content = message.get("role"), message.get("content")
            if not isinstance(role, str) or not role:
                raise ChatTokenizationError(f"message {index}: 'role' must be a non-empty string")
            if not isinstance(content, str):
                raise ChatTokenizationError(
                    f"message {index} ({role}): 'content' must be a string, got "
                    f"{type(content).__name__}")
            problem = weight_problem(message)
            if problem:
                raise ChatTokenizationError(f"message {index} ({role}): {problem}")
            for token in self.control_tokens:
                if token in content:
                    raise ChatTokenizationError(
                        f"message {index} ({role}) contains the control token {token!r}; the "
                        "template would render it as conversation structure (e.g. end the "
                        "message early). Remove or escape control tokens in message text.")

    def defuse_control_tokens(self, text: str) -> str:
        """`text` with every control-token string broken by a zero-width space after its
        first character, so the template renders it as text. For generated turns only: a
        model with a small vocabulary can spell `<|im_start|>` from ordinary tokens, and its
        ids must still be kept (ConversationBuilder.add_generation)."""
        for token in self.control_tokens:
            if token in text:
                text = text.replace(token, token[0] + ZERO_WIDTH_SPACE + token[1:])
        return text

    # --- whole conversations -------------------------------------------------------
    def tokenize(self, messages: Sequence[Message], add_generation_prompt: bool = False
                 ) -> TokenizedConversation:
        """Token ids, loss mask, turn spans and boundaries of `messages` (see module doc).

        With add_generation_prompt the ids end with the next generation prompt (mask 0),
        which is not part of the last turn's history (boundaries stop before it).
        """
        self.validate_messages(messages)
        ids: list[int] = []
        mask: list[int] = []
        spans: list[tuple[int, int]] = []
        boundaries: list[int] = []
        question_end: int | None = None
        for index, message in enumerate(messages):
            if message["role"] == ASSISTANT_ROLE:
                if question_end is None:
                    question_end = len(ids)
                if spans:
                    boundaries.append(len(ids))
                prompted = self.render(messages[:index], add_generation_prompt=True)
                self._require_prefix(ids, prompted, messages, index)
                rendered = self.render(messages[: index + 1])
                self._require_prefix(prompted, rendered, messages, index, prompt_start=len(ids))
                start = len(prompted)
                end = self._end_of_turn(rendered, start, index) + 1
                spans.append((start, end))
                mask += [0] * (start - len(ids)) + [message_weight(message)] * (end - start) \
                    + [0] * (len(rendered) - end)
            else:
                rendered = self.render(messages[: index + 1])
                self._require_prefix(ids, rendered, messages, index)
                mask += [0] * (len(rendered) - len(ids))
            ids = rendered
        if spans:
            boundaries.append(len(ids))
        if question_end is None:
            question_end = len(ids)
        if add_generation_prompt:
            prompted = self.render(messages, add_generation_prompt=True)
            self._require_prefix(ids, prompted, messages, len(messages), prompt_start=len(ids))
            mask += [0] * (len(prompted) - len(ids))
            ids = prompted
        return TokenizedConversation(input_ids=ids, loss_mask=mask, turn_spans=spans,
                                     turn_boundaries=boundaries, question_end=question_end)

    # --- incremental pieces for rollouts -------------------------------------------
    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """Ids the engine continues from at the start of an episode: `messages` (system +
        user question) rendered with the generation prompt."""
        return self.tokenize(messages, add_generation_prompt=True).input_ids

    def reply_ids(self, history: Sequence[Message], reply: Message) -> tuple[list[int], list[int]]:
        """Template ids to append after an assistant turn's end-of-turn token.

        `history` ends with that assistant message. Returns (reply_ids, generation_prompt_ids):
        reply_ids = the template's closing after the end-of-turn (ChatML: "\\n") + `reply`
        rendered as the next message; the history h_<=t ends after them (the turn boundary).
        generation_prompt_ids = the next assistant header. Both are differences of renderings,
        checked prefix-stable, so they are exactly the template's ids.
        """
        if not history or history[-1]["role"] != ASSISTANT_ROLE:
            raise ChatTokenizationError("reply_ids needs a history that ends with an assistant "
                                        "message (the turn the reply answers)")
        self.validate_messages([*history, reply])
        before_turn = self.render(history[:-1])
        turn_prompt = self.render(history[:-1], add_generation_prompt=True)
        self._require_prefix(before_turn, turn_prompt, history, len(history) - 1)
        step = self._step_after_turn(turn_prompt, len(before_turn), [*history, reply])
        return step.reply_ids, step.generation_prompt_ids

    def _step_after_turn(self, turn_prompt: list[int], prompt_start: int,
                         conversation: Sequence[Message]) -> _ReplyStep:
        """Split the renderings after an assistant turn (conversation[-2]) answered by
        conversation[-1]. turn_prompt: the rendering up to that turn's generation prompt,
        which starts at prompt_start."""
        turn_index = len(conversation) - 2
        with_reply = self.render(conversation)
        self._require_prefix(turn_prompt, with_reply, conversation, turn_index, prompt_start)
        reply_start = self._end_of_turn(with_reply, len(turn_prompt), turn_index) + 1
        prompted = self.render(conversation, add_generation_prompt=True)
        self._require_prefix(with_reply, prompted, conversation, len(conversation),
                             prompt_start=len(with_reply))
        return _ReplyStep(reply_ids=with_reply[reply_start:],
                          generation_prompt_ids=prompted[len(with_reply):],
                          rendering=prompted, prompt_start=len(with_reply))

    def _closing_ids(self, turn_prompt: list[int], prompt_start: int,
                     conversation: Sequence[Message]) -> list[int]:
        """The template's ids after the end-of-turn token of the final assistant message."""
        rendered = self.render(conversation)
        turn_index = len(conversation) - 1
        self._require_prefix(turn_prompt, rendered, conversation, turn_index, prompt_start)
        return rendered[self._end_of_turn(rendered, len(turn_prompt), turn_index) + 1:]

    # --- checks --------------------------------------------------------------------
    def _end_of_turn(self, rendered: list[int], start: int, index: int) -> int:
        # Content cannot contain the end-of-turn token (validate_messages), so the first one
        # after the generation prompt is the template's.
        try:
            return rendered.index(self.end_of_turn_id, start)
        except ValueError:
            raise ChatTokenizationError(
                f"assistant message {index} renders without the end-of-turn token "
                f"{self.end_of_turn_token!r}; pass end_of_turn_token= the token the template "
                "closes assistant turns with") from None

    def _require_prefix(self, prefix: list[int], full: list[int], messages: Sequence[Message],
                        index: int, prompt_start: int | None = None) -> None:
        """Raise TemplateNotPrefixStableError unless `prefix` is a prefix of `full`.

        prompt_start: where a generation prompt starts inside `prefix`; a difference from
        there on means the prompt does not match the start of what follows it.
        """
        if full[: len(prefix)] == prefix:
            return
        at = _first_difference(prefix, full)
        role = messages[index]["role"] if index < len(messages) else "generation prompt"
        shown = self.tokenizer.convert_ids_to_tokens
        detail = (f"at token {at}: {shown(prefix[at:at + 3])} became {shown(full[at:at + 3])}")
        if prompt_start is not None and at >= prompt_start:
            hint = ("the generation prompt does not match the start of the assistant message "
                    "that follows it: a BPE merge across the join (content that starts with "
                    "whitespace, e.g. a newline, merging with the prompt's last token) or a "
                    "template whose generation prompt differs from its assistant header. "
                    "Strip leading whitespace from assistant content or fix the template.")
        else:
            hint = ("the template rewrites earlier messages when one is appended (e.g. "
                    "Qwen3's template strips <think> blocks from earlier assistant turns), so "
                    "rollout ids would differ from training ids. Use a template without history "
                    "rewriting, e.g. chat_template=CHATML_TEMPLATE.")
        raise TemplateNotPrefixStableError(
            f"chat template is not prefix-stable at message {index} ({role}), {detail}; {hint}")

    # --- construction helpers ------------------------------------------------------
    def _default_end_of_turn_token(self) -> str:
        if "<|im_end|>" in self.tokenizer.get_vocab():
            return "<|im_end|>"
        if self.tokenizer.eos_token is None:
            raise ChatTokenizationError("the tokenizer has neither <|im_end|> nor an EOS token; "
                                        "pass end_of_turn_token=")
        return str(self.tokenizer.eos_token)

    def _vocabulary_id(self, token: str) -> int:
        token_id = self.tokenizer.get_vocab().get(token)
        if token_id is None:
            raise ChatTokenizationError(f"end-of-turn token {token!r} is not in the vocabulary")
        return int(token_id)

    def _special_token_strings(self) -> tuple[str, ...]:
        # added_tokens_decoder also lists special tokens that all_special_tokens omits
        # (SmolLM2 has 17, of which 3 are "named").
        special = {str(t) for t in self.tokenizer.all_special_tokens}
        special |= {t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special}
        return tuple(sorted(special))

    def _measure_generation_prompt(self) -> list[int]:
        question = [{"role": "user", "content": "Hello"}]
        plain = self.render(question)
        prompted = self.render(question, add_generation_prompt=True)
        self._require_prefix(plain, prompted, question, 1, prompt_start=len(plain))
        if len(prompted) == len(plain):
            raise ChatTokenizationError("the chat template adds no generation prompt; it must "
                                        "support add_generation_prompt")
        return prompted[len(plain):]


def tokenize_conversation(messages: Sequence[Message], tokenizer: Any, *,
                          add_generation_prompt: bool = False, chat_template: str | None = None,
                          end_of_turn_token: str | None = None, **template_kwargs: Any
                          ) -> TokenizedConversation:
    """Render `messages` through the tokenizer's chat template with an exact loss mask.

    A convenience over `ChatTokenizer(tokenizer, ...).tokenize(messages)`; build one
    ChatTokenizer to tokenise many conversations.
    """
    chat = ChatTokenizer(tokenizer, chat_template=chat_template,
                         end_of_turn_token=end_of_turn_token, **template_kwargs)
    return chat.tokenize(messages, add_generation_prompt=add_generation_prompt)


class ConversationBuilder:
    """Assemble a rollout's ids token in, token out.

    Usage, one episode:

        builder = ConversationBuilder(chat, [system_message, question_message])
        while ...:
            ids = engine.generate(builder.prompt_ids())         # ends with <|im_end|> normally
            builder.add_generation(ids, text, logprobs)        # ids kept verbatim, mask 1
            builder.add_env_reply(observation)                 # template ids, mask 0
        tokenized = builder.finish()

    The engine's ids are never re-encoded. `text` (the decoded turn, without the end-of-turn
    token) only feeds the template to compute the next reply's ids; control-token strings
    the engine spelled from ordinary tokens are defused in it first
    (`ChatTokenizer.defuse_control_tokens`), so `messages` then differ from the text. If the
    engine stopped without the end-of-turn token (length limit), the builder closes the
    turn with it at mask 0: the template needs it, but the policy did not sample it. With such turns, or when the
    engine picks a non-canonical split of its text, the ids differ from
    `tokenize_conversation(builder.messages)`; otherwise they are equal.
    """

    def __init__(self, chat: ChatTokenizer, prompt_messages: Sequence[Message]):
        chat.validate_messages(prompt_messages)
        if any(message["role"] == ASSISTANT_ROLE for message in prompt_messages):
            raise ChatTokenizationError("prompt_messages start an episode and must not contain "
                                        "assistant messages")
        start = chat.tokenize(prompt_messages, add_generation_prompt=True)
        self.chat = chat
        self.messages: list[dict[str, Any]] = [dict(message) for message in prompt_messages]
        self.question_end = start.question_end
        self.input_ids: list[int] = start.input_ids[: start.question_end]
        self.loss_mask: list[int] = [0] * start.question_end
        self.turn_spans: list[tuple[int, int]] = []
        self.turn_boundaries: list[int] = []
        self._logprobs: list[float] | None = None
        # The template's own rendering of the messages so far + generation prompt, against
        # which the next reply is measured. It differs from input_ids once engine ids differ
        # from the canonical tokenisation of their text.
        self._turn_prompt: list[int] = start.input_ids
        self._turn_prompt_start = start.question_end
        self._pending_prompt: list[int] = start.input_ids[start.question_end:]
        self._awaiting_generation = True
        self._finished = False

    @property
    def rollout_logprobs(self) -> list[float] | None:
        """Engine log-probs aligned with input_ids (0.0 off policy tokens), if given."""
        return self._logprobs

    def prompt_ids(self) -> list[int]:
        """The ids to generate the next turn from: the conversation + generation prompt."""
        self._require_state(awaiting_generation=True, action="prompt_ids")
        return self.input_ids + self._pending_prompt

    def add_generation(self, token_ids: Sequence[int], text: str,
                       logprobs: Sequence[float] | None = None) -> tuple[int, int]:
        """Append one assistant turn as generated; returns its policy span [start, end).

        token_ids: the engine's ids, ending with the end-of-turn id unless cut by a limit.
        text: the turn as text without the end-of-turn token (what the environment parses).
        logprobs: the engine's log-prob of each id; give them for every turn or for none.
        """
        self._require_state(awaiting_generation=True, action="add_generation")
        generated = [int(token_id) for token_id in token_ids]
        eot = self.chat.end_of_turn_id
        if not generated:
            raise ChatTokenizationError("an assistant turn needs at least one generated token")
        if eot in generated[:-1]:
            raise ChatTokenizationError(
                f"generated ids contain the end-of-turn token {self.chat.end_of_turn_token!r} "
                f"before their end (at {generated.index(eot)}); stop generation at it")
        if logprobs is not None and len(logprobs) != len(generated):
            raise ChatTokenizationError(f"{len(logprobs)} log-probs for {len(generated)} ids")
        if self.turn_spans and (logprobs is None) != (self._logprobs is None):
            raise ChatTokenizationError("give log-probs for every turn or for none")
        # The ids are kept whatever they spell; only the text the template renders (to
        # measure the next reply) must not contain control-token strings.
        message = {"role": ASSISTANT_ROLE, "content": self.chat.defuse_control_tokens(text)}
        self.chat.validate_messages([message], first_index=len(self.messages))
        if logprobs is not None and self._logprobs is None:
            self._logprobs = [0.0] * len(self.input_ids)
        self._append(self._pending_prompt)
        start = len(self.input_ids)
        self._append(generated, policy=True, logprobs=logprobs)
        span = (start, len(self.input_ids))
        if generated[-1] != eot:
            self._append([eot])
        self.turn_spans.append(span)
        self.messages.append(message)
        self._pending_prompt = []
        self._awaiting_generation = False
        return span

    def add_env_reply(self, content: str, role: str = "user") -> list[int]:
        """Append the environment's reply (a user message in DR-Venus) as template ids and
        record the turn boundary after it; returns the appended ids (without the next
        generation prompt, which prompt_ids() adds)."""
        self._require_state(awaiting_generation=False, action="add_env_reply")
        reply = {"role": role, "content": content}
        self.chat.validate_messages([reply], first_index=len(self.messages))
        step = self.chat._step_after_turn(self._turn_prompt, self._turn_prompt_start,
                                          [*self.messages, reply])
        self._append(step.reply_ids)
        self.turn_boundaries.append(len(self.input_ids))
        self.messages.append(reply)
        self._turn_prompt, self._turn_prompt_start = step.rendering, step.prompt_start
        self._pending_prompt = step.generation_prompt_ids
        self._awaiting_generation = True
        return step.reply_ids

    def finish(self) -> TokenizedConversation:
        """Close the conversation: after a final assistant turn append the template's closing
        ids (mask 0) and record its boundary; after an environment reply (episode cut off)
        leave out the pending generation prompt."""
        if self._finished:
            raise ChatTokenizationError("finish() was already called")
        if not self.turn_spans:
            raise ChatTokenizationError("the conversation has no assistant turn")
        if not self._awaiting_generation:
            self._append(self.chat._closing_ids(self._turn_prompt, self._turn_prompt_start,
                                                self.messages))
            self.turn_boundaries.append(len(self.input_ids))
        self._finished = True
        return TokenizedConversation(
            input_ids=list(self.input_ids), loss_mask=list(self.loss_mask),
            turn_spans=list(self.turn_spans), turn_boundaries=list(self.turn_boundaries),
            question_end=self.question_end)

    def _append(self, ids: Sequence[int], policy: bool = False,
                logprobs: Sequence[float] | None = None) -> None:
        """Append ids with mask 1 if `policy` else 0; log-probs default to 0.0."""
        self.input_ids.extend(ids)
        self.loss_mask.extend([int(policy)] * len(ids))
        if self._logprobs is not None:
            self._logprobs.extend([0.0] * len(ids) if logprobs is None
                                  else [float(x) for x in logprobs])

    def _require_state(self, awaiting_generation: bool, action: str) -> None:
        if self._finished:
            raise ChatTokenizationError(f"{action}: the conversation is finished")
        if awaiting_generation != self._awaiting_generation:
            expected = "an environment reply" if awaiting_generation else "a generation"
            raise ChatTokenizationError(f"{action}: the conversation is waiting for {expected}")
