"""The data pipeline's report: what each stage read, wrote and removed, and why.

`PipelineReport` is written as `report.json` (machine-readable, with the whole config) and
`report.txt` (the same facts for people). It holds

* per stage: trajectories in and out, removals by reason (trajectory level), other counts
  (turns pruned per tool, duplicate interactions per tool, resampled copies per bucket,
  conversion repairs), notes (trajectories kept despite a judge error), and
  the turn-count histogram of the stage's output;
* the skipped bad input lines ("file:line: why", only with --skip-bad; without it the
  first bad line stops the run with that message);
* turn-count histograms before (after reading/converting) and after (the final output)
  and the share of trajectories with more than `long_turns` turns in each.

Turns are counted as assistant messages (`convert.count_turns`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from venus_gym.corpus import atomic_output

DEFAULT_HISTOGRAM_EDGES: tuple[int, ...] = (10, 20, 50, 100, 150, 200)


@dataclass
class TurnHistogram:
    """Counts of trajectories per turn-count bin.

    edges: inclusive upper edges of the bins; one more open bin holds the rest
           (edges (10, 20) give bins 0-10, 11-20, >20).
    long_turns: trajectories with more than this many turns are "long" (share reported).
    """

    edges: tuple[int, ...] = DEFAULT_HISTOGRAM_EDGES
    long_turns: int = 100
    counts: list[int] = field(default_factory=list)
    total: int = 0
    long_count: int = 0

    def __post_init__(self) -> None:
        self.edges = tuple(self.edges)
        if any(b <= a for a, b in zip(self.edges, self.edges[1:])):
            raise ValueError(f"histogram edges must be strictly increasing, got {self.edges}")
        if not self.counts:
            self.counts = [0] * (len(self.edges) + 1)

    def add(self, turns: int) -> None:
        index = next((i for i, edge in enumerate(self.edges) if turns <= edge), len(self.edges))
        self.counts[index] += 1
        self.total += 1
        if turns > self.long_turns:
            self.long_count += 1

    @property
    def long_share(self) -> float:
        """Share of trajectories with more than `long_turns` turns (0.0 when empty)."""
        return self.long_count / self.total if self.total else 0.0

    def labels(self) -> list[str]:
        labels, low = [], 0
        for edge in self.edges:
            labels.append(f"{low}-{edge}")
            low = edge + 1
        labels.append(f">{self.edges[-1]}" if self.edges else "all")
        return labels

    def to_json(self) -> dict[str, Any]:
        return {"edges": list(self.edges), "labels": self.labels(), "counts": list(self.counts),
                "total": self.total, "long_turns": self.long_turns,
                "long_count": self.long_count, "long_share": self.long_share}


@dataclass
class StageReport:
    """What one stage did (module docstring)."""

    stage: str
    inputs: int = 0
    outputs: int = 0
    removed: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    output_turns: TurnHistogram = field(default_factory=TurnHistogram)
    output_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["output_turns"] = self.output_turns.to_json()
        return data


@dataclass
class PipelineReport:
    """The whole run: config, inputs, stages, bad lines, before/after turn statistics."""

    config: dict[str, Any]
    inputs: list[str]
    stages: list[StageReport] = field(default_factory=list)
    bad_lines: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def turns_before(self) -> TurnHistogram:
        return self.stages[0].output_turns

    @property
    def turns_after(self) -> TurnHistogram:
        return self.stages[-1].output_turns

    def stage(self, name: str) -> StageReport:
        for stage in self.stages:
            if stage.stage == name:
                return stage
        raise KeyError(f"no stage {name!r} in this report; stages: "
                       f"{[s.stage for s in self.stages]}")

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "inputs": self.inputs, "seconds": self.seconds,
                "bad_lines": self.bad_lines,
                "stages": [stage.to_json() for stage in self.stages],
                "turns_before": self.turns_before.to_json() if self.stages else None,
                "turns_after": self.turns_after.to_json() if self.stages else None}

    def write(self, json_path: str | Path, text_path: str | Path | None = None) -> None:
        """Write report.json (and report.txt), each under a temporary name then renamed;
        the text one first, so a complete report.json means both are written."""
        if text_path is not None:
            with atomic_output(text_path) as temporary:
                # backslashreplace: a file name that is not valid UTF-8 must not stop the report.
                temporary.write_text(self.to_text(), encoding="utf-8", errors="backslashreplace")
        text = json.dumps(self.to_json(), indent=2, ensure_ascii=False)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # e.g. a file name that is not valid UTF-8: escape it
            text = json.dumps(self.to_json(), indent=2)
        with atomic_output(json_path) as temporary:
            temporary.write_text(text + "\n", encoding="utf-8")

    def to_text(self) -> str:
        return render_text(self.to_json())


def _percent(share: float) -> str:
    return f"{100 * share:.2f}%"


def render_text(report: dict[str, Any]) -> str:
    """The human-readable form of a report's JSON (also used for a saved report.json)."""
    lines = [f"inputs: {', '.join(report['inputs'])}"]
    stages = report["stages"]
    if stages:
        long_turns = stages[0]["output_turns"]["long_turns"]
        lines += [f"time: {report['seconds']:.2f} s (stages stream, so they share it)", "",
                  f"{'stage':<10} {'in':>8} {'out':>8} {'>' + str(long_turns) + ' turns':>11}"]
        for stage in stages:
            turns = stage["output_turns"]
            lines.append(f"{stage['stage']:<10} {stage['inputs']:>8} {stage['outputs']:>8} "
                         f"{_percent(turns['long_share']):>11}")
        for stage in stages:
            details = [f"removed ({reason}): {n}" for reason, n in stage["removed"].items()]
            details += [f"{name}: {n}" for name, n in stage["counts"].items()]
            details += [f"note: {note}" for note in stage["notes"]]
            if stage.get("output_path"):
                details.append(f"wrote {stage['output_path']}")
            if details:
                lines += ["", f"[{stage['stage']}]"] + [f"  {d}" for d in details]
        before, after = report["turns_before"], report["turns_after"]
        lines += ["", "turn-count histogram (trajectories):",
                  f"  {'turns':<10} {'before':>8} {'after':>8}"]
        for label, n_before, n_after in zip(before["labels"], before["counts"], after["counts"]):
            lines.append(f"  {label:<10} {n_before:>8} {n_after:>8}")
        lines.append(f"  {'total':<10} {before['total']:>8} {after['total']:>8}")
        lines.append(f"share of >{long_turns}-turn trajectories: "
                     f"{_percent(before['long_share'])} before, "
                     f"{_percent(after['long_share'])} after")
    bad = report["bad_lines"]
    lines += ["", f"skipped bad lines: {len(bad)}"] + [f"  {line}" for line in bad]
    return "\n".join(lines) + "\n"
