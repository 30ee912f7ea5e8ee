"""Learning checks of several seeds side by side: each run's paired pass@1 changes, the
changes pooled over the runs, and their spread from run to run.

    python benchmarks/seeds_summary.py runs/lc0/results.json runs/lc1/results.json \
        runs/lc2/results.json

Every learning check (benchmarks/learning_check.py) plays its policies on the same held-out
tasks and keeps each sample's outcome per policy and task (`results.json` `per_task`). For
each arm against the start, and IGPO against each other arm, this prints three estimates of
the pass@1 change, each with its standard error:

* per run: the change on that run's samples, SE from the task-clustered paired bootstrap
  (the check's own numbers, to the digit: trainers.evaluation.paired);
* pooled: each task's change averaged over the runs, SE by the same bootstrap over tasks.
  It averages away more sampling noise, but it takes every trained policy as given;
* across runs: the mean of the runs' changes, SE = their standard deviation / sqrt(runs).
  This one also counts how far one run's training lands from another's: two runs of the
  same recipe draw other rollouts (another seed, or the same seed with the learner's sums
  added in another order), and their policies differ by more than the evaluation's noise
  (docs/benchmarks.md "Learning check"). With few runs it is a rough number.

A recipe gains when the across-runs change is clearly positive, not only one run's z.
Pass two runs of one seed to see that spread directly (each run is labelled by its file's
directory). Prints `RESULT pooled_<b>_vs_<a>_pass1_z=` and `RESULT across_<b>_vs_<a>_pass1_z=`
for IGPO against the start and against the placebo.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainers.evaluation.stats import bootstrap_se, z_score  # noqa: E402

START, IGPO = "start", "igpo"


@dataclass
class CheckRun:
    """One learning check's per-task pass@1: arm -> one mean outcome per task."""

    label: str
    seed: int  # the check's seed, which also seeded its bootstrap
    tasks: list[str]
    pass1: dict[str, list[float]]


@dataclass
class Change:
    """b - a on pass@1 and its standard error."""

    diff: float
    se: float

    @property
    def z(self) -> float:
        return z_score(self.diff, self.se)


def load_run(path: Path) -> CheckRun:
    """A results.json of benchmarks/learning_check.py.

    Raises:
        ValueError: the file is missing, is not JSON, or has no per-task outcomes.
    """
    try:
        results = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file (a learning check's --output holds "
                         f"results.json)") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    per_task = results.get("per_task") if isinstance(results, dict) else None
    if not per_task or "tasks" not in per_task or "outcomes" not in per_task:
        raise ValueError(f"{path}: no per_task outcomes (written by learning_check.py since "
                         f"b1c909a; rerun the check or play its policies again with --trained)")
    tasks = list(per_task["tasks"])
    pass1 = {}
    for arm, outcomes in per_task["outcomes"].items():
        if len(outcomes) != len(tasks):
            raise ValueError(f"{path}: arm {arm!r} has outcomes for {len(outcomes)} tasks, "
                             f"the task list has {len(tasks)}")
        pass1[arm] = [sum(samples) / len(samples) for samples in outcomes]
    return CheckRun(label=path.resolve().parent.name, seed=int(results.get("seed", 0)),
                    tasks=tasks, pass1=pass1)


def check_same_tasks(runs: Sequence[CheckRun]) -> None:
    """Pooling needs one task list: every check with the same held-out sets and task count."""
    first = runs[0]
    for run in runs[1:]:
        if run.tasks != first.tasks:
            differing = next((i for i, (x, y) in enumerate(zip(first.tasks, run.tasks))
                              if x != y), min(len(first.tasks), len(run.tasks)))
            raise ValueError(
                f"{run.label} played other tasks than {first.label} ({len(run.tasks)} against "
                f"{len(first.tasks)}; first difference at task {differing}): pool checks run "
                f"with the same --validation-world, --held-out-world and --num-tasks")


