"""Test helpers: synthetic trajectories with a realistic token layout, and a group check.

Layout of one trajectory (ids are random; only the structure matters):

    [question: prompt tokens]
    per turn: [generation prompt: header tokens][policy tokens][tool reply: reply tokens]
              turn_end = the position right after the reply

The last turn normally has no reply, so its turn_end is the end of its policy tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainers.batch import TrajectoryRecord
from trainers.engines.base import Engine, GenerationResult


@dataclass(frozen=True)
class TurnSpec:
    """One assistant turn: its kind, how many ids it generated, how long the tool reply is."""

    kind: str
    policy_tokens: int = 3
    reply_tokens: int = 4
    format_ok: bool = True


def synthetic_record(turns: Sequence[TurnSpec | tuple], group_id: int = 0, outcome: float = 0.0,
                     question_tokens: int = 6, header_tokens: int = 2, vocab_size: int = 256,
                     seed: int = 0) -> TrajectoryRecord:
    """A TrajectoryRecord with the layout above (tuples are TurnSpec arguments)."""
    generator = torch.Generator().manual_seed(seed)
    specs = [t if isinstance(t, TurnSpec) else TurnSpec(*t) for t in turns]
    loss_mask: list[int] = [0] * question_tokens
    turn_index: list[int] = [-1] * question_tokens
    turn_ends: list[int] = []
    for t, spec in enumerate(specs):
        loss_mask += [0] * header_tokens + [1] * spec.policy_tokens + [0] * spec.reply_tokens
        turn_index += [-1] * header_tokens + [t] * spec.policy_tokens + [-1] * spec.reply_tokens
        turn_ends.append(len(loss_mask))
    ids = torch.randint(0, vocab_size, (len(loss_mask),), generator=generator).tolist()
    return TrajectoryRecord(
        input_ids=ids, loss_mask=loss_mask, turn_index=turn_index, turn_ends=turn_ends,
        question_end=question_tokens, turn_kinds=[s.kind for s in specs],
        turn_format_ok=[s.format_ok for s in specs], group_id=group_id, outcome=outcome)


def check_group(trajectories, chat=None) -> None:
    """trainers.trajectory.check_invariants on every trajectory of a group."""
    from trainers.trajectory import check_invariants

    for trajectory in trajectories:
        check_invariants(trajectory, chat)


class RepliesEngine(Engine):
    """An engine answering its requests with `replies` in turn: (text, closed) gives the
    text's ids, plus the end-of-turn id when `closed` (finish "stop"), else ending there as
    if cut by the token cap (finish "length"). `calls` counts the requests answered."""

    def __init__(self, chat, replies):
        self.chat = chat
        self.replies = list(replies)
        self.calls = 0

    def generate(self, requests):
        results = []
        for _ in requests:
            text, closed = self.replies[self.calls % len(self.replies)]
            self.calls += 1
            ids = self.chat.tokenizer.encode(text, add_special_tokens=False)
            ids += [self.chat.end_of_turn_id] * closed
            results.append(GenerationResult(ids, [0.0] * len(ids),
                                            "stop" if closed else "length"))
        return results
