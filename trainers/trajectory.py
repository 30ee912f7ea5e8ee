"""The trajectory schema: one episode as text, as token ids, and with per-turn rewards.

A `Trajectory` always has its conversation as chat messages. Where known it also carries
the token-level view a trainer needs (design.md "Trajectories", "token in, token out"):

    input_ids          the exact ids the policy saw and generated (engine ids verbatim,
                       environment replies as chat-template ids), never re-encoded from text
    loss_mask          1 on policy tokens (assistant content + end-of-turn), 0 elsewhere
    rollout_logprobs   the engine's log-prob per id, 0.0 where the mask is 0
    turn_spans         per assistant turn, [start, end) of its policy tokens
    turn_boundaries    per turn, the end of history h_<=t (after the environment's reply):
                       where an information-gain probe is appended
    question_end       the end of the question-only history h_<1

and one `Turn` per assistant message with what the environment and the reward pipeline
said about it (kind, format validity, outcome / format / information-gain rewards).
`check_invariants` verifies that all of this fits together; `read_trajectories` and
`write_trajectories` store trajectories as JSONL, one per line (docs/trajectories.md).

Where we deviate from DR-Venus / the public code, and why
* Turns and reward positions are token spans recorded when the ids were built, not found
  later by searching decoded text for special tokens (design.md "Pitfalls").
* Turn kinds are the environment's four ("search", "visit", "answer", "invalid"; the same
  names as trainers.batch.TurnKind). The forced final-answer turn is not a fifth kind: it is
  an answer (or invalid) turn with `forced_final=True`, so algorithms that only know the
  four kinds treat it correctly.
* Per-turn rewards are kept as their components (outcome, format, information gain) rather
  than one number, so a later change of assignment (e.g. browse-aware IG) needs no re-rollout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainers.modeling.tokenization import (
    ASSISTANT_ROLE,
    ChatTokenizationError,
    ChatTokenizer,
    TokenizedConversation,
    turn_weights,
    weight_problem,
)
from venus_gym.corpus import read_records, write_jsonl

TURN_KINDS: tuple[str, ...] = ("search", "visit", "answer", "invalid")
# Log-probs are <= 0 mathematically; allow float rounding in engines that compute them
# as logit - logsumexp in low precision.
LOGPROB_TOLERANCE = 1e-5


class TrajectoryInvariantError(ValueError):
    """A trajectory breaks one of the schema's rules; names the trajectory and the rule."""

    def __init__(self, trajectory_id: str, rule: str, detail: str):
        self.trajectory_id = trajectory_id
        self.rule = rule
        self.detail = detail
        super().__init__(f"trajectory {trajectory_id!r} breaks rule '{rule}': {detail}")


@dataclass
class Turn:
    """One assistant turn and what came of it.

    kind:           "search", "visit", "answer" or "invalid" (malformed turn).
    valid:          format validity (False exactly when kind is "invalid").
    assistant:      the assistant's text (equal to its message's content).
    env_reply:      the environment's reply text (the next message), None after the last turn.
    reason:         the parser's reason when invalid ("" otherwise).
    forced_final:   True for the one final turn the environment forced at a budget limit.
    outcome_reward: outcome score given on the outcome turn (the last turn), None if unknown.
    format_reward:  the turn-level format penalty (nonzero only on invalid turns).
    ig_reward:      information gain of a valid non-final turn, None if not computed.
    """

    kind: str
    valid: bool
    assistant: str
    env_reply: str | None = None
    reason: str = ""
    forced_final: bool = False
    outcome_reward: float | None = None
    format_reward: float | None = None
    ig_reward: float | None = None

    @property
    def reward(self) -> float | None:
        """The sum of the known reward components; None when none is known."""
        known = [r for r in (self.outcome_reward, self.format_reward, self.ig_reward)
                 if r is not None]
        return sum(known) if known else None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Turn:
        if not isinstance(data, dict):
            raise ValueError(f"a turn must be a JSON object, got {type(data).__name__}")
        _reject_unknown_keys(data, {f.name for f in dataclasses.fields(cls)}, "turn")
        return cls(
            kind=_expect(data, "kind", str),
            valid=_expect(data, "valid", bool),
            assistant=_expect(data, "assistant", str),
            env_reply=_optional(data, "env_reply", str),
            reason=_optional(data, "reason", str) or "",
            forced_final=bool(_optional(data, "forced_final", bool)),
            outcome_reward=_optional_float(data, "outcome_reward"),
            format_reward=_optional_float(data, "format_reward"),
            ig_reward=_optional_float(data, "ig_reward"),
        )


