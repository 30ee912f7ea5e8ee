"""RolloutBatch: collation from records and loud invariant checks."""

import dataclasses

import pytest
import torch

from tests.helpers import synthetic_record
from trainers.batch import BatchValidationError, TrajectoryRecord, TurnKind, collate


def record(**changes):
    """question 0..5, turn 0 = header 6-7, policy 8-10, reply 11-14; turn 1 = 15-16, 17-19."""
    base = synthetic_record([("search",), ("answer", 3, 0)], group_id=2, outcome=1.0)
    return dataclasses.replace(base, **changes)


def test_collate_pads_and_derives():
    short = record()
    long = synthetic_record([("visit",), ("search",), ("answer", 3, 0)], group_id=2, seed=3)
    batch = collate([short, long], pad_token_id=0)
    assert batch.input_ids.shape == (2, len(long.input_ids))
    assert batch.lengths.tolist() == [len(short.input_ids), len(long.input_ids)]
    assert batch.num_turns.tolist() == [2, 3]
    assert batch.turn_kind[0].tolist() == [TurnKind.SEARCH, TurnKind.ANSWER, -1]
    assert batch.turn_end[0].tolist() == [15, 20, -1]
    assert batch.is_last_turn.tolist() == [[False, True, False], [False, False, True]]
    assert batch.turn_index[0, 8:11].tolist() == [0, 0, 0]
    assert batch.turn_index[0, 11:15].tolist() == [-1] * 4  # the tool reply has no turn
    assert batch.engine_logprobs is None


def test_turn_kind_parse():
    assert TurnKind.parse("visit") is TurnKind.VISIT
    assert TurnKind.parse(2) is TurnKind.ANSWER
    with pytest.raises(ValueError, match="unknown turn kind"):
        TurnKind.parse("browse")


@pytest.mark.parametrize("changes, message", [
    # a token inside turn 0's span claimed by turn 1
    (dict(turn_index=[-1] * 8 + [0, 0, 1] + [-1] * 6 + [1] * 3), "outside that turn's span"),
    (dict(turn_index=[-1] * 8 + [0, 0, -1] + [-1] * 6 + [1] * 3), "turn_index must be >= 0"),
    (dict(turn_ends=[15, 15]), "increase strictly"),
    (dict(turn_ends=[15, 25]), "increase strictly|within"),
    (dict(turn_kinds=["invalid", "answer"]), "INVALID is marked format-valid"),
    (dict(turn_kinds=["answer", "answer"]), "ANSWER turn before the last turn"),
    (dict(question_end=9), "outside that turn's span"),
    (dict(turn_kinds=["search"], turn_ends=[15], turn_format_ok=[True]),
     "beyond the trajectory's turn"),
    (dict(loss_mask=[0] * 8 + [1] * 3 + [0] * 9, turn_index=[-1] * 8 + [0] * 3 + [-1] * 9),
     "without policy tokens"),
    (dict(loss_mask=[0] * 10), "same length"),
])
def test_invalid_records_fail_loudly(changes, message):
    with pytest.raises(BatchValidationError, match=message):
        collate([record(**changes)])


def test_tensor_level_checks():
    longer = synthetic_record([("visit",), ("search",), ("answer", 3, 0)], group_id=2, seed=3)
    batch = collate([record(), longer])
    with pytest.raises(BatchValidationError, match="right-padded"):
        batch.replace(attention_mask=batch.attention_mask.flip(1))
    with pytest.raises(BatchValidationError, match="must be torch.int64"):
        batch.replace(group_ids=batch.group_ids.int())
    with pytest.raises(BatchValidationError, match="shape"):
        batch.replace(old_logprobs=torch.zeros(2, 3))
    with pytest.raises(BatchValidationError, match="floating-point"):
        batch.replace(advantages=torch.zeros(batch.input_ids.shape, dtype=torch.long))
    with pytest.raises(BatchValidationError, match="group_ids"):
        batch.replace(group_ids=torch.tensor([0, -1]))
    ok = batch.replace(old_logprobs=torch.zeros(batch.input_ids.shape))
    assert ok.old_logprobs is not None and batch.old_logprobs is None


def test_engine_logprobs_all_or_none():
    with_engine = record(engine_logprobs=[0.0] * 20)
    assert collate([with_engine]).engine_logprobs.shape == (1, 20)
    with pytest.raises(BatchValidationError, match="all records or none"):
        collate([with_engine, record()])


def test_trajectory_record_is_the_conversion_target():
    fields = {f.name for f in dataclasses.fields(TrajectoryRecord)}
    assert {"input_ids", "loss_mask", "turn_index", "turn_ends", "turn_kinds"} <= fields


def test_conversion_from_the_trajectory_schema():
    from types import SimpleNamespace

    from trainers.batch import record_from_trajectory

    synthetic = record()
    trajectory = SimpleNamespace(
        id="task/0", input_ids=list(synthetic.input_ids), loss_mask=list(synthetic.loss_mask),
        turn_spans=[(8, 11), (17, 20)], turn_boundaries=[15, 20], question_end=6,
        turns=[SimpleNamespace(kind="search", valid=True), SimpleNamespace(kind="answer", valid=True)],
        outcome=1.0, rollout_logprobs=[0.0] * 20)
    converted = record_from_trajectory(trajectory, group_id=2)
    assert list(converted.turn_index) == list(synthetic.turn_index)
    batch = collate([converted])
    assert batch.turn_end[0].tolist() == [15, 20]
    assert batch.engine_logprobs.shape == (1, 20)
    with pytest.raises(BatchValidationError, match="no outcome"):
        record_from_trajectory(SimpleNamespace(**{**vars(trajectory), "outcome": None}), 0)
