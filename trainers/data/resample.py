"""Stage 5 of the SFT data pipeline: turn-aware resampling (long trajectories count more).

A trajectory with T interaction turns (assistant messages) gets weight w(T) from
thresholds t_1 < ... < t_k and weights w_0, ..., w_k: w_0 for T <= t_1, w_i for
t_i < T <= t_{i+1}, w_k for T > t_k. The DR-Venus default is thresholds (50, 100) and
weights (1, 2, 5): 1x for <= 50 turns, 2x for 51-100, 5x for > 100 (design.md
"SFT": 9,365 -> 18,745 instances, > 100-turn share 13.29% -> 33.21%).

An integer weight w writes the trajectory w times (0 drops it, counted in the report).
A fractional weight w = n + f writes it n times plus once more with probability f, decided
by a random generator seeded with (seed, trajectory id): the same input always gives the
same output, independent of input order or of which other trajectories are present, and
the expected count is exactly w.

The first copy keeps the trajectory's id; copy k >= 1 gets id "<id>#copy<k>" and
`metadata["resample_copy"] = k`, so ids stay unique. Copies are written next to their
original; shuffling is the SFT loader's job.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from trainers.data.convert import count_turns
from trainers.trajectory import Trajectory


@dataclass(frozen=True)
class TurnWeights:
    """Resampling weight by turn count (module docstring).

    thresholds: strictly increasing upper turn counts of all but the last bucket.
    weights:    one weight per bucket (len(thresholds) + 1 of them), each >= 0.
    """

    thresholds: tuple[int, ...] = (50, 100)
    weights: tuple[float, ...] = (1.0, 2.0, 5.0)

    def __post_init__(self) -> None:
        if len(self.weights) != len(self.thresholds) + 1:
            raise ValueError(f"{len(self.thresholds)} threshold(s) need "
                             f"{len(self.thresholds) + 1} weights, got {len(self.weights)}")
        if any(b <= a for a, b in zip(self.thresholds, self.thresholds[1:])):
            raise ValueError(f"thresholds must be strictly increasing, got {self.thresholds}")
        if any(not math.isfinite(w) or w < 0 for w in self.weights):
            raise ValueError(f"weights must be finite and >= 0, got {self.weights}")

    def weight_for(self, turns: int) -> float:
        for threshold, weight in zip(self.thresholds, self.weights):
            if turns <= threshold:
                return weight
        return self.weights[-1]

    def bucket_names(self) -> list[str]:
        """Human names of the buckets, e.g. ["<=50", "51-100", ">100"]."""
        names, low = [], 0
        for threshold in self.thresholds:
            names.append(f"<={threshold}" if low == 0 else f"{low}-{threshold}")
            low = threshold + 1
        names.append(f">{self.thresholds[-1]}" if self.thresholds else "all")
        return names


def copies_for(trajectory_id: str, turns: int, weights: TurnWeights, seed: int = 0) -> int:
    """How many times the trajectory is written (module docstring)."""
    weight = weights.weight_for(turns)
    whole = math.floor(weight)
    fraction = weight - whole
    if fraction > 0 and random.Random(f"{seed}:{trajectory_id}").random() < fraction:
        whole += 1
    return whole


def planned_total(turn_counts: Iterable[int], weights: TurnWeights) -> int:
    """Output size for integer weights, from turn counts alone (sizing, hand checks)."""
    total = 0.0
    for turns in turn_counts:
        weight = weights.weight_for(turns)
        if weight != math.floor(weight):
            raise ValueError("planned_total needs integer weights; fractional ones are random")
        total += weight
    return int(total)


def resample_stream(trajectories: Iterable[Trajectory], weights: TurnWeights, seed: int,
                    copies_by_bucket: Counter[str]) -> Iterator[Trajectory]:
    """Write each trajectory copies_for(...) times; adds written copies per bucket (and
    "dropped (0 copies)" for trajectories written zero times) to `copies_by_bucket`."""
    names = weights.bucket_names()
    for trajectory in trajectories:
        turns = count_turns(trajectory)
        copies = copies_for(trajectory.id, turns, weights, seed)
        if copies == 0:
            copies_by_bucket["dropped (0 copies)"] += 1
            continue
        copies_by_bucket[names[_bucket_index(turns, weights.thresholds)]] += copies
        yield trajectory
        for k in range(1, copies):
            yield replace(trajectory, id=f"{trajectory.id}#copy{k}",
                          metadata={**trajectory.metadata, "resample_copy": k})


def _bucket_index(turns: int, thresholds: Sequence[int]) -> int:
    return next((i for i, threshold in enumerate(thresholds) if turns <= threshold),
                len(thresholds))
