"""The numbers and the report of `venus-gym eval` (trainers.evaluation.run).

    summary = summarize(per_task, k=2)          # per_task: each task's k annotated trajectories
    write_reports("runs/eval", summary, per_task)   # summary.json, report.md, report.html, PNGs

Metrics (summary.json), over tasks; `_se` keys are task-clustered bootstrap standard errors
(trainers.evaluation.stats):
* pass@1: the unbiased estimator at k = 1 (the mean correctness of all samples); pass@j for
  j = 2..k and pass@k = pass@{k}: 1 - C(n-c, j) / C(n, j) per task, averaged.
* avg@k: the mean outcome score (the env's reward metric: EM, or F1 with reward_metric f1)
  over the k samples, averaged over tasks. With EM it equals pass@1.
* em, f1: SQuAD EM / F1 of the final `<answer>` against the gold answers, whatever metric the
  env rewarded.
* format_error_rate: malformed turns / every generated turn (retried attempts included, as
  malformed); cut_turn_rate, retried_turn_rate likewise (trainers.evaluation.evaluate.turn_counts).
* browse_ratio (all / correct / wrong): trainers.evaluation.metrics.trajectory_stats's.
* mean_turns, mean_tool_calls, mean_tokens, mean_generated_tokens per trajectory and
  mean_task_wall_s per task (a task's k samples share one wall time).
* by_hops, by_type: pass@1, pass@k, EM, F1, mean turns per hop count / question type.
* judge (with an LLM judge): pass@1, pass@k from the verdicts; errors (no verdict: judged
  not correct) and no_answer counts.
Correct means outcome >= 0.5 (trainers.evaluation.metrics.CORRECT_THRESHOLD).

Plots (PNG next to report.md, inlined as base64 in report.html): accuracy by hop count with
standard errors, browse ratio of correct vs wrong trajectories, histogram of turns per
trajectory (correct and wrong stacked). Figures are drawn on matplotlib's Agg canvas
directly, as trainers.evaluation.training_report does (no pyplot, no backend switch).
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainers.evaluation.evaluate import turn_counts
from trainers.evaluation.metrics import (
    CORRECT_THRESHOLD,
    is_correct,
    outcome,
    trajectory_stats,
)
from trainers.evaluation.stats import bootstrap_se, mean_of_cluster_means, pass_at_k
from trainers.evaluation.training_report import _finite, _format
from trainers.run_log import dumps_json
from trainers.trajectory import Trajectory

Group = Sequence[Trajectory]
PLOTS = (("accuracy_by_hops.png", "accuracy by hop count"),
         ("browse_ratio.png", "browse ratio, correct vs wrong"),
         ("turns_histogram.png", "turns per trajectory"))


def _eval(t: Trajectory) -> Mapping[str, Any]:
    return t.metadata.get("eval") or {}


def _judged(t: Trajectory) -> bool:
    return bool((_eval(t).get("judge") or {}).get("correct"))


def _pass(groups: Sequence[Group], j: int, correct: Callable[[Trajectory], bool]) -> float:
    values = [pass_at_k(len(g), sum(map(correct, g)), j) for g in groups]
    return sum(values) / len(values) if values else math.nan


def _per_task_mean(value: Callable[[Trajectory], float | None]
                   ) -> Callable[[Sequence[Group]], float]:
    def statistic(groups: Sequence[Group]) -> float:
        return mean_of_cluster_means([[v for t in g if (v := value(t)) is not None]
                                      for g in groups])
    return statistic


def _with_se(summary: dict[str, Any], key: str, statistic: Callable[[Sequence[Group]], float],
             groups: Sequence[Group], samples: int, seed: int) -> None:
    summary[key] = statistic(groups)
    summary[f"{key}_se"] = bootstrap_se(groups, statistic, samples=samples, seed=seed)


def _browse(which: str) -> Callable[[Sequence[Group]], float]:
    def statistic(groups: Sequence[Group]) -> float:
        return trajectory_stats([t for g in groups for t in g])[which]
    return statistic


def _format_errors(groups: Sequence[Group]) -> float:
    counts = [turn_counts(t) for g in groups for t in g]
    generated = sum(c.generated for c in counts)
    return (generated - sum(c.valid for c in counts)) / generated if generated else 0.0


def summarize(per_task: Sequence[Group], *, k: int, bootstrap_samples: int = 1000,
              seed: int = 0) -> dict[str, Any]:
    """The summary of the module docstring from each task's k annotated trajectories."""
    from trainers.evaluation.evaluate import Evaluation

    groups = [list(g) for g in per_task if g]
    if not groups:
        raise ValueError("no finished task to summarise")
    wrong_k = [len(g) for g in groups if len(g) != k]
    if wrong_k:
        raise ValueError(f"every task needs k={k} trajectories; some have {wrong_k[:5]}")
    trajectories = [t for g in groups for t in g]
    base = Evaluation(per_task=groups, k=k).summary()
    s: dict[str, Any] = {"tasks": len(groups), "k": k, "trajectories": len(trajectories)}
    boot = {"samples": bootstrap_samples, "seed": seed}

    def pass_stat(j: int, correct: Callable[[Trajectory], bool] = is_correct
                  ) -> Callable[[Sequence[Group]], float]:
        return lambda gs: _pass(gs, j, correct)

    _with_se(s, "pass@1", pass_stat(1), groups, **boot)
    for j in range(2, k + 1):
        _with_se(s, f"pass@{j}", pass_stat(j), groups, **boot)
    s["pass@k"], s["pass@k_se"] = s[f"pass@{k}"], s[f"pass@{k}_se"]
    _with_se(s, "avg@k", _per_task_mean(outcome), groups, **boot)
    _with_se(s, "em", _per_task_mean(lambda t: _eval(t).get("em")), groups, **boot)
    _with_se(s, "f1", _per_task_mean(lambda t: _eval(t).get("f1")), groups, **boot)
    s["answer_rate"] = base["answer_rate"]
    _with_se(s, "format_error_rate", _format_errors, groups, **boot)
    s["cut_turn_rate"] = base["cut_turn_rate"]
    s["retried_turn_rate"] = base["retried_turn_rate"]
    s["generated_turns"] = sum(turn_counts(t).generated for t in trajectories)
    s["browse_ratio"] = base["browse_ratio"]
    for which in ("browse_ratio_correct", "browse_ratio_wrong"):
        _with_se(s, which, _browse(which), groups, **boot)
    _with_se(s, "mean_turns", _per_task_mean(lambda t: len(t.turns)), groups, **boot)
    _with_se(s, "mean_tool_calls", _per_task_mean(lambda t: _eval(t).get("tool_calls")),
             groups, **boot)
    for key, name in (("tokens", "mean_tokens"), ("generated_tokens", "mean_generated_tokens")):
        s[name] = _per_task_mean(lambda t, key=key: _eval(t).get(key))(groups)
    s["mean_task_wall_s"] = mean_of_cluster_means([[_eval(g[0]).get("task_wall_s", math.nan)]
                                                   for g in groups])
    s["by_hops"] = _breakdown(groups, k, lambda g: _eval(g[0]).get("hops",
                                                                   g[0].metadata.get("hops")))
    by_type = _breakdown(groups, k, lambda g: _eval(g[0]).get("type"))
    if by_type:
        s["by_type"] = by_type
    if any("judge" in _eval(t) for t in trajectories):
        judge: dict[str, Any] = {}
        _with_se(judge, "pass@1", pass_stat(1, _judged), groups, **boot)
        _with_se(judge, "pass@k", pass_stat(k, _judged), groups, **boot)
        records = [_eval(t).get("judge") or {} for t in trajectories]
        judge["no_answer"] = sum(r.get("error") == "no final answer" for r in records)
        judge["errors"] = sum(str(r.get("error", "")).startswith("judge:") for r in records)
        judge["judged"] = sum("error" not in r for r in records)
        s["judge"] = judge
    return s


