"""IGPO vs GRPO from one SFT checkpoint, at the same rollout budget, several seeds each.

    python examples/compare_igpo_grpo.py --sft-model runs/demo/sft/final \
        --config examples/configs/compare_rl.yaml --seeds 0 1 2

Needs the package installed (`pip install -e .[train]`, as `make test` and `make demo` do).

Every run starts from the same SFT weights and uses the same number of steps, queries per
step and group size (so the same number of rollouts); only `algorithm.name` and `run.seed`
change. The SFT model is evaluated once on the held-out test split; each run is evaluated
after training on the same tasks with greedy decoding. Prints and writes (output/results.md,
output/results.json) the mean and spread (sample standard deviation) of held-out pass@1,
format-error rate and browse ratio per algorithm, and every run's numbers.

The evaluation is the same for all runs and is not tuned per algorithm.

A run whose directory already holds a finished evaluation (eval.json with "after") of the
same settings is read back instead of trained again, so a comparison can be extended seed by
seed (pass --rerun to train every run afresh; a finished run with other settings stops the
comparison). A half-finished run is trained again from its start.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from trainers.rl.config import RLConfig, load_rl_config, rl_config_to_dict
from trainers.rl.driver import train
from trainers.run_log import CONFIG_FILE, METRICS_FILE, dumps_json, read_metrics

KEYS = ("pass@1", "format_error_rate", "browse_ratio", "browse_ratio_correct",
        "browse_ratio_wrong", "mean_turns")


def spread(values: list[float]) -> tuple[float, float]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return float("nan"), float("nan")
    return statistics.fmean(finite), (statistics.stdev(finite) if len(finite) > 1 else 0.0)


def finished_run(run_dir: Path, config: dict | None = None) -> tuple[dict, dict] | None:
    """(before, after) of a run that finished its evaluation in `run_dir`, else None. `after`
    gains train_accuracy_last3 from the run's metrics file; the run's wall time is unknown.
    With `config` (the run's config as a dict), a finished run trained with other settings
    is refused by name rather than mixed into the comparison (whether it evaluated the
    start, eval.before, may differ)."""
    eval_file = run_dir / "eval.json"
    if not eval_file.is_file():
        return None
    saved = json.loads(eval_file.read_text())
    if not saved.get("after"):
        return None
    if config is not None:
        defaults = json.loads(dumps_json(rl_config_to_dict(RLConfig())))
        differ = _differences(json.loads((run_dir / CONFIG_FILE).read_text()), config, defaults)
        differ = [key for key in differ if key != "eval.before"]
        if differ:
            raise SystemExit(f"{run_dir} holds a finished run with other settings "
                             f"({', '.join(differ)}): pass --rerun, or another --output")
    steps = read_metrics(run_dir / METRICS_FILE)
    after = dict(saved["after"])
    after["train_accuracy_last3"] = statistics.fmean(s["accuracy"] for s in steps[-3:])
    after["seconds"] = float("nan")
    return saved.get("before") or {}, after


def _differences(saved: dict, wanted: dict, defaults: dict | None = None,
                 prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested config dicts. A key the saved
    config lacks (a setting added after the run was trained) counts as its value in
    `defaults`: settings are added with defaults that keep the earlier behaviour."""
    defaults = defaults or {}
    keys = []
    for key in sorted(set(saved) | set(wanted)):
        a = saved[key] if key in saved else defaults.get(key)
        b = wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            nested = defaults.get(key)
            keys += _differences(a, b, nested if isinstance(nested, dict) else None,
                                 f"{prefix}{key}.")
        elif a != b:
            keys.append(f"{prefix}{key}")
    return keys


def main(argv: list[str] | None = None, prog: str | None = None,
         default_config: str | None = None) -> int:
    """Train (or read back) every algorithm x seed run, then write results.md/.json.
    --config is required unless `default_config` is given."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--sft-model", default="runs/demo/sft/final")
    parser.add_argument("--config", default=default_config, required=default_config is None)
    parser.add_argument("--algorithms", nargs="+", default=["igpo", "grpo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--output", default="runs/compare")
    parser.add_argument("--rerun", action="store_true",
                        help="train every run even if its directory holds a finished one")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    base = load_rl_config(args.config)
    base.policy.path = args.sft_model

    runs: dict[str, list[dict[str, float]]] = {name: [] for name in args.algorithms}
    before: dict[str, float] = {}
    for seed in args.seeds:
        for name in args.algorithms:
            config = dataclasses.replace(base)
            config.algorithm = dataclasses.replace(base.algorithm, name=name,
                                                   options=base.algorithm.options
                                                   if name == "igpo" else
                                                   {"loss": base.algorithm.options.get(
                                                       "loss", {})})
            run_dir = output / f"{name}-seed{seed}"
            config.run = dataclasses.replace(base.run, seed=seed, output_dir=str(run_dir))
            config.eval = dataclasses.replace(base.eval, before=not before)
            finished = None if args.rerun else finished_run(
                run_dir, json.loads(dumps_json(rl_config_to_dict(config))))
            if finished is not None:
                saved_before, after = finished
                before = before or saved_before
                runs[name].append(after)
                print(f"{name} seed {seed}: read back from {run_dir}", flush=True)
                continue
            started = time.perf_counter()
            result = train(config)
            if not before:
                before = result.before
            after = dict(result.after)
            after["train_accuracy_last3"] = statistics.fmean(
                h["accuracy"] for h in result.history[-3:])
            after["seconds"] = time.perf_counter() - started
            runs[name].append(after)
            print(f"{name} seed {seed}: " + ", ".join(f"{k} {after.get(k, float('nan')):.3f}"
                                                       for k in KEYS), flush=True)

    lines = [f"Held-out test split, greedy, from {args.sft_model}; "
             f"{base.run.steps} steps x {base.rollout.queries_per_step} queries x "
             f"G={base.rollout.group_size} per run; seeds {args.seeds}.", "",
             "| policy | " + " | ".join(KEYS) + " |",
             "|---|" + "---:|" * len(KEYS),
             "| SFT (start) | " + " | ".join(f"{before.get(k, float('nan')):.3f}"
                                          for k in KEYS) + " |"]
    summary = {"before": before, "runs": runs, "mean_std": {}}
    for name, results in runs.items():
        cells = []
        summary["mean_std"][name] = {}
        for key in KEYS:
            mean, std = spread([r.get(key, float("nan")) for r in results])
            summary["mean_std"][name][key] = [mean, std]
            cells.append(f"{mean:.3f} ± {std:.3f}")
        lines.append(f"| {name} ({len(results)} seeds) | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    (output / "results.md").write_text(text + "\n")
    (output / "results.json").write_text(dumps_json(summary, indent=2))
    print("\n" + text)
    print(f"\nwrote {output / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(default_config="examples/configs/compare_rl.yaml"))
