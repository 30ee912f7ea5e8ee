"""The main job: world -> oracle SFT data -> SFT warm start -> IGPO -> evaluation -> report.

    venus-gym demo                                  # the embedded default, on CPU
    venus-gym demo --sft-config my_sft.yaml --rl-config my_rl.yaml --output runs/mine

Each stage writes under the output directory, so every artefact can be inspected or reused:

    world/            the generated world (corpus.jsonl, tasks.jsonl, world.json)
    sft_data.jsonl    oracle trajectories on the train split (the SFT data)
    sft/final/        the warm-start model and tokenizer (sft/metrics.jsonl: its loss curve)
    rl/               IGPO: metrics.jsonl, samples/, checkpoints, final/ model, eval.json
    report.md         accuracy before / after RL on held-out tasks, format errors, browse
                      ratio of correct vs wrong trajectories; curves.png; report.json

The RL config's `policy.path` and the world settings (world size and seed, hops, search
width) are filled in from the SFT stage, so the RL policy plays the world it was trained
on; turn and context budgets stay the RL config's own.
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


def _stage(number: int, total: int, text: str) -> float:
    print(f"\n[{number}/{total}] {text}", flush=True)
    return time.perf_counter()


def run_pipeline(sft_config: Any, rl_config: Any, output_dir: str | Path,
                 log: bool = True) -> PipelineResult:
    """Run every stage; `sft_config` is an SFTExperimentConfig, `rl_config` an RLConfig
    (both are copied and pointed at `output_dir`)."""
    import torch

    from trainers.data.oracle_data import (
        generate_oracle_trajectories,
        turn_histogram,
    )
    from trainers.rl.driver import train as train_rl
    from trainers.rl.report import write_report
    from trainers.sft.config import config_to_dict
    from trainers.sft.pipeline import oracle_data_config, train_sft
    from trainers.trajectory import write_trajectories
    from venus_gym.worlds import load_world

    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    sft_config = dataclasses.replace(sft_config)
    rl_config = dataclasses.replace(rl_config)
    seconds: dict[str, float] = {}
    if sft_config.train.threads_per_worker:
        torch.set_num_threads(sft_config.train.threads_per_worker)

    started = _stage(1, 5, f"world: {sft_config.env.world_size} pages, seed "
                           f"{sft_config.env.world_seed}")
    world = load_world("synthetic", n_pages=sft_config.env.world_size,
                       seed=sft_config.env.world_seed)
    world.save(output / "world")
    print(f"  {len(world.corpus)} pages, {len(world.tasks)} tasks -> {output / 'world'}")
    seconds["world"] = time.perf_counter() - started

    started = _stage(2, 5, f"oracle SFT data: {sft_config.data.num_episodes} episodes on the "
                           f"train split (mixture {sft_config.data.mixture!r})")
    # The same data settings as train_sft's own (world_seeds included): its tokenizer is
    # trained on the worlds this data comes from.
    trajectories = generate_oracle_trajectories(oracle_data_config(sft_config))
    data_path = output / "sft_data.jsonl"
    write_trajectories(data_path, trajectories)
    print(f"  {len(trajectories)} trajectories -> {data_path}; turns: "
          f"{turn_histogram(trajectories)}")
    seconds["data"] = time.perf_counter() - started

    started = _stage(3, 5, "SFT warm start (loss on the agent's own tokens)")
    sft_config.data = dataclasses.replace(sft_config.data, jsonl=str(data_path))
    sft_config.train = dataclasses.replace(sft_config.train, output_dir=str(output / "sft"))
    _, _, history = train_sft(sft_config)
    print(f"  {len(history)} steps, final loss {history[-1]['loss']:.3f} -> "
          f"{output / 'sft' / 'final'}")
    seconds["sft"] = time.perf_counter() - started

    started = _stage(4, 5, f"{rl_config.algorithm.name.upper()} from the SFT checkpoint, "
                           "evaluated on held-out tasks before and after")
    rl_config.policy = dataclasses.replace(rl_config.policy, path=str(output / "sft" / "final"))
    rl_config.env = dataclasses.replace(
        rl_config.env, world_size=sft_config.env.world_size,
        world_seed=sft_config.env.world_seed, hops=tuple(sft_config.env.hops),
        search_top_k=sft_config.env.search_top_k, prompt_style=sft_config.env.prompt_style)
    rl_config.run = dataclasses.replace(rl_config.run, output_dir=str(output / "rl"))
    result = train_rl(rl_config)
    seconds["rl"] = time.perf_counter() - started

    started = _stage(5, 5, "report")
    report = write_report(output, metrics_path=output / "rl" / "metrics.jsonl",
                          before=result.before, after=result.after,
                          config={"sft": config_to_dict(sft_config), "rl": config_to_dict(rl_config),
                                  "seconds": seconds},
                          title=f"venus-gym demo: SFT -> {rl_config.algorithm.name}")
    seconds["report"] = time.perf_counter() - started
    if log:
        _print_summary(result.before, result.after, report, seconds)
    return PipelineResult(report, result.before, result.after, seconds)


def _print_summary(before: dict[str, float], after: dict[str, float], report: Path,
                   seconds: dict[str, float]) -> None:
    print("\nheld-out tasks        SFT      after RL")
    for key in ("pass@1", "format_error_rate", "browse_ratio_correct", "browse_ratio_wrong",
                "mean_turns"):
        print(f"  {key:<20}{before.get(key, float('nan')):>7.3f}  {after.get(key, float('nan')):>10.3f}")
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