def paired_change(pairs: Sequence[tuple[float, float]], *, samples: int,
                  seed: int) -> Change:
    """Mean of b - a over tasks; SE by the task-clustered bootstrap of the pairs."""
    def mean_difference(chosen: Sequence[tuple[float, float]]) -> float:
        return sum(b - a for a, b in chosen) / len(chosen)
    return Change(mean_difference(pairs), bootstrap_se(pairs, mean_difference,
                                                       samples=samples, seed=seed))


def compare_runs(runs: Sequence[CheckRun], a: str, b: str, *, samples: int = 1000,
                 seed: int = 0) -> dict[str, object]:
    """b against a in every run that played both: per run, pooled and across runs. A run's
    bootstrap is seeded with its check's seed, as the check's own was, so its row repeats
    the check's report; `seed` seeds the pooled one.

    Returns {"runs": [(label, Change)], "pooled": Change | None, "across": Change | None};
    pooled and across need two runs or more.
    """
    both = [run for run in runs if a in run.pass1 and b in run.pass1]
    per_run = [(run.label, paired_change(list(zip(run.pass1[a], run.pass1[b])),
                                         samples=samples, seed=run.seed)) for run in both]
    pooled = across = None
    if len(both) >= 2:
        pooled = paired_change(
            [(statistics.fmean(run.pass1[a][i] for run in both),
              statistics.fmean(run.pass1[b][i] for run in both))
             for i in range(len(both[0].tasks))], samples=samples, seed=seed)
        diffs = [change.diff for _, change in per_run]
        across = Change(statistics.fmean(diffs),
                        statistics.stdev(diffs) / math.sqrt(len(diffs)))
    return {"runs": per_run, "pooled": pooled, "across": across}


def comparisons(runs: Sequence[CheckRun]) -> list[tuple[str, str]]:
    """(a, b) pairs to report: every arm against the start, then IGPO against the others."""
    arms: list[str] = []
    for run in runs:
        arms += [arm for arm in run.pass1 if arm not in arms]
    pairs = [(START, arm) for arm in arms if arm != START]
    if IGPO in arms:
        pairs += [(arm, IGPO) for arm in arms if arm not in (START, IGPO)]
    return pairs


def _cell(change: Change | None) -> str:
    return "-" if change is None else f"{change.diff:+.3f} ± {change.se:.3f} ({change.z:+.2f})"


def report(runs: Sequence[CheckRun], *, samples: int = 1000) -> list[str]:
    """A markdown table (a row per comparison) and the RESULT lines."""
    labels = [run.label for run in runs]
    lines = [f"pass@1 change (± SE, z) on {len(runs[0].tasks)} held-out tasks, "
             f"{len(runs)} runs",
             "",
             "| change | " + " | ".join(labels) + " | pooled | across runs |",
             "| --- |" + " ---: |" * (len(labels) + 2)]
    results = []
    for a, b in comparisons(runs):
        table = compare_runs(runs, a, b, samples=samples)
        by_label = dict(table["runs"])
        cells = [_cell(by_label.get(label)) for label in labels]
        lines.append(f"| {b} - {a} | " + " | ".join(cells)
                     + f" | {_cell(table['pooled'])} | {_cell(table['across'])} |")
        if b == IGPO and a in (START, "placebo"):
            for kind in ("pooled", "across"):
                if table[kind] is not None:
                    results.append(f"RESULT {kind}_{b}_vs_{a}_pass1_z={table[kind].z:.2f}")
    starts = [statistics.fmean(run.pass1[START]) for run in runs if START in run.pass1]
    if starts:
        lines += ["", "start pass@1 per run: " + ", ".join(f"{s:.3f}" for s in starts)]
    return lines + [""] + results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path,
                        help="results.json files of learning_check.py runs on the same tasks")
    parser.add_argument("--samples", type=int, default=1000, help="bootstrap replicates")
    args = parser.parse_args(argv)
    try:
        runs = [load_run(path) for path in args.results]
        check_same_tasks(runs)
    except ValueError as error:
        print(f"seeds_summary: {error}", file=sys.stderr)
        return 2
    print("\n".join(report(runs, samples=args.samples)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
