"""Synthetic trajectories with a realistic token layout, for tests, docs and benchmarks.

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
