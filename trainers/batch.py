"""The tensor "data currency" every RL algorithm in venus-gym consumes: `RolloutBatch`.

A rollout batch holds B trajectories right-padded to a common length L. Everything an
algorithm needs is here as tensors, so advantages and losses are pure functions of it:

    tokens      input_ids, attention_mask, loss_mask (1 = policy token), turn_index
    turns       turn_end, question_end, turn_kind, turn_format_ok      (T = max turns)
    grouping    group_ids (the G rollouts of one query share an id), outcome
    log-probs   old_logprobs, ref_logprobs, engine_logprobs             (optional)
    rewards     boundary_scores (probe scores from trainers.algorithms.information_gain, optional)
    advantages  advantages (filled in by an algorithm before the loss, optional)

Conventions (the ones peers got wrong, design.md "Pitfalls", are checked loudly):
- Log-probs are aligned with the token they score: `x_logprobs[b, i] = log pi(input_ids[b, i]
  | input_ids[b, :i])`. Values off the loss mask are ignored (conventionally 0).
- A turn is one assistant generation. Its policy tokens are the ids the engine generated
  (never the chat-template header, never the tool reply). Turn t's tokens lie in
  `[turn_end[t-1], turn_end[t])` (`question_end` stands in for turn_end[-1]).
- `turn_end[t]` is where the history h_<=t ends: right after turn t's tool reply (its
  end-of-message tokens included), i.e. where the next turn's generation prompt would start.
  For the last turn it is the end of that turn's own tokens. Information-gain probes are
  appended at these positions (trainers.algorithms.probes).
- The last turn of a trajectory is its outcome turn: it receives the outcome reward (or the
  format penalty if it is malformed) whether it is an answer or was cut off by a limit.

`TrajectoryRecord` + `collate` are the one conversion a later trajectory schema needs:
fill one record per trajectory from its per-turn token ids, masks, boundaries and kinds.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


class TurnKind(enum.IntEnum):
    """What one assistant turn did. The codes are what `RolloutBatch.turn_kind` stores."""

    SEARCH = 0
    VISIT = 1
    ANSWER = 2
    INVALID = 3

    @classmethod
    def parse(cls, kind: str | int | TurnKind) -> TurnKind:
        """Accept the environment's strings ("search", "visit", "answer", "invalid") or codes."""
        if isinstance(kind, str):
            try:
                return cls[kind.upper()]
            except KeyError:
                raise ValueError(
                    f"unknown turn kind {kind!r}; expected one of "
                    f"{[k.name.lower() for k in cls]}"
                ) from None
        return cls(int(kind))


PAD_TURN = -1  # turn_kind / turn_end / turn_index value for "no turn here"


class BatchValidationError(ValueError):
    """A RolloutBatch violates an invariant; the message names the field, row and fix."""


