"""The end-of-run report: before-RL vs after-RL evaluation, last training step, curves.

    write_report("runs/igpo", metrics_path="runs/igpo/metrics.jsonl",
                 before=eval_before.summary(), after=eval_after.summary(), config=cfg)

writes into the output directory

    report.md    a before / after table (pass@1, pass@k, format-error rate, browse ratio of
                 correct vs wrong trajectories, mean turns, ...), the last step's training
                 metrics, the curves, and the config
    report.json  the same numbers (NaN as null)
    curves.png   one subplot per training metric present in metrics.jsonl, among
                 CURVE_KEYS, against the step; a metric logged with its standard error
                 over the step's questions (`accuracy_se`, ...) gets a ± 1 SE band

Where we deviate from DR-Venus and why
* The browse ratio is shown for correct and wrong trajectories separately, as DR-Venus
  reports it (correct trajectories browse more; RL raises the ratio), but from the env's
  turn kinds (visit turns / tool turns), not from counting tool calls in the text.
* Curves are raw per-step values with a moving average once a run has > 20 points; no
  smoothing is hidden in the numbers of report.json.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainers.run_log import dumps_json, read_metrics

CURVE_KEYS: tuple[str, ...] = ("reward", "accuracy", "format_error_rate", "browse_ratio",
                               "kl", "entropy", "clip_fraction", "tokens_per_s")
# (label, keys tried in order) for the before / after table; the first key present is used.
COMPARISON_ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("pass@1 accuracy", ("pass@1", "accuracy")),
    ("pass@k", ("pass@k",)),
    ("answer rate", ("answer_rate",)),
    ("format-error rate", ("format_error_rate",)),
    ("browse ratio (all)", ("browse_ratio",)),
    ("browse ratio (correct)", ("browse_ratio_correct",)),
    ("browse ratio (wrong)", ("browse_ratio_wrong",)),
    ("mean turns", ("mean_turns",)),
    ("mean tokens", ("mean_tokens",)),
    ("tasks", ("tasks",)),
)
_SMOOTH_AFTER = 20  # points; below this a moving average hides more than it shows


def write_report(output_dir: str | Path, *, metrics_path: str | Path,
                 before: Mapping[str, Any], after: Mapping[str, Any],
                 config: Mapping[str, Any] | None = None,
                 title: str = "venus-gym run",
                 sections: Sequence[tuple[str, Sequence[str]]] = (),
                 extra: Mapping[str, Any] | None = None) -> Path:
    """Write report.md, report.json and curves.png into output_dir; returns report.md's path.

    Args:
        output_dir: where to write (created if missing).
        metrics_path: the run's metrics.jsonl (trainers.run_log.MetricsLogger); it may be
            empty (no step logged), but it must exist.
        before, after: evaluation summaries (trainers.evaluation.evaluate.Evaluation.summary())
            before and after RL. Rows whose key neither has are left out.
        config: the run's configuration, appended to report.md and report.json.
        title: the report's heading.
        sections: (heading, markdown lines) written before the before / after table, e.g.
            which policy RL started from and a paired comparison with standard errors.
        extra: more entries for report.json (e.g. that comparison's numbers).

    Raises:
        FileNotFoundError: metrics_path does not exist.
        TypeError: before / after are not mappings.
        ImportError: matplotlib is missing (pip install matplotlib).
    """
    for name, value in (("before", before), ("after", after)):
        if not isinstance(value, Mapping):
            raise TypeError(f"{name} must be a mapping of metric -> number (e.g. "
                            f"Evaluation.summary()), got {type(value).__name__}")
    metrics_path = Path(metrics_path)
    if not metrics_path.exists():
        raise FileNotFoundError(f"metrics file {metrics_path} does not exist")
    rows = read_metrics(metrics_path)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    curves_path = output_dir / "curves.png"
    plotted = plot_curves(rows, curves_path, title=title)
    last = rows[-1] if rows else {}
    comparison = _comparison(before, after)

    report = {
        "title": title,
        "comparison": {label: {"before": b, "after": a} for label, b, a in comparison},
        "before": dict(before),
        "after": dict(after),
        "training": {"steps_logged": len(rows), "last_step": last, "curves": plotted},
        "config": dict(config) if config is not None else None,
        **(dict(extra) if extra else {}),
    }
    (output_dir / "report.json").write_text(dumps_json(report, indent=2) + "\n", encoding="utf-8")

    lines = [f"# {title}", ""]
    for heading, body in sections:
        lines += [f"## {heading}", "", *body, ""]
    lines += ["## Evaluation: before vs after RL", "",
             "| metric | before RL | after RL | change |", "| --- | ---: | ---: | ---: |"]
    for label, b, a in comparison:
        change = _format(a - b, signed=True) if _finite(a) and _finite(b) else "n/a"
        lines.append(f"| {label} | {_format(b)} | {_format(a)} | {change} |")
    lines += ["", "n/a: not measured, or an average over no trajectories (e.g. the browse "
              "ratio of correct trajectories when none was correct).", ""]
    lines += ["## Training", ""]
    if rows:
        lines += [f"{len(rows)} steps logged; the last (step {last['step']}):", "",
                  "| metric | value |", "| --- | ---: |"]
        lines += [f"| {key} | {_format(value)} |" for key, value in last.items()
                  if key not in ("step", "time")]
    else:
        lines.append("No training step was logged.")
    lines += ["", "![training curves](curves.png)", ""]
    if config is not None:
        lines += ["## Config", "", "```json", dumps_json(dict(config), indent=2), "```", ""]
    report_path = output_dir / "report.md"
    report_path.write_text("\n".join(lines), encoding="utf-8")
    return report_path


def plot_curves(rows: Sequence[Mapping[str, Any]], path: str | Path, *,
                title: str = "", keys: Sequence[str] = CURVE_KEYS) -> list[str]:
    """Plot each key of `keys` with a finite value in `rows` against the step; returns the
    keys plotted. With none, the PNG says so (the report always links a picture)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:
        raise ImportError("the training report needs matplotlib: pip install matplotlib "
                          "(it is in venus-gym's `train` extra)") from e
    present = [key for key in keys
               if any(_finite(row.get(key)) for row in rows)]
    columns = 2 if len(present) > 1 else 1
    grid_rows = max(1, math.ceil(len(present) / columns))
    # Figure + the Agg canvas directly (not pyplot): no global backend switch, no GUI,
    # safe inside a training process that may have set another backend.
    figure = Figure(figsize=(5.5 * columns, 3.2 * grid_rows), layout="constrained")
    FigureCanvasAgg(figure)
    if title:
        figure.suptitle(title)
    if not present:
        axes = figure.add_subplot(1, 1, 1)
        axes.text(0.5, 0.5, "no training metrics logged", ha="center", va="center")
        axes.set_axis_off()
    for index, key in enumerate(present):
        axes = figure.add_subplot(grid_rows, columns, index + 1)
        points = [(row["step"], float(row[key])) for row in rows if _finite(row.get(key))]
        steps, values = [p[0] for p in points], [p[1] for p in points]
        axes.plot(steps, values, linewidth=1, alpha=0.5 if len(points) > _SMOOTH_AFTER else 1,
                  marker="o" if len(points) <= _SMOOTH_AFTER else None, markersize=3)
        band = standard_error_band(rows, key)
        if band is not None:
            axes.fill_between(*band, alpha=0.2, linewidth=0,
                              label="± 1 SE over the step's questions")
            axes.legend(loc="best", fontsize="small")
        if len(points) > _SMOOTH_AFTER:
            window = max(2, len(points) // 20)
            smooth = [sum(values[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1))
                      for i in range(len(values))]
            axes.plot(steps, smooth, linewidth=2, label=f"moving mean, {window} steps")
            axes.legend(loc="best", fontsize="small")
        axes.set_title(key)
        axes.set_xlabel("step")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(True, alpha=0.3)
    figure.savefig(path, dpi=100)
    return present


def standard_error_band(rows: Sequence[Mapping[str, Any]], key: str
                        ) -> tuple[list[int], list[float], list[float]] | None:
    """(steps, value - SE, value + SE) for the steps where `key` and `{key}_se` (logged by
    the RL driver: trainers.evaluation.metrics.question_spread) are both finite; None when
    no step has both."""
    points = [(row["step"], float(row[key]), float(row[f"{key}_se"])) for row in rows
              if _finite(row.get(key)) and _finite(row.get(f"{key}_se"))]
    if not points:
        return None
    return ([step for step, _, _ in points], [value - se for _, value, se in points],
            [value + se for _, value, se in points])


def _comparison(before: Mapping[str, Any], after: Mapping[str, Any]
                ) -> list[tuple[str, float | None, float | None]]:
    table = []
    for label, keys in COMPARISON_ROWS:
        b, a = _first(before, keys), _first(after, keys)
        if b is None and a is None:
            continue
        table.append((label, b, a))
    return table


def _first(summary: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        if key in summary and summary[key] is not None:
            return float(summary[key])
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _format(value: Any, signed: bool = False) -> str:
    if not _finite(value):
        return "n/a"
    sign = "+" if signed else ""
    if float(value).is_integer():  # counts (tasks, steps) and exact 0 / 1 rates
        return f"{int(value):{sign}d}"
    return f"{value:{sign}.1f}" if abs(value) >= 100 else f"{value:{sign}.4f}"


__all__ = ["CURVE_KEYS", "plot_curves", "write_report"]
