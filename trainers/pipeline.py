"""The main job: world -> oracle SFT data -> SFT continuing the packaged warm start -> IGPO
from what SFT produced -> paired held-out evaluation -> report.

    venus-gym demo                                  # the embedded default, on CPU
    venus-gym demo --sft-config my_sft.yaml --rl-config my_rl.yaml --output runs/mine

Each stage writes under the output directory, so every artefact can be inspected or reused:

    world/            the generated world RL trains and is evaluated on (corpus.jsonl, ...)
    sft_data.jsonl    oracle trajectories (the SFT data) from the train splits of
                      data.world_seeds, worlds the warm start never saw and RL never plays
    sft/final/        the SFT policy (sft/metrics.jsonl: its loss)
    rl/               IGPO: metrics.jsonl, samples/, checkpoints, final/ model
    report.md         which policy each stage started from; the policies before SFT, after
                      SFT and after RL on paired, sampled held-out tasks with standard errors
                      (metrics that got worse beyond noise flagged); browse ratio of correct vs
                      wrong trajectories; curves.png; report.json

Which policy each stage starts from. The default SFT stage (trainers/configs/demo_sft.yaml)
continues the packaged `warm-start` (trainers/warm_start/README.md: the best CPU SFT recipe,
~2 h, which answers about half the held-out tasks) on a few hundred fresh oracle episodes,
and RL continues what SFT produced, with the env settings the SFT stage trained with. When
the SFT stage trains a model from scratch instead (`model.name: tiny`), that few-minute
policy learns the turn format but never answers correctly, so every RL group would have
equal outcomes and no outcome signal: RL then starts from `policy.path` of the RL config
(default `warm-start`, with the env settings its warm_start.json records), unless that is
empty. The world (size, seed) is always this run's, which no SFT stage saw.

Evaluation: the policies (before SFT when SFT continued a policy, RL's start, after RL) play
the same test-split tasks with the same sampling seeds (trainers.evaluation.paired,
`eval_samples` per task at the rollout temperature), and the report gives each headline
metric (pass@1, format-valid turn rate, answer rate) with task-clustered bootstrap SEs, the
paired change and its z, for RL (its start vs after RL), for the SFT stage and for both.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

# The default configs ship inside the package (setup.cfg package_data), so an installed
# `venus-gym demo` finds them without a source checkout.
_CONFIGS = files("trainers") / "configs"
DEFAULT_SFT_CONFIG = str(_CONFIGS / "demo_sft.yaml")
DEFAULT_RL_CONFIG = str(_CONFIGS / "demo_igpo.yaml")


@dataclass
class PipelineResult:
    report: Path
    before: dict[str, float]
    after: dict[str, float]
    seconds: dict[str, float]
    start_policy: str = ""
    comparison: dict[str, Any] = dataclasses.field(default_factory=dict)


DEMO_EVAL_SAMPLES = 2  # samples per held-out task in the paired evaluation
DEMO_EVAL_GROUPS_PER_CALL = 8  # held-out tasks played at once (shared engine calls)
WHY_WARM_START = ("the few-minute SFT policy of stage 3, trained from scratch, learns the turn "
                  "format but never answers correctly, so every RL group would have equal "
                  "outcomes and no outcome signal; the packaged warm start answers some "
                  "held-out tasks (pass@1 {pass1:.3f} ± {se:.3f} on worlds its SFT never saw, "
                  "its model card)")


def _stage(number: int, total: int, text: str) -> float:
    print(f"\n[{number}/{total}] {text}", flush=True)
    return time.perf_counter()


def run_pipeline(sft_config: Any, rl_config: Any, output_dir: str | Path,
                 log: bool = True, eval_samples: int = DEMO_EVAL_SAMPLES) -> PipelineResult:
    """Run every stage; `sft_config` is an SFTExperimentConfig, `rl_config` an RLConfig
    (both are copied and pointed at `output_dir`). RL starts from rl_config.policy.path
    (default `warm-start`), or from this run's SFT policy when that is empty (module
    docstring)."""
    import torch

    from trainers.data.oracle_data import (
        generate_oracle_trajectories,
        turn_histogram,
    )
    from trainers.evaluation.paired import HeldOut, compare, comparison_lines, paired_evaluate
    from trainers.evaluation.training_report import write_report
    from trainers.modeling.warm_start import policy_record, warm_start_info
    from trainers.rl.driver import train as train_rl
    from trainers.sft.config import config_to_dict
    from trainers.sft.pipeline import oracle_data_config, train_sft
    from trainers.trajectory import write_trajectories
    from venus_gym.worlds import load_world

    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    sft_config = dataclasses.replace(sft_config)
    rl_config = dataclasses.replace(rl_config)
    seconds: dict[str, float] = {}
    stages = 6
    if sft_config.train.threads_per_worker:
        torch.set_num_threads(sft_config.train.threads_per_worker)

    started = _stage(1, stages, f"world: {sft_config.env.world_size} pages, seed "
                                f"{sft_config.env.world_seed}")
    world = load_world("synthetic", n_pages=sft_config.env.world_size,
                       seed=sft_config.env.world_seed)
    world.save(output / "world")
    print(f"  {len(world.corpus)} pages, {len(world.tasks)} tasks -> {output / 'world'}")
    seconds["world"] = time.perf_counter() - started

    started = _stage(2, stages, f"oracle SFT data: {sft_config.data.num_episodes} episodes on "
                                f"the train split (mixture {sft_config.data.mixture!r})")
    # The same data settings as train_sft's own (world_seeds included): its tokenizer is
    # trained on the worlds this data comes from.
    trajectories = generate_oracle_trajectories(oracle_data_config(sft_config))
    data_path = output / "sft_data.jsonl"
    write_trajectories(data_path, trajectories)
    print(f"  {len(trajectories)} trajectories -> {data_path}; turns: "
          f"{turn_histogram(trajectories)}")
    seconds["data"] = time.perf_counter() - started

    # SFT continues a policy when its model is one that already plays the env (a policy
    # directory recording its env settings, as `warm-start` and every sft / rl output do).
    sft_init = sft_config.model.name
    continued = sft_init if policy_record(sft_init).get("env") else ""
    started = _stage(3, stages, f"SFT {'continuing ' + continued if continued else 'from scratch'}"
                                " (loss on the agent's own tokens)")
    sft_config.data = dataclasses.replace(sft_config.data, jsonl=str(data_path))
    sft_config.train = dataclasses.replace(sft_config.train, output_dir=str(output / "sft"))
    _, _, history = train_sft(sft_config)
    print(f"  {len(history)} steps, final loss {history[-1]['loss']:.3f} -> "
          f"{output / 'sft' / 'final'}")
    seconds["sft"] = time.perf_counter() - started

    start_policy, why, env_settings = _rl_start(rl_config, sft_config, output, warm_start_info,
                                                continued)
    started = _stage(4, stages, f"{rl_config.algorithm.name.upper()} from {start_policy}")
    print(f"  RL starts from {start_policy}: {why}")
    rl_config.policy = dataclasses.replace(rl_config.policy, path=start_policy)
    rl_config.env = dataclasses.replace(
        rl_config.env, world_size=sft_config.env.world_size,
        world_seed=sft_config.env.world_seed, **env_settings)
    rl_config.run = dataclasses.replace(rl_config.run, output_dir=str(output / "rl"))
    # The paired evaluation below replaces the driver's greedy one.
    rl_config.eval = dataclasses.replace(rl_config.eval, before=False, after=False)
    train_rl(rl_config)
    seconds["rl"] = time.perf_counter() - started

    held_out = [HeldOut(f"world {sft_config.env.world_seed} test", rl_config.env.kwargs(),
                        rl_config.eval.split, rl_config.eval.num_tasks)]
    policies = {"start": start_policy, "after RL": str(output / "rl" / "final")}
    # When SFT continued a policy (and RL, then, the SFT policy: _rl_start), that policy is
    # played too, so the report separates what SFT and what RL changed.
    before_sft = continued
    if before_sft:
        policies = {"before SFT": before_sft, **policies}
    started = _stage(5, stages, f"held-out evaluation: {', '.join(policies.values())} on the "
                                f"same {held_out[0].name} tasks, {eval_samples} samples each "
                                f"at temperature {rl_config.rollout.temperature}")
    runs = paired_evaluate(policies,
                           held_out, k=eval_samples, seed=rl_config.run.seed,
                           temperature=rl_config.rollout.temperature,
                           max_turn_tokens=rl_config.eval.max_turn_tokens,
                           max_context_tokens=rl_config.rollout.max_context_tokens,
                           threads=rl_config.policy.threads,
                           groups_per_call=DEMO_EVAL_GROUPS_PER_CALL)
    table = compare(runs["start"], runs["after RL"], seed=rl_config.run.seed)
    stage_tables = {}
    if before_sft:
        stage_tables = {"sft": compare(runs["before SFT"], runs["start"], seed=rl_config.run.seed),
                        "sft+rl": compare(runs["before SFT"], runs["after RL"],
                                          seed=rl_config.run.seed)}
    before, after = runs["start"].summary(), runs["after RL"].summary()
    seconds["eval"] = time.perf_counter() - started

    started = _stage(6, stages, "report")
    worse = [name for name, d in table.items() if d.worse]
    tasks = len(runs["start"].per_task)
    sft_from = f"continuing `{continued}`" if continued else "from scratch"
    start_name = "after SFT" if before_sft else "start"
    sections = [
        ("Starting policy", [f"RL started from `{start_policy}`: {why}.",
                             f"The SFT stage trained `{output / 'sft' / 'final'}` {sft_from} "
                             f"({len(trajectories)} oracle episodes, {len(history)} steps, "
                             f"final loss {history[-1]['loss']:.3f}); its loss curve is "
                             "sft/metrics.jsonl."]),
        ("Start vs after RL: paired, sampled held-out evaluation", [
            f"{tasks} tasks of {held_out[0].name}, {eval_samples} samples each at temperature "
            f"{rl_config.rollout.temperature}; both policies met the same tasks under the same "
            "sampling seeds. ± is the task-clustered bootstrap SE; the change's SE is paired "
            "(the same resampled tasks for both); z = change / SE. A metric with z < -2 is "
            "flagged as worse beyond noise.", "",
            *comparison_lines(table, start_name, "after RL"), "",
            ("Worse beyond noise: " + ", ".join(worse) + ".") if worse else
            "No headline metric got worse beyond noise."]),
    ]
    if before_sft:
        sections.append(("What each stage changed: the same tasks and seeds", [
            f"The SFT stage: `{before_sft}` (before SFT) against the SFT policy.", "",
            *comparison_lines(stage_tables["sft"], "before SFT", "after SFT"), "",
            "Both stages: before SFT against after RL.", "",
            *comparison_lines(stage_tables["sft+rl"], "before SFT", "after RL")]))
    comparison = {name: d.as_dict() for name, d in table.items()}
    by_stage = {stage: {name: d.as_dict() for name, d in t.items()}
                for stage, t in stage_tables.items()}
    report = write_report(output, metrics_path=output / "rl" / "metrics.jsonl",
                          before=before, after=after,
                          config={"sft": config_to_dict(sft_config), "rl": config_to_dict(rl_config),
                                  "seconds": seconds},
                          title=f"venus-gym demo: SFT, then {rl_config.algorithm.name} from "
                                f"{start_policy}",
                          sections=sections,
                          extra={"start_policy": start_policy, "start_policy_why": why,
                                 "sft_continued": continued, "paired": comparison,
                                 "paired_by_stage": by_stage, "eval_samples": eval_samples})
    seconds["report"] = time.perf_counter() - started
    if log:
        _print_summary(start_policy, why, {"RL": table, **stage_tables}, worse, report,
                       seconds)
    return PipelineResult(report, before, after, seconds, start_policy, comparison)


def _rl_start(rl_config: Any, sft_config: Any, output: Path, warm_start_info: Any,
              continued: str = "") -> tuple[str, str, dict[str, Any]]:
    """(policy RL starts from, why, env settings it needs) (module docstring). `continued`:
    the policy the SFT stage continued, empty when it trained from scratch."""
    sft_env = {"hops": tuple(sft_config.env.hops), "search_top_k": sft_config.env.search_top_k,
               "prompt_style": sft_config.env.prompt_style}
    if continued:
        return (str(output / "sft" / "final"), f"RL continues this run's SFT policy, which "
                f"continued `{continued}` on fresh oracle episodes (with the SFT stage's env "
                "settings; the RL config's policy.path is its default when run alone)", sft_env)
    if not rl_config.policy.path:
        return (str(output / "sft" / "final"), "the RL config's policy.path is empty, so RL "
                "continues this run's SFT policy (with the SFT stage's env settings)", sft_env)
    info = warm_start_info(rl_config.policy.path)
    if info is None:
        return (rl_config.policy.path, "the RL config's policy.path names it (the RL config's "
                "env settings apply)", {})
    env = {key: tuple(value) if isinstance(value, list) else value
           for key, value in info.get("env", {}).items()}
    results = info.get("results", {}).get("all")
    why = "the RL config's policy.path names it"
    if rl_config.policy.path == "warm-start" and results:
        pass1, se = results["pass@1"]
        why = WHY_WARM_START.format(pass1=pass1, se=se)
    return rl_config.policy.path, why + f" (its SFT env settings apply: {info['env']})", env


def _print_summary(start_policy: str, why: str, tables: dict[str, dict[str, Any]],
                   worse: list[str], report: Path, seconds: dict[str, float]) -> None:
    print(f"\nRL started from {start_policy}: {why}.")
    headers = {"RL": ("start", "after RL"), "sft": ("before SFT", "after SFT"),
               "sft+rl": ("before SFT", "after RL")}
    for stage, table in tables.items():
        a, b = headers[stage]
        print(f"held-out tasks (paired, sampled)  {a:<15} {b:<15} change (SE)      z")
        for name, d in table.items():
            flag = "   WORSE beyond noise" if d.worse else ""
            print(f"  {name:<20}{d.a:>10.3f} ± {d.a_se:.3f}{d.b:>10.3f} ± {d.b_se:.3f}"
                  f"{d.diff:>+10.3f} ± {d.diff_se:.3f}{d.z:>+7.2f}{flag}")
    print("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()))
    print(f"\nreport: {report}  (curves: {report.parent / 'curves.png'})")


def main(argv: list[str] | None = None) -> int:
    import argparse

    from trainers.rl.config import load_rl_config
    from trainers.sft.config import load_config

    parser = argparse.ArgumentParser(description="venus-gym main job: SFT then RL on the "
                                                 "embedded world, with a report")
    parser.add_argument("--sft-config", default=DEFAULT_SFT_CONFIG)
    parser.add_argument("--rl-config", default=DEFAULT_RL_CONFIG)
    parser.add_argument("--output", default="runs/demo")
    args = parser.parse_args(argv)
    for path in (args.sft_config, args.rl_config):
        if not Path(path).is_file():
            parser.error(f"config file {path!r} not found (the defaults are "
                         f"{DEFAULT_SFT_CONFIG} and {DEFAULT_RL_CONFIG}, shipped with the "
                         f"package)")
    run_pipeline(load_config(args.sft_config), load_rl_config(args.rl_config), args.output)
    return 0