def _breakdown(groups: Sequence[Group], k: int, key: Callable[[Group], Any]
               ) -> dict[str, dict[str, float]]:
    buckets: dict[str, list[Group]] = {}
    for g in groups:
        value = key(g)
        if value is not None and value != "":
            buckets.setdefault(str(value), []).append(g)
    table = {}
    for name in sorted(buckets, key=lambda v: (not v.isdigit(), int(v) if v.isdigit() else v)):
        own = buckets[name]
        table[name] = {"tasks": len(own), "pass@1": _pass(own, 1, is_correct),
                       "pass@k": _pass(own, k, is_correct),
                       "em": _per_task_mean(lambda t: _eval(t).get("em"))(own),
                       "f1": _per_task_mean(lambda t: _eval(t).get("f1"))(own),
                       "mean_turns": _per_task_mean(lambda t: len(t.turns))(own)}
    return table


# --- report -----------------------------------------------------------------------------------
HEADLINE = (("pass@1", "pass@1"), ("avg@k", "avg@k"), ("pass@k", "pass@k"),
            ("em", "exact match"), ("f1", "F1"), ("answer_rate", "answer rate"),
            ("format_error_rate", "format-error rate (every generated turn)"),
            ("cut_turn_rate", "turns cut by the token cap"),
            ("retried_turn_rate", "retried turns"),
            ("browse_ratio", "browse ratio (all)"),
            ("browse_ratio_correct", "browse ratio (correct)"),
            ("browse_ratio_wrong", "browse ratio (wrong)"))