@dataclass(frozen=True)
class RolloutBatch:
    """B trajectories, right-padded to length L, with up to T turns each.

    Fields (shape, dtype):
      input_ids        [B, L] int64  token ids; padding positions hold any id.
      attention_mask   [B, L] bool   True on real tokens; must be a prefix (right padding).
      loss_mask        [B, L] bool   True on policy tokens (what the engine generated).
      turn_index       [B, L] int64  turn of each policy token (0-based), -1 elsewhere.
      turn_end         [B, T] int64  end of history h_<=t (exclusive token index), -1 padding.
      question_end     [B]    int64  end of the question-only history h_<1 (the IG baseline).
      turn_kind        [B, T] int64  TurnKind code per turn, -1 padding.
      turn_format_ok   [B, T] bool   format validity per turn (False on padding).
      group_ids        [B]    int64  rollouts of the same query share a group id (>= 0).
      outcome          [B]    float32 outcome score of the trajectory (judge 1/0 or F1).
      old_logprobs     [B, L] float32 behaviour policy log-probs, recomputed by the trainer.
      ref_logprobs     [B, L] float32 frozen reference policy log-probs (for the KL term).
      engine_logprobs  [B, L] float32 the rollout engine's own log-probs (for TIS).
      boundary_scores  [B, T+1] float32 probe score s at slot 0 = question_end and slot
                       t+1 = turn_end[t]; NaN where no probe was run.
      advantages       [B, L] float32 per-token advantages (0 off the loss mask).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    turn_index: torch.Tensor
    turn_end: torch.Tensor
    question_end: torch.Tensor
    turn_kind: torch.Tensor
    turn_format_ok: torch.Tensor
    group_ids: torch.Tensor
    outcome: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    engine_logprobs: torch.Tensor | None = None
    boundary_scores: torch.Tensor | None = None
    advantages: torch.Tensor | None = None

    def __post_init__(self) -> None:
        validate_batch(self)

    # --- derived views -------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_turns(self) -> torch.Tensor:
        """[B] int64: number of real turns per trajectory."""
        return (self.turn_kind != PAD_TURN).sum(dim=1)

    @property
    def lengths(self) -> torch.Tensor:
        """[B] int64: number of real tokens per trajectory."""
        return self.attention_mask.sum(dim=1)

    @property
    def turn_valid(self) -> torch.Tensor:
        """[B, T] bool: True on real (non-padding) turns."""
        return self.turn_kind != PAD_TURN

    @property
    def is_last_turn(self) -> torch.Tensor:
        """[B, T] bool: True on each trajectory's last (outcome) turn."""
        turn_ids = torch.arange(self.turn_kind.shape[1], device=self.turn_kind.device)
        return turn_ids[None, :] == (self.num_turns - 1)[:, None]

    def replace(self, **changes: torch.Tensor | None) -> RolloutBatch:
        """A copy with some fields replaced (validated again)."""
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The batch with every tensor on `device`."""
        return dataclasses.replace(self, **{
            item.name: getattr(self, item.name).to(device)
            for item in dataclasses.fields(self) if getattr(self, item.name) is not None})

    def select(self, rows: Sequence[int]) -> RolloutBatch:
        """The sub-batch of `rows` (in that order), trimmed to its own longest row and most
        turns (so a micro-batch of short trajectories does not pay for a long one)."""
        index = torch.as_tensor(list(rows), dtype=torch.long)
        if index.numel() == 0:
            raise ValueError("select needs at least one row")
        length = int(self.lengths[index].max())
        turns = max(int(self.num_turns[index].max()), 1)
        width = {"turn_end": turns, "turn_kind": turns, "turn_format_ok": turns,
                 "boundary_scores": turns + 1}
        changes: dict[str, torch.Tensor | None] = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if value is not None:
                value = value[index]
                if value.ndim == 2:
                    value = value[:, :width.get(item.name, length)]
            changes[item.name] = value
        return RolloutBatch(**changes)


_LOGPROB_FIELDS = ("old_logprobs", "ref_logprobs", "engine_logprobs", "advantages")


def _fail(message: str) -> None:
    raise BatchValidationError(message)


def validate_batch(batch: RolloutBatch) -> None:
    """Check every RolloutBatch invariant; raise BatchValidationError naming the problem."""
    ids = batch.input_ids
    if ids.ndim != 2 or ids.dtype != torch.long:
        _fail(f"input_ids must be int64 [B, L], got {ids.dtype} {list(ids.shape)}")
    B, L = ids.shape
    T = batch.turn_kind.shape[1] if batch.turn_kind.ndim == 2 else -1
    expected = {
        "attention_mask": ((B, L), torch.bool),
        "loss_mask": ((B, L), torch.bool),
        "turn_index": ((B, L), torch.long),
        "turn_end": ((B, T), torch.long),
        "question_end": ((B,), torch.long),
        "turn_kind": ((B, T), torch.long),
        "turn_format_ok": ((B, T), torch.bool),
        "group_ids": ((B,), torch.long),
        "outcome": ((B,), None),
    }
    for name in _LOGPROB_FIELDS:
        expected[name] = ((B, L), None)
    expected["boundary_scores"] = ((B, T + 1), None)
    for name, (shape, dtype) in expected.items():
        value = getattr(batch, name)
        if value is None:
            continue
        if tuple(value.shape) != shape:
            _fail(f"{name} must have shape {list(shape)} (B={B}, L={L}, T={T}), got {list(value.shape)}")
        if dtype is not None and value.dtype != dtype:
            _fail(f"{name} must be {dtype}, got {value.dtype}; convert with .to({dtype})")
        if dtype is None and not value.is_floating_point():
            _fail(f"{name} must be a floating-point tensor, got {value.dtype}")
    if T < 1:
        _fail("turn_kind needs at least one turn column [B, T>=1]")

    lengths = batch.attention_mask.sum(1)
    positions = torch.arange(L, device=ids.device)
    if not torch.equal(batch.attention_mask, positions[None, :] < lengths[:, None]):
        _fail("attention_mask must be right-padded (True on a prefix of each row); left padding "
              "is not supported")
    if (batch.loss_mask & ~batch.attention_mask).any():
        _fail("loss_mask is True on a padding position; policy tokens must be real tokens")
    has_turn = batch.turn_index >= 0
    if not torch.equal(has_turn, batch.loss_mask):
        row = int((has_turn != batch.loss_mask).any(1).nonzero()[0])
        _fail(f"row {row}: turn_index must be >= 0 exactly on policy tokens (loss_mask) and -1 "
              "elsewhere; a tool or prompt token with a turn id would receive an advantage")
    if (batch.group_ids < 0).any():
        _fail("group_ids must be >= 0")

    valid_turn = batch.turn_kind != PAD_TURN
    num_turns = valid_turn.sum(1)
    turn_ids = torch.arange(T, device=ids.device)
    if not torch.equal(valid_turn, turn_ids[None, :] < num_turns[:, None]):
        _fail("turns must be left-aligned: turn_kind is -1 only after a trajectory's last turn")
    if (num_turns < 1).any():
        _fail(f"rows {(num_turns < 1).nonzero().flatten().tolist()} have no turn; every "
              "trajectory needs at least one assistant turn")
    known = (batch.turn_kind >= 0) & (batch.turn_kind <= max(TurnKind))
    if (valid_turn & ~known).any():
        _fail(f"turn_kind holds an unknown code; use TurnKind values {[int(k) for k in TurnKind]}")
    if (valid_turn & (batch.turn_kind == TurnKind.INVALID) & batch.turn_format_ok).any():
        _fail("a turn of kind INVALID is marked format-valid (turn_format_ok=True)")
    answer_early = valid_turn & (batch.turn_kind == TurnKind.ANSWER)
    answer_early &= turn_ids[None, :] < (num_turns - 1)[:, None]
    if answer_early.any():
        row = int(answer_early.any(1).nonzero()[0])
        _fail(f"row {row}: an ANSWER turn before the last turn; an answer ends the episode")
    if (batch.turn_end[~valid_turn] != PAD_TURN).any():
        _fail("turn_end must be -1 on padding turns")

    ends = torch.where(valid_turn, batch.turn_end, torch.full_like(batch.turn_end, L + 1))
    starts = torch.cat([batch.question_end[:, None], batch.turn_end[:, :-1]], dim=1)
    if (batch.question_end < 0).any() or (batch.question_end > lengths).any():
        _fail("question_end must lie within each trajectory's real tokens")
    if (valid_turn & ((ends <= starts) | (ends > lengths[:, None]))).any():
        _fail("turn_end must increase strictly, start after question_end and stay within the "
              "real tokens of the row")

    # Every policy token sits inside its own turn's span, and every turn owns >= 1 token.
    rows, cols = batch.loss_mask.nonzero(as_tuple=True)
    turns = batch.turn_index[rows, cols]
    if (turns >= num_turns[rows]).any():
        _fail("turn_index refers to a turn beyond the trajectory's turn_kind entries")
    inside = (cols >= starts[rows, turns]) & (cols < ends[rows, turns])
    if not inside.all():
        bad = int((~inside).nonzero()[0])
        _fail(f"row {int(rows[bad])}: policy token at position {int(cols[bad])} of turn "
              f"{int(turns[bad])} lies outside that turn's span [previous turn_end, turn_end)")
    tokens_per_turn = torch.zeros(B, T, dtype=torch.long, device=ids.device)
    tokens_per_turn.index_put_((rows, turns), torch.ones_like(turns), accumulate=True)
    if (valid_turn & (tokens_per_turn == 0)).any():
        row = int((valid_turn & (tokens_per_turn == 0)).any(1).nonzero()[0])
        _fail(f"row {row}: a turn without policy tokens; every assistant turn has at least "
              "its end-of-turn token")


@dataclass
class TrajectoryRecord:
    """One trajectory as flat Python lists: what a trajectory schema converts into.

    input_ids:       all token ids of the conversation, in order.
    loss_mask:       1 on the tokens the policy generated, 0 elsewhere (same length).
    turn_index:      turn of each policy token (0-based), -1 elsewhere (same length).
    turn_ends:       per turn, end of history h_<=t (after the turn's tool reply).
    question_end:    end of the question-only history (system + user question).
    turn_kinds:      per turn, "search" / "visit" / "answer" / "invalid" or a TurnKind.
    turn_format_ok:  per turn, whether its format is valid.
    group_id:        id shared by the rollouts of the same query.
    outcome:         outcome score of the final answer.
    engine_logprobs: optional per-token log-probs from the engine (0 off policy tokens).
    """

    input_ids: Sequence[int]
    loss_mask: Sequence[int]
    turn_index: Sequence[int]
    turn_ends: Sequence[int]
    question_end: int
    turn_kinds: Sequence[str | int | TurnKind]
    turn_format_ok: Sequence[bool]
    group_id: int
    outcome: float
    engine_logprobs: Sequence[float] | None = field(default=None)


def collate(records: Sequence[TrajectoryRecord], pad_token_id: int = 0) -> RolloutBatch:
    """Right-pad records into a validated RolloutBatch."""
    if not records:
        raise BatchValidationError("collate needs at least one TrajectoryRecord")
    for i, rec in enumerate(records):
        n = len(rec.input_ids)
        if len(rec.loss_mask) != n or len(rec.turn_index) != n:
            raise BatchValidationError(
                f"record {i}: input_ids ({n}), loss_mask ({len(rec.loss_mask)}) and turn_index "
                f"({len(rec.turn_index)}) must have the same length")
        if not (len(rec.turn_ends) == len(rec.turn_kinds) == len(rec.turn_format_ok)):
            raise BatchValidationError(f"record {i}: turn_ends, turn_kinds and turn_format_ok "
                                       "need one entry per turn")
    with_engine = [rec.engine_logprobs is not None for rec in records]
    if any(with_engine) and not all(with_engine):
        raise BatchValidationError("engine_logprobs must be given for all records or none")
    B = len(records)
    L = max(len(rec.input_ids) for rec in records)
    T = max(max(len(rec.turn_kinds) for rec in records), 1)
    input_ids = torch.full((B, L), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.bool)
    loss_mask = torch.zeros(B, L, dtype=torch.bool)
    turn_index = torch.full((B, L), PAD_TURN, dtype=torch.long)
    engine = torch.zeros(B, L) if all(with_engine) else None
    turn_end = torch.full((B, T), PAD_TURN, dtype=torch.long)
    turn_kind = torch.full((B, T), PAD_TURN, dtype=torch.long)
    turn_format_ok = torch.zeros(B, T, dtype=torch.bool)
    for i, rec in enumerate(records):
        n, t = len(rec.input_ids), len(rec.turn_kinds)
        input_ids[i, :n] = torch.as_tensor(list(rec.input_ids), dtype=torch.long)
        attention_mask[i, :n] = True
        loss_mask[i, :n] = torch.as_tensor(list(rec.loss_mask), dtype=torch.bool)
        turn_index[i, :n] = torch.as_tensor(list(rec.turn_index), dtype=torch.long)
        if engine is not None:
            engine[i, :n] = torch.as_tensor(list(rec.engine_logprobs), dtype=torch.float32)
        turn_end[i, :t] = torch.as_tensor(list(rec.turn_ends), dtype=torch.long)
        turn_kind[i, :t] = torch.as_tensor([int(TurnKind.parse(k)) for k in rec.turn_kinds])
        turn_format_ok[i, :t] = torch.as_tensor(list(rec.turn_format_ok), dtype=torch.bool)
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        turn_index=turn_index,
        turn_end=turn_end,
        question_end=torch.as_tensor([rec.question_end for rec in records], dtype=torch.long),
        turn_kind=turn_kind,
        turn_format_ok=turn_format_ok,
        group_ids=torch.as_tensor([rec.group_id for rec in records], dtype=torch.long),
        outcome=torch.as_tensor([float(rec.outcome) for rec in records], dtype=torch.float32),
        engine_logprobs=engine,
    )


def record_from_trajectory(trajectory, group_id: int) -> TrajectoryRecord:
    """Convert a `trainers.trajectory.Trajectory` (token fields filled) into a record.

    Reads input_ids, loss_mask, turn_spans (per turn, [start, end) of its policy tokens),
    turn_boundaries, question_end, turns (kind, valid), outcome and rollout_logprobs.
    group_id: the id shared by the rollouts of the same task.
    """
    name = getattr(trajectory, "id", "?")
    if getattr(trajectory, "input_ids", None) is None:
        raise BatchValidationError(f"trajectory {name!r} has no token ids; tokenise it first")
    if trajectory.outcome is None:
        raise BatchValidationError(f"trajectory {name!r} has no outcome score")
    if len(trajectory.turns) != len(trajectory.turn_spans):
        raise BatchValidationError(f"trajectory {name!r}: {len(trajectory.turns)} turns but "
                                   f"{len(trajectory.turn_spans)} turn spans")
    turn_index = [-1] * len(trajectory.input_ids)
    for turn, (start, end) in enumerate(trajectory.turn_spans):
        for position in range(start, end):
            if trajectory.loss_mask[position]:
                turn_index[position] = turn
    return TrajectoryRecord(
        input_ids=trajectory.input_ids, loss_mask=trajectory.loss_mask, turn_index=turn_index,
        turn_ends=trajectory.turn_boundaries, question_end=trajectory.question_end,
        turn_kinds=[turn.kind for turn in trajectory.turns],
        turn_format_ok=[bool(turn.valid) for turn in trajectory.turns], group_id=group_id,
        outcome=float(trajectory.outcome), engine_logprobs=trajectory.rollout_logprobs)
