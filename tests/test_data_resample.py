"""Turn-aware resampling: weights by turn count, copies, DR-Venus's published numbers."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.test_data_fixtures import long_record
from trainers.data.convert import convert_drvenus_record, count_turns
from trainers.data.report import TurnHistogram
from trainers.data.resample import TurnWeights, copies_for, planned_total, resample_stream
from venus_gym.protocol import DEFAULT_TOOLS


def test_default_weights_at_the_bucket_edges():
    weights = TurnWeights()
    assert [weights.weight_for(t) for t in (0, 1, 50, 51, 100, 101, 400)] == [1, 1, 1, 2, 2, 5, 5]
    assert weights.bucket_names() == ["<=50", "51-100", ">100"]


def test_drvenus_published_counts_and_long_share():
    # design.md "SFT": 9,365 -> 18,745 instances, >100-turn share 13.29% -> 33.21%.
    # Solving n1 + n2 + n3 = 9365, n1 + 2 n2 + 5 n3 = 18745, n3 = 13.29% gives 3720/4400/1245.
    turn_counts = [30] * 3720 + [75] * 4400 + [150] * 1245
    assert planned_total(turn_counts, TurnWeights()) == 18745
    before, after = TurnHistogram(), TurnHistogram()
    for turns in turn_counts:
        before.add(turns)
        for _ in range(copies_for("any", turns, TurnWeights())):
            after.add(turns)
    assert after.total == 18745
    assert round(100 * before.long_share, 2) == 13.29
    assert round(100 * after.long_share, 2) == 33.21


def test_resample_stream_writes_copies_next_to_the_original():
    # 3, 61 and 121 turns (tool turns + the answer).
    trajectories = [convert_drvenus_record(long_record(name, tools), "f", DEFAULT_TOOLS)
                    for name, tools in (("short", 2), ("mid", 60), ("long", 120))]
    assert [count_turns(t) for t in trajectories] == [3, 61, 121]
    by_bucket: Counter[str] = Counter()
    out = list(resample_stream(trajectories, TurnWeights(), 0, by_bucket))
    assert [t.id for t in out] == ["short", "mid", "mid#copy1", "long"] + [
        f"long#copy{k}" for k in range(1, 5)]
    assert by_bucket == {"<=50": 1, "51-100": 2, ">100": 5}
    assert out[2].metadata["resample_copy"] == 1 and "resample_copy" not in out[1].metadata
    assert out[2].messages == out[1].messages


def test_custom_thresholds_and_zero_weight():
    weights = TurnWeights(thresholds=(2,), weights=(0.0, 3.0))
    trajectories = [convert_drvenus_record(long_record(name, tools), "f", DEFAULT_TOOLS)
                    for name, tools in (("one", 0), ("two", 1), ("three", 2))]
    by_bucket: Counter[str] = Counter()
    out = list(resample_stream(trajectories, weights, 0, by_bucket))
    assert [t.id for t in out] == ["three", "three#copy1", "three#copy2"]
    assert by_bucket == {"dropped (0 copies)": 2, ">2": 3}


def test_fractional_weights_are_deterministic_and_unbiased():
    weights = TurnWeights(thresholds=(50,), weights=(1.0, 1.5))
    ids = [f"traj-{i}" for i in range(4000)]
    counts = [copies_for(i, 80, weights, seed=7) for i in ids]
    assert set(counts) == {1, 2}
    assert counts == [copies_for(i, 80, weights, seed=7) for i in reversed(ids)][::-1]
    assert abs(sum(counts) / len(counts) - 1.5) < 0.03
    assert counts != [copies_for(i, 80, weights, seed=8) for i in ids]
    with pytest.raises(ValueError, match="integer weights"):
        planned_total([80], weights)


@pytest.mark.parametrize("thresholds, weights, message", [
    ((50, 100), (1.0, 2.0), "2 threshold"),
    ((100, 50), (1.0, 2.0, 5.0), "strictly increasing"),
    ((50,), (1.0, -1.0), ">= 0"),
])
def test_invalid_weight_specs_are_refused(thresholds, weights, message):
    with pytest.raises(ValueError, match=message):
        TurnWeights(thresholds, weights)