EFFICIENCY = (("mean_turns", "turns per trajectory"),
              ("mean_tool_calls", "tool calls per trajectory"),
              ("mean_tokens", "tokens per trajectory"),
              ("mean_generated_tokens", "generated tokens per trajectory"),
              ("mean_task_wall_s", "wall seconds per task (k samples)"))


def _value(summary: Mapping[str, Any], key: str) -> str:
    value, se = summary.get(key), summary.get(f"{key}_se")
    text = _format(value)
    return f"{text} ± {_format(se)}" if _finite(se) and _finite(value) else text


def report_tables(summary: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table of the report, as text."""
    k = summary.get("k", 1)
    headline = [[label.replace("@k", f"@{k}"), _value(summary, key)]
                for key, label in HEADLINE if key in summary]
    tables = [("Results", ["metric", "value ± SE"], headline)]
    if "judge" in summary:
        judge = summary["judge"]
        tables.append(("LLM judge (BrowseComp grading prompt)", ["metric", "value ± SE"],
                       [["pass@1", _value(judge, "pass@1")],
                        [f"pass@{k}", _value(judge, "pass@k")],
                        ["judged", _format(judge["judged"])],
                        ["no final answer", _format(judge["no_answer"])],
                        ["judge errors (no verdict)", _format(judge["errors"])]]))
    for name, title in (("by_hops", "By hop count"), ("by_type", "By question type")):
        table = summary.get(name) or {}
        if table:
            tables.append((title, [name[3:].rstrip("s") if name == "by_hops" else "type",
                                   "tasks", "pass@1", f"pass@{k}", "EM", "F1", "turns"],
                           [[bucket, _format(row["tasks"]), _format(row["pass@1"]),
                             _format(row["pass@k"]), _format(row["em"]), _format(row["f1"]),
                             _format(row["mean_turns"])] for bucket, row in table.items()]))
    tables.append(("Cost", ["per", "mean ± SE"],
                   [[label, _value(summary, key)] for key, label in EFFICIENCY
                    if key in summary]))
    return tables


def write_reports(output_dir: str | Path, summary: Mapping[str, Any],
                  per_task: Sequence[Group]) -> dict[str, Path]:
    """summary.json, report.md, report.html and the plots; returns their paths by name."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {"summary": output_dir / "summary.json", "md": output_dir / "report.md",
             "html": output_dir / "report.html"}
    paths["summary"].write_text(dumps_json(dict(summary), indent=2) + "\n", encoding="utf-8")
    plots = plot_eval(summary, per_task, output_dir)
    title = f"venus-gym eval: {summary.get('policy', 'policy')} on {summary.get('benchmark', '?')}"
    setup = (f"{summary['tasks']} tasks x {summary['k']} samples "
             f"({summary['trajectories']} trajectories). ± is the standard error (bootstrap "
             f"over tasks); correct = outcome >= {CORRECT_THRESHOLD}.")
    tables = report_tables(summary)

    lines = [f"# {title}", "", setup, ""]
    for name, header, rows in tables:
        lines += [f"## {name}", "", "| " + " | ".join(header) + " |",
                  "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
                  for row in rows]
        lines.append("")
    lines += ["## Plots", ""] + [f"![{label}]({path.name})" for path, label in plots] + [""]
    paths["md"].write_text("\n".join(lines), encoding="utf-8")

    e = html.escape
    body = [f"<h1>{e(title)}</h1>", f"<p>{e(setup)}</p>"]
    for name, header, rows in tables:
        body.append(f"<h2>{e(name)}</h2><table><tr>"
                    + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
        body += ["<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in row) + "</tr>"
                 for row in rows]
        body.append("</table>")
    body.append("<h2>Plots</h2>")
    for path, label in plots:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        body.append(f'<figure><img alt="{e(label)}" src="data:image/png;base64,{data}">'
                    f"<figcaption>{e(label)}</figcaption></figure>")
    style = ("body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;"
             "color:#222}table{border-collapse:collapse;margin:.5rem 0 1.5rem}"
             "td,th{border:1px solid #ccc;padding:.25rem .6rem;text-align:right}"
             "td:first-child,th:first-child{text-align:left}img{max-width:100%}")
    paths["html"].write_text(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{e(title)}</title><style>{style}</style></head><body>"
        + "\n".join(body) + "</body></html>\n", encoding="utf-8")
    return paths


def plot_eval(summary: Mapping[str, Any], per_task: Sequence[Group],
              output_dir: Path) -> list[tuple[Path, str]]:
    """The three plots of the module docstring; returns (path, label) pairs."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("the evaluation report needs matplotlib: pip install matplotlib "
                          "(it is in venus-gym's `train` extra)") from e

    def figure() -> tuple[Any, Any]:
        fig = Figure(figsize=(5.0, 3.2), layout="constrained")
        FigureCanvasAgg(fig)
        return fig, fig.add_subplot(1, 1, 1)

    done = []
    (hops_name, hops_label), (browse_name, browse_label), (turns_name, turns_label) = PLOTS
    k = summary.get("k", 1)

    fig, axes = figure()
    by_hops = summary.get("by_hops") or {}
    if by_hops:
        names = list(by_hops)
        groups = [[g for g in per_task if str(_eval(g[0]).get("hops")) == name]
                  for name in names]
        ses = [bootstrap_se(own, lambda gs: _pass(gs, 1, is_correct)) for own in groups]
        axes.bar(names, [by_hops[n]["pass@1"] for n in names],
                 yerr=[0.0 if not _finite(x) else x for x in ses], capsize=4,
                 label="pass@1", color="#4878a8")
        if k > 1:
            axes.plot(names, [by_hops[n]["pass@k"] for n in names], "o", color="#d95f02",
                      label=f"pass@{k}")
            axes.legend(loc="best", fontsize="small")
        for index, n in enumerate(names):
            axes.annotate(f"n={by_hops[n]['tasks']}", (index, 0), ha="center", va="bottom",
                          fontsize="small", color="white" if by_hops[n]["pass@1"] > .1 else "k")
    axes.set_xlabel("hops")
    axes.set_ylabel("accuracy")
    axes.set_ylim(0, 1.05)
    axes.set_title(hops_label)
    done.append((output_dir / hops_name, hops_label))
    fig.savefig(done[-1][0], dpi=90)

    fig, axes = figure()
    values = [summary.get("browse_ratio_correct"), summary.get("browse_ratio_wrong")]
    errors = [summary.get("browse_ratio_correct_se"), summary.get("browse_ratio_wrong_se")]
    heights = [v if _finite(v) else 0.0 for v in values]
    axes.bar(["correct", "wrong"], heights, color=["#1b9e77", "#d95f02"],
             yerr=[e if _finite(e) else 0.0 for e in errors], capsize=4)
    for index, v in enumerate(values):
        if not _finite(v):
            axes.annotate("no trajectory", (index, 0.02), ha="center", fontsize="small")
    axes.set_ylabel("visits / tool calls")
    axes.set_ylim(0, 1.05)
    axes.set_title(browse_label)
    done.append((output_dir / browse_name, browse_label))
    fig.savefig(done[-1][0], dpi=90)

    fig, axes = figure()
    turns_correct = [len(t.turns) for g in per_task for t in g if is_correct(t)]
    turns_wrong = [len(t.turns) for g in per_task for t in g if not is_correct(t)]
    top = max(turns_correct + turns_wrong + [1])
    bins = [b - 0.5 for b in range(1, top + 2)]
    axes.hist([turns_correct, turns_wrong], bins=bins, stacked=True,
              color=["#1b9e77", "#d95f02"], label=["correct", "wrong"])
    axes.legend(loc="best", fontsize="small")
    axes.set_xlabel("turns")
    axes.set_ylabel("trajectories")
    axes.set_title(turns_label)
    done.append((output_dir / turns_name, turns_label))
    fig.savefig(done[-1][0], dpi=90)
    return done


__all__ = ["PLOTS", "plot_eval", "report_tables", "summarize", "write_reports"]