@dataclass
class Trajectory:
    """One episode. Text fields are always present; token fields come together or not at all.

    id:               unique id of this trajectory (e.g. "<task_id>/<rollout index>").
    messages:         the chat, [{"role", "content"}, ...]: system, user question, then
                      assistant turns each followed by the environment's reply (a user
                      message), possibly ending with an assistant turn.
    task_id, question, answers: the task and its gold answers (all accepted answers).
    turns:            one Turn per assistant message, in order; empty if not annotated.
    outcome:          the trajectory's outcome score (judge 1/0 or F1), None if unscored.
    input_ids, loss_mask, rollout_logprobs, turn_spans, turn_boundaries, question_end:
                      the token-level view (module docstring); rollout_logprobs optional.
    metadata:         free-form JSON-serialisable extras (model, seed, timings, ...).
    """

    id: str
    messages: list[dict[str, Any]]
    task_id: str = ""
    question: str = ""
    answers: list[str] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    outcome: float | None = None
    input_ids: list[int] | None = None
    loss_mask: list[int] | None = None
    rollout_logprobs: list[float] | None = None
    turn_spans: list[tuple[int, int]] | None = None
    turn_boundaries: list[int] | None = None
    question_end: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Spans arrive as lists from JSON and as tuples from the tokenizer; one form keeps
        # equality (and round trips) exact.
        if self.turn_spans is not None:
            self.turn_spans = [(int(start), int(end)) for start, end in self.turn_spans]

    @property
    def has_tokens(self) -> bool:
        return self.input_ids is not None

    @property
    def turn_kinds(self) -> list[str]:
        return [turn.kind for turn in self.turns]

    @property
    def turn_rewards(self) -> list[float | None]:
        return [turn.reward for turn in self.turns]

    def with_tokens(self, tokenized: TokenizedConversation,
                    rollout_logprobs: Sequence[float] | None = None) -> Trajectory:
        """A copy carrying the token-level view of `tokenized` (e.g. ConversationBuilder.finish())."""
        return dataclasses.replace(
            self, input_ids=list(tokenized.input_ids), loss_mask=list(tokenized.loss_mask),
            rollout_logprobs=None if rollout_logprobs is None else list(rollout_logprobs),
            turn_spans=list(tokenized.turn_spans),
            turn_boundaries=list(tokenized.turn_boundaries),
            question_end=tokenized.question_end)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable copy (spans become [start, end] lists)."""
        data = dataclasses.asdict(self)
        if self.turn_spans is not None:
            data["turn_spans"] = [list(span) for span in self.turn_spans]
        return data

    @classmethod
    def from_json(cls, data: Any) -> Trajectory:
        """Parse one JSON object; raises ValueError naming the offending field."""
        if not isinstance(data, dict):
            raise ValueError(f"a trajectory must be a JSON object, got {type(data).__name__}")
        _reject_unknown_keys(data, {f.name for f in dataclasses.fields(cls)}, "trajectory")
        messages = _expect(data, "messages", list)
        for index, message in enumerate(messages):
            if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)):
                raise ValueError(f"messages[{index}] must be an object with string 'role' and "
                                 "'content'")
        spans = _optional(data, "turn_spans", list)
        if spans is not None and not all(
                isinstance(span, list) and len(span) == 2 and all(_is_int(x) for x in span)
                for span in spans):
            raise ValueError("'turn_spans' must be a list of [start, end] integer pairs")
        turns = _optional(data, "turns", list) or []
        parsed_turns = []
        for index, turn in enumerate(turns):
            try:
                parsed_turns.append(Turn.from_json(turn))
            except ValueError as e:
                raise ValueError(f"turns[{index}]: {e}") from None
        metadata = _optional(data, "metadata", dict)
        return cls(
            id=_expect(data, "id", str),
            messages=messages,
            task_id=_optional(data, "task_id", str) or "",
            question=_optional(data, "question", str) or "",
            answers=_string_list(data, "answers") or [],
            turns=parsed_turns,
            outcome=_optional_float(data, "outcome"),
            input_ids=_int_list(data, "input_ids"),
            loss_mask=_int_list(data, "loss_mask"),
            rollout_logprobs=_float_list(data, "rollout_logprobs"),
            turn_spans=spans,
            turn_boundaries=_int_list(data, "turn_boundaries"),
            question_end=_optional(data, "question_end", int),
            metadata=metadata if metadata is not None else {},
        )


# --- JSON field helpers ----------------------------------------------------------------
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _reject_unknown_keys(data: dict[str, Any], known: set[str], what: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {what} field(s) {unknown}; put extra data under 'metadata'")


def _expect(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    if value is None:
        raise ValueError(f"missing field {key!r}")
    return _check_type(value, key, kind)


def _optional(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    return None if value is None else _check_type(value, key, kind)


def _check_type(value: Any, key: str, kind: type) -> Any:
    ok = _is_int(value) if kind is int else isinstance(value, kind)
    if not ok:
        raise ValueError(f"field {key!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def _optional_float(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if not _is_number(value):
        raise ValueError(f"field {key!r} must be a number, got {type(value).__name__}")
    return float(value)


def _int_list(data: dict[str, Any], key: str) -> list[int] | None:
    values = _optional(data, key, list)
    if values is not None and not all(_is_int(v) for v in values):
        raise ValueError(f"field {key!r} must be a list of integers")
    return values


def _float_list(data: dict[str, Any], key: str) -> list[float] | None:
    values = _optional(data, key, list)
    if values is not None and not all(_is_number(v) for v in values):
        raise ValueError(f"field {key!r} must be a list of numbers")
    return None if values is None else [float(v) for v in values]


def _string_list(data: dict[str, Any], key: str) -> list[str] | None:
    values = _optional(data, key, list)
    if values is not None and not all(isinstance(v, str) for v in values):
        raise ValueError(f"field {key!r} must be a list of strings")
    return values


# --- JSONL ---------------------------------------------------------------------------
def write_trajectories(path: str | Path, trajectories: Iterable[Trajectory]) -> int:
    """Write one trajectory per line; returns how many were written."""
    return write_jsonl(path, (trajectory.to_json() for trajectory in trajectories))


def read_trajectories(path: str | Path, skip_bad: bool = False, errors: list[str] | None = None,
                      check: bool = True) -> list[Trajectory]:
    """Read a JSONL file of trajectories.

    A line that is not valid JSON, does not match the schema, or (with `check`) breaks an
    invariant raises DataFormatError naming file:line. With skip_bad the line is skipped and
    the message appended to `errors` instead.
    """
    def parse(data: dict[str, Any]) -> Trajectory:
        trajectory = Trajectory.from_json(data)
        if check:
            check_invariants(trajectory)
        return trajectory

    return read_records(path, parse, skip_bad=skip_bad, errors=errors)


# --- invariants ------------------------------------------------------------------------
def assistant_indices(messages: Sequence[dict[str, Any]]) -> list[int]:
    """Indices of the assistant messages (one per turn)."""
    return [i for i, message in enumerate(messages) if message.get("role") == ASSISTANT_ROLE]


def token_rewards(trajectory: Trajectory) -> list[float]:
    """Per-token rewards: each turn's reward on the last policy token of its span, 0 elsewhere.

    The last policy token is the one whose sampling ends the turn (normally the end-of-turn
    token), the usual place for a sparse reward in token-level RL. Turns whose reward is not
    known contribute 0.
    """
    if trajectory.input_ids is None or trajectory.turn_spans is None:
        raise ValueError(f"trajectory {trajectory.id!r} has no token-level view")
    if len(trajectory.turns) != len(trajectory.turn_spans):
        raise ValueError(f"trajectory {trajectory.id!r}: {len(trajectory.turns)} turns for "
                         f"{len(trajectory.turn_spans)} turn spans")
    rewards = [0.0] * len(trajectory.input_ids)
    for turn, (_, end) in zip(trajectory.turns, trajectory.turn_spans):
        if turn.reward is not None:
            rewards[end - 1] += turn.reward
    return rewards


def check_invariants(trajectory: Trajectory, tokenizer: Any = None) -> None:
    """Raise TrajectoryInvariantError for the first broken rule (docs/trajectories.md).

    tokenizer: a Hugging Face tokenizer or a ChatTokenizer. With it, the ids must be the
    chat template's rendering of the messages, except that a turn's policy ids may be a
    different split of the same text (engines sample non-canonical splits) and a turn cut
    by a length limit is closed by a mask-0 end-of-turn token.
    """
    _Checker(trajectory).run(tokenizer)


class _Checker:
    def __init__(self, trajectory: Trajectory):
        self.t = trajectory
        self.assistant_at = assistant_indices(trajectory.messages)

    def fail(self, rule: str, detail: str) -> None:
        raise TrajectoryInvariantError(self.t.id, rule, detail)

    def run(self, tokenizer: Any) -> None:
        self.check_messages()
        self.check_turns()
        self.check_rewards()
        token_fields = (self.t.input_ids, self.t.loss_mask, self.t.rollout_logprobs,
                        self.t.turn_spans, self.t.turn_boundaries, self.t.question_end)
        if any(value is not None for value in token_fields):
            self.check_token_fields()
            self.check_mask()
            self.check_spans_and_boundaries()
            self.check_logprobs()
            self.check_token_rewards()
            if tokenizer is not None:
                self.check_template(tokenizer)

    def check_messages(self) -> None:
        for index, message in enumerate(self.t.messages):
            if not (isinstance(message.get("role"), str) and isinstance(message.get("content"), str)):
                self.fail("messages", f"message {index} needs string 'role' and 'content'")
            problem = weight_problem(message)
            if problem:
                self.fail("messages", f"message {index}: {problem}")

    def check_turns(self) -> None:
        turns = self.t.turns
        if not turns:
            return
        if len(turns) != len(self.assistant_at):
            self.fail("turns", f"{len(turns)} turns for {len(self.assistant_at)} assistant messages")
        for k, (turn, at) in enumerate(zip(turns, self.assistant_at)):
            if turn.kind not in TURN_KINDS:
                self.fail("turns", f"turn {k} has unknown kind {turn.kind!r}; expected one of "
                                   f"{list(TURN_KINDS)}")
            if (turn.kind == "invalid") == turn.valid:
                self.fail("turns", f"turn {k} has kind {turn.kind!r} but valid={turn.valid}; a "
                                   "turn is invalid exactly when its format is")
            if turn.kind == "answer" and k != len(turns) - 1:
                self.fail("turns", f"turn {k} is an answer but not the last turn; an answer ends "
                                   "the episode")
            if turn.assistant != self.t.messages[at]["content"]:
                self.fail("turns", f"turn {k}'s assistant text differs from message {at}")
            following = self.t.messages[at + 1] if at + 1 < len(self.t.messages) else None
            expected_reply = (None if following is None or following["role"] == ASSISTANT_ROLE
                              else following["content"])
            if turn.env_reply != expected_reply:
                self.fail("turns", f"turn {k}'s env_reply differs from the message after it")

    def check_rewards(self) -> None:
        last = len(self.t.turns) - 1
        for k, turn in enumerate(self.t.turns):
            for name in ("outcome_reward", "format_reward", "ig_reward"):
                value = getattr(turn, name)
                if value is not None and not math.isfinite(value):
                    self.fail("rewards", f"turn {k} has a non-finite {name} ({value})")
            if turn.outcome_reward is not None and k != last:
                self.fail("rewards", f"turn {k} ({turn.kind}) carries an outcome reward; only the "
                                     f"last turn ({last}) is the outcome turn")
            if turn.format_reward and turn.valid:
                self.fail("rewards", f"turn {k} ({turn.kind}) is well formed but carries a format "
                                     f"penalty ({turn.format_reward})")
            if turn.ig_reward is not None and (not turn.valid or k == last):
                where = "a malformed turn" if not turn.valid else "the outcome (last) turn"
                self.fail("rewards", f"turn {k} ({turn.kind}) carries an information-gain "
                                     f"reward but is {where}")

    def check_token_fields(self) -> None:
        t = self.t
        present = {"input_ids": t.input_ids, "loss_mask": t.loss_mask, "turn_spans": t.turn_spans,
                   "turn_boundaries": t.turn_boundaries, "question_end": t.question_end}
        missing = [name for name, value in present.items() if value is None]
        if missing:
            self.fail("token_fields", f"token-level fields come together; missing {missing}")

    def check_mask(self) -> None:
        ids, mask = self.t.input_ids, self.t.loss_mask
        assert ids is not None and mask is not None  # check_token_fields ran
        if len(mask) != len(ids):
            self.fail("lengths", f"loss_mask has {len(mask)} entries for {len(ids)} input_ids")
        bad = next((i for i, m in enumerate(mask) if m not in (0, 1)), None)
        if bad is not None:
            self.fail("mask_values", f"loss_mask[{bad}] = {mask[bad]!r}; must be 0 or 1")

    def check_logprobs(self) -> None:
        ids, mask, logprobs = self.t.input_ids, self.t.loss_mask, self.t.rollout_logprobs
        assert ids is not None and mask is not None
        if logprobs is None:
            return
        if len(logprobs) != len(ids):
            self.fail("logprobs", f"rollout_logprobs has {len(logprobs)} entries for {len(ids)} "
                                  "input_ids")
        for i, (logprob, m) in enumerate(zip(logprobs, mask)):
            if not math.isfinite(logprob):
                self.fail("logprobs", f"rollout_logprobs[{i}] = {logprob} is not finite")
            if m == 0 and logprob != 0.0:
                self.fail("logprobs", f"rollout_logprobs[{i}] = {logprob} on a mask-0 token; it "
                                      "must be 0.0")
            if m == 1 and logprob > LOGPROB_TOLERANCE:
                self.fail("logprobs", f"rollout_logprobs[{i}] = {logprob} is positive")

    def check_spans_and_boundaries(self) -> None:
        t = self.t
        ids, mask, spans = t.input_ids, t.loss_mask, t.turn_spans
        boundaries, question_end = t.turn_boundaries, t.question_end
        assert ids is not None and mask is not None and spans is not None
        assert boundaries is not None and question_end is not None
        n_turns = len(self.assistant_at)
        if len(spans) != n_turns:
            self.fail("spans", f"{len(spans)} turn spans for {n_turns} assistant messages")
        if len(boundaries) != n_turns:
            self.fail("boundaries", f"{len(boundaries)} turn boundaries for {n_turns} assistant "
                                    "messages")
        previous_end = 0
        weights = turn_weights(t.messages)
        for k, (start, end) in enumerate(spans):
            if not previous_end <= start < end <= len(ids):
                self.fail("spans", f"turn {k}'s span [{start}, {end}) must be non-empty, within "
                                   f"the {len(ids)} ids and start at or after the previous "
                                   f"span's end ({previous_end})")
            if weights[k] == 1:
                zero = next((i for i in range(start, end) if mask[i] != 1), None)
                if zero is not None:
                    self.fail("mask_spans", f"token {zero} inside turn {k}'s span [{start}, "
                                            f"{end}) has mask 0; every policy token must have "
                                            "mask 1")
            elif any(mask[start:end]):
                self.fail("mask_spans", f"turn {k} (message weight 0) has mask 1 inside its span "
                                        f"[{start}, {end}); an untrained turn must be all 0")
            previous_end = end
        in_span = [False] * len(ids)
        for start, end in spans:
            in_span[start:end] = [True] * (end - start)
        stray = next((i for i, m in enumerate(mask) if m == 1 and not in_span[i]), None)
        if stray is not None:
            self.fail("mask_spans", f"token {stray} has mask 1 outside every turn span (a "
                                    "prompt, tool or template token would be trained on)")
        if spans and not 0 <= question_end <= spans[0][0]:
            self.fail("boundaries", f"question_end {question_end} must lie before turn 0's "
                                    f"span, which starts at {spans[0][0]}")
        for k, ((_, end), boundary) in enumerate(zip(spans, boundaries)):
            next_start = spans[k + 1][0] if k + 1 < len(spans) else len(ids)
            if not end <= boundary <= next_start:
                self.fail("boundaries", f"turn {k}'s boundary {boundary} must lie between the end "
                                        f"of its span ({end}) and the next turn's start "
                                        f"({next_start})")

    def check_token_rewards(self) -> None:
        if not self.t.turns:
            return
        rewards = token_rewards(self.t)
        spans = self.t.turn_spans
        assert spans is not None and self.t.loss_mask is not None
        owner = {}
        for k, (start, end) in enumerate(spans):
            owner.update(dict.fromkeys(range(start, end), k))
        for position, value in enumerate(rewards):
            if value == 0.0:
                continue
            if self.t.loss_mask[position] != 1 or position not in owner:
                self.fail("token_rewards", f"a reward lands on token {position}, which is not a "
                                           "policy token")
        for k, (turn, (start, end)) in enumerate(zip(self.t.turns, spans)):
            landed = sum(rewards[start:end])
            if not math.isclose(landed, turn.reward or 0.0, rel_tol=1e-9, abs_tol=1e-12):
                self.fail("token_rewards", f"turn {k}'s reward {turn.reward} lands as {landed} "
                                           f"on its policy tokens [{start}, {end})")

    def check_template(self, tokenizer: Any) -> None:
        t = self.t
        ids, spans, boundaries = t.input_ids, t.turn_spans, t.turn_boundaries
        assert ids is not None and spans is not None and boundaries is not None
        chat = tokenizer if isinstance(tokenizer, ChatTokenizer) else ChatTokenizer(tokenizer)
        try:
            canonical = chat.tokenize(t.messages)
        except ChatTokenizationError as e:
            self.fail("template", f"the messages cannot be rendered with exact masks: {e}")
        if t.question_end != canonical.question_end:
            self.fail("template", f"question_end {t.question_end} differs from the template's "
                                  f"{canonical.question_end}")
        eot = chat.end_of_turn_id
        own_end = 0  # end of the previous turn (its end-of-turn token included)
        canonical_end = 0
        for k, ((start, end), (c_start, c_end)) in enumerate(zip(spans, canonical.turn_spans)):
            if ids[own_end:start] != canonical.input_ids[canonical_end:c_start]:
                self.fail("template", f"the template tokens before turn {k} ([{own_end}, {start}))"
                                      " differ from the chat template's rendering")
            closed_end = end
            if ids[end - 1] != eot:
                # A turn cut by a length limit: the builder closes it with a mask-0 end-of-turn.
                if end >= len(ids) or ids[end] != eot:
                    self.fail("template", f"turn {k} neither ends with the end-of-turn token nor "
                                          "is closed by one")
                closed_end = end + 1
            policy, expected = ids[start:closed_end], canonical.input_ids[c_start:c_end]
            if chat.control_ids & set(policy[:-1]):
                self.fail("template", f"turn {k}'s policy tokens contain a control token id "
                                      "before its end")
            # Same text in another split, or a control-token string spelled from ordinary
            # ids, which the message records defused (ConversationBuilder.add_generation).
            if policy != expected and chat.defuse_control_tokens(
                    self._decode(chat, policy[:-1])) != self._decode(chat, expected[:-1]):
                self.fail("template", f"turn {k}'s policy tokens do not spell its message text")
            if boundaries[k] - closed_end != canonical.turn_boundaries[k] - c_end:
                self.fail("template", f"turn {k}'s boundary {boundaries[k]} is not where the "
                                      "template's environment reply ends")
            own_end, canonical_end = closed_end, c_end
        if ids[own_end:] != canonical.input_ids[canonical_end:]:
            self.fail("template", f"the tokens after the last turn ([{own_end}, {len(ids)})) "
                                  "differ from the chat template's rendering")

    @staticmethod
    def _decode(chat: ChatTokenizer, ids: list[int]) -> str:
        # Only an oracle for "same text, different split"; never used to build ids or masks.
        return chat.tokenizer.decode(ids, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
