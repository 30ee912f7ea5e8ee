"""Statistics of an evaluation: the unbiased pass@k estimator and task-clustered bootstrap
standard errors. Pure functions of numbers (no trajectories, no torch).

    pass_at_k(n=8, c=3, k=2)                      # 1 - C(5,2)/C(8,2) = 0.642857...
    mean_pass_at_k([(8, 3), (8, 0)], k=2)         # averaged over tasks
    bootstrap_se([[1, 0], [0, 0], [1, 1]])        # SE of the mean over tasks, resampling tasks
    bootstrap_se(clusters, statistic=my_ratio)    # any statistic of a list of clusters

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): with n
samples of a task of which c are correct, the probability that k samples drawn without
replacement contain a correct one is 1 - C(n-c, k) / C(n, k); averaging it over tasks is an
unbiased estimate of pass@k. With n = k it is the share of tasks with any correct sample.

Standard errors: the k samples of one task are correlated (same question, same pages), so
trajectories are not independent draws. The bootstrap resamples *tasks* with replacement
(each task keeping all its samples) and recomputes the statistic; the standard deviation of
those replicates is the standard error. It is seeded, so a report is reproducible.

Where we deviate and why: DR-Venus reports no standard errors; with the few dozen tasks a
small-model evaluation can afford, differences of a few points are noise, and the report
says so next to each number.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

Cluster = TypeVar("Cluster")

DEFAULT_BOOTSTRAP_SAMPLES = 1000


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task: n samples, c of them correct (module docstring).

    Raises:
        ValueError: not 0 <= c <= n, or not 1 <= k <= n.
    """
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise ValueError(f"n, c and k must be ints, got {n!r}, {c!r}, {k!r}")
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n (k samples drawn from n), got k={k}, n={n}")
    if n - c < k:  # every draw of k contains a correct sample
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """pass@k averaged over tasks; `counts` holds one (n, c) per task."""
    if not counts:
        raise ValueError("mean_pass_at_k needs at least one task")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def mean_of_cluster_means(clusters: Sequence[Sequence[float]]) -> float:
    """Mean over clusters of each cluster's mean (tasks weigh the same whatever their k)."""
    return _mean([_mean(list(c)) for c in clusters if len(c)])


def bootstrap_se(clusters: Sequence[Cluster],
                 statistic: Callable[[Sequence[Cluster]], float] | None = None, *,
                 samples: int = DEFAULT_BOOTSTRAP_SAMPLES, seed: int = 0) -> float:
    """Task-clustered bootstrap standard error of `statistic(clusters)`.

    Args:
        clusters: one entry per task, e.g. the list of its samples' scores, or any object
            `statistic` understands (a task's trajectories).
        statistic: maps a list of clusters to a number; default `mean_of_cluster_means`
            (clusters must then be sequences of numbers).
        samples: bootstrap replicates.
        seed: seed of the resampling (numpy's default generator).

    Returns the standard deviation (ddof=1) of the finite replicates; 0.0 for one cluster
    (nothing to resample), NaN when fewer than two replicates are finite (e.g. a ratio whose
    denominator is empty in most resamples).
    """
    import numpy as np

    if samples < 2:
        raise ValueError(f"samples must be >= 2, got {samples}")
    if not clusters:
        return math.nan
    if len(clusters) == 1:
        return 0.0
    statistic = statistic or mean_of_cluster_means  # type: ignore[assignment]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(clusters), size=(samples, len(clusters)))
    replicates = [statistic([clusters[i] for i in row]) for row in picks]  # type: ignore[misc]
    finite = [r for r in replicates if isinstance(r, int | float) and math.isfinite(r)]
    if len(finite) < 2:
        return math.nan
    return float(np.std(finite, ddof=1))


def z_score(diff: float, se: float) -> float:
    """diff / se; with se 0 a nonzero diff is +-inf (no noise at all) and a zero one 0."""
    if se > 0:
        return diff / se
    return 0.0 if diff == 0 else math.copysign(math.inf, diff)


def finite_or_none(value: Any) -> float | None:
    """A float for JSON reports: NaN / inf / non-numbers become None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


__all__ = ["DEFAULT_BOOTSTRAP_SAMPLES", "bootstrap_se", "finite_or_none", "mean_of_cluster_means",
           "mean_pass_at_k", "pass_at_k", "z_score"]
