"""Does RL learn from its rewards? IGPO vs the start and vs a placebo, on paired held-out tasks.

    python benchmarks/learning_check.py --seed 0          # IGPO + placebo (results.md: its time)
    python benchmarks/learning_check.py --seed 1 --arms igpo grpo --output runs/lc1
    python benchmarks/learning_check.py --arms grpo --trained igpo=runs/learning_check/igpo/final
    python benchmarks/learning_check.py --arms --trained igpo=DIR placebo=DIR --eval-temperature 0.5
    python benchmarks/learning_check.py --arms --trained igpo@16=RUN/igpo/checkpoint-000016/policy
    python benchmarks/learning_check.py --seed 1 --arms placebo --train-only --output runs/lc1
    python benchmarks/learning_check.py --seed 2 --set algorithm.options.loss.kl_coef=0.01

From the packaged warm start (`warm-start`, trainers/warm_start/README.md, or --policy):

1. IGPO for --steps steps with benchmarks/configs/learning_check_igpo.yaml (run.seed = --seed);
2. the placebo: the same config and seed with algorithm.options.placebo on (each
   trajectory's advantages times a random sign: the same step sizes, clipping and KL, no
   signal; docs/algorithms.md);
   (--arms igpo placebo grpo adds GRPO: outcome-only advantages, the same loss settings;
   --arms ... sft adds the equal-time baseline: the start continued by SFT on fresh oracle
   episodes of worlds no other stage uses, benchmarks/configs/learning_check_sft.yaml, for
   the IGPO arm's wall time, data included (or --sft-seconds);
   --trained ARM=DIR plays a policy an earlier check of the same config and seed trained,
   instead of training that arm again; ARM@STEP=DIR plays an arm's checkpoint, exported
   with `venus-gym export-policy`, beside it: a held-out learning curve);
3. the start and every trained policy play the same held-out tasks with
   the same sampling seeds (trainers.evaluation.paired): test-split tasks of the RL world (or
   of --held-out-world) and of a validation world (--validation-world) that neither RL nor
   the warm start's SFT used (--num-tasks of each; 0 = all), --k samples per task at the
   rollout temperature (or --eval-temperature: roll out at one temperature, play the
   held-out tasks at another);
4. paired differences with task-clustered bootstrap SEs, overall and per held-out split
   (RL's test split shares its world's names with the questions RL trained on; the
   validation world shares nothing).

Prints the three policies' numbers, the paired tables, and

    RESULT format_valid_gain_z=   (IGPO - start) / paired SE, format-valid turn rate
    RESULT placebo_gap_z=         (IGPO - placebo) / paired SE, format-valid turn rate
    RESULT pass1_start=  RESULT pass1_igpo=  RESULT pass1_placebo=
    RESULT pass1_gain_z=          (IGPO - start) / paired SE, pass@1
    RESULT placebo_gap_pass1_z=   (IGPO - placebo) / paired SE, pass@1
    RESULT worst_metric_z=        the lowest IGPO-vs-start z of the headline metrics (pass@1,
                                  format-valid, answer rate): below -1 = something got worse
    RESULT igpo_vs_grpo_pass1_z= / igpo_vs_grpo_format_valid_rate_z=   (with the grpo arm)
    RESULT igpo_vs_sft_pass1_z= / igpo_vs_sft_format_valid_rate_z=     (with the sft arm)
    RESULT browse_ratio_{correct,wrong}_{start,igpo}=   DR-Venus's tool-use analysis: visit
                                  turns / tool turns of correct and wrong episodes
    RESULT wall_s=                the whole check's wall time

and writes results.json / results.md under --output. The baseline of every number is
measured in the same run: the start and the placebo are played on the same tasks and seeds.
Reading it: learning shows when format_valid_gain_z and placebo_gap_z are both clearly
positive (> 2) on several seeds; a placebo that gains as much says the gain came from the
update's mechanics (e.g. entropy falling), not from the rewards.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from rl_checks import (
    ARMS,
    SFT_ARM,
    add_jobs_argument,
    evaluate_arms,
    failure_counts,
    failure_lines,
    outcome_spread,
    parse_named_dirs,
    report_lines,
    resolve_jobs,
    save_played,
    split_lines,
    split_tables,
    task_outcomes,
    train_arms,
    train_sft_arm,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "benchmarks" / "configs" / "learning_check_igpo.yaml"
DEFAULT_SFT_CONFIG = REPO / "benchmarks" / "configs" / "learning_check_sft.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0,
                        help="RL run seed (both runs) and the evaluation's sampling seed")
    parser.add_argument("--steps", type=int, default=None,
                        help="RL steps per run (default: the config's run.steps)")
    parser.add_argument("--k", type=int, default=2, help="samples per held-out task")
    parser.add_argument("--num-tasks", type=int, default=0,
                        help="tasks per held-out split, from its start (0 = all: 46 of world "
                             "0's test split, 53 of the validation world's)")
    parser.add_argument("--arms", nargs="*", default=["igpo", "placebo"],
                        help="igpo, placebo, grpo (grpo: outcome-only advantages, the same "
                             "loss), sft (more SFT for the IGPO arm's wall time)")
    parser.add_argument("--trained", nargs="*", default=[], metavar="ARM=DIR",
                        help="arms trained by an earlier check (same config and seed): their "
                             "final policy directories are played, not trained again; "
                             "ARM@STEP=DIR names an arm's exported checkpoint")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (config: learner.lr)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="rollout and evaluation temperature (config: rollout.temperature)")
    parser.add_argument("--eval-temperature", type=float, default=None,
                        help="the held-out evaluation's temperature when it differs from the "
                             "rollouts' (default: the rollout temperature)")
    parser.add_argument("--groups-per-call", type=int, default=16,
                        help="tasks played at once in the evaluation (shared engine calls; "
                             "the same episodes at any width; 16 measured fastest on 2 "
                             "cores: benchmarks/eval_batching.py)")
    parser.add_argument("--validation-world", type=int, default=45,
                        help="a world seed neither RL nor the warm start's SFT used")
    parser.add_argument("--held-out-world", type=int, default=None,
                        help="the world whose test split is the first held-out set (default: "
                             "the RL world, env.world_seed; another one makes both sets "
                             "worlds RL never played)")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a dotted override of the RL config, as after `venus-gym rl "
                             "--config`, e.g. --set algorithm.options.loss.kl_coef=0.01 "
                             "(repeatable; every arm gets it)")
    parser.add_argument("--sft-config", default=str(DEFAULT_SFT_CONFIG),
                        help="the sft arm's SFT config (its model is replaced by the start)")
    parser.add_argument("--sft-seconds", type=float, default=None,
                        help="the sft arm's wall time (default: the IGPO arm's in this run; "
                             "needed when IGPO is not trained here)")
    parser.add_argument("--policy", default=None,
                        help="the starting policy (default: the config's policy.path, "
                             "warm-start)")
    parser.add_argument("--train-only", action="store_true",
                        help="train the --arms and stop; play them later with --arms "
                             "--trained ARM=DIR (e.g. each arm in its own process on a GPU)")
    parser.add_argument("--output", default="runs/learning_check")
    add_jobs_argument(parser)
    args = parser.parse_args(argv)
    jobs = resolve_jobs(args.jobs)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started_all = time.perf_counter()

    from trainers.evaluation.paired import HeldOut
    from trainers.modeling.warm_start import warm_start_info
    from trainers.rl.config import load_rl_config
    from trainers.run_log import read_metrics

    base = load_rl_config(args.config, args.set)
    if args.policy:
        base.policy.path = args.policy
    if args.steps:
        base.run = dataclasses.replace(base.run, steps=args.steps)
    if args.lr is not None:
        base.learner = dataclasses.replace(base.learner, lr=args.lr)
    if args.temperature is not None:
        base.rollout = dataclasses.replace(base.rollout, temperature=args.temperature)
    base.run = dataclasses.replace(base.run, seed=args.seed)
    eval_temperature = check_eval_temperature(args.eval_temperature, base.rollout.temperature)
    if not args.arms and not args.trained:
        raise SystemExit("nothing to compare: give --arms to train or --trained ARM=DIR to play")
    if args.train_only and (not args.arms or args.trained):
        raise SystemExit("--train-only trains the --arms and plays nothing: give --arms, "
                         "and --trained only to the check that plays them")
    base.eval = dataclasses.replace(base.eval, before=False, after=False)
    info = warm_start_info(base.policy.path)
    used = {base.env.world_seed} | set((info or {}).get("sft_world_seeds", []))
    if args.validation_world in used:
        raise SystemExit(f"--validation-world {args.validation_world} was used in training "
                         f"(RL world {base.env.world_seed}, SFT worlds "
                         f"{sorted(used - {base.env.world_seed})}): pick another")
    held_out_world = check_held_out_world(args.held_out_world, base.env.world_seed,
                                          args.validation_world, info)
    rl_arms = [arm for arm in args.arms if arm != SFT_ARM]
    if SFT_ARM in args.arms:
        check_sft_arm(args, base.env.world_seed, "igpo" in rl_arms, held_out_world)
    if base.learner.sft_coef > 0:
        check_sft_worlds(base.learner.sft_config, "the SFT loss mixed into RL",
                         base.env.world_seed, args.validation_world, held_out_world)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    print(f"start: {base.policy.path}; {', '.join(args.arms) or 'nothing trained here'}: "
          f"{base.run.steps} steps x "
          f"{base.rollout.queries_per_step} queries x G={base.rollout.group_size}, lr "
          f"{base.learner.lr}, temperature {base.rollout.temperature} (evaluation "
          f"{eval_temperature}), seed {args.seed}"
          + (f"; overrides {' '.join(args.set)}" if args.set else ""), flush=True)

    trained = parse_trained(args.trained, args.arms)
    finals, seconds, histories = train_arms(base, rl_arms, args.seed, output, jobs=jobs)
    sft_history: list[dict[str, Any]] = []
    if SFT_ARM in args.arms:
        budget = args.sft_seconds if args.sft_seconds is not None else seconds["igpo"]
        finals[SFT_ARM], seconds[SFT_ARM], sft_history = train_sft_arm(
            base.policy.path, args.sft_config, budget, args.seed, output,
            threads=sft_threads(base.policy.threads, jobs, len(rl_arms)))
    if args.train_only:
        played = " ".join(f"{arm}={path}" for arm, path in finals.items())
        print(f"trained ({', '.join(f'{a} {s:.0f} s' for a, s in seconds.items())}); play "
              f"them with: --seed {args.seed} --arms --trained {played}", flush=True)
        return 0
    for arm, path in trained.items():
        finals[arm] = path
        metrics = Path(path).parent / "metrics.jsonl"  # the run's log, when it is there
        if metrics.is_file() and arm != SFT_ARM:  # an SFT run's log has no RL step metrics
            histories[arm] = read_metrics(metrics)
    env = base.env.kwargs()
    held_out = [HeldOut(f"world {held_out_world} test", {**env, "world_seed": held_out_world},
                        "test", args.num_tasks),
                HeldOut(f"world {args.validation_world} test",
                        {**env, "world_seed": args.validation_world}, "test", args.num_tasks)]
    runs, tables = evaluate_arms(base, finals, held_out, k=args.k, seed=args.seed,
                                 temperature=eval_temperature,
                                 groups_per_call=args.groups_per_call, seconds=seconds,
                                 jobs=jobs)
    seconds["total"] = time.perf_counter() - started_all
    save_played(runs, output / "played")  # first: the episodes outlive any report error
    tasks = len(runs["start"].per_task)
    lines = report_lines(
        f"Learning check, seed {args.seed}",
        f"Start `{base.policy.path}`; {base.run.steps} RL steps per arm x "
        f"{base.rollout.queries_per_step} queries x G={base.rollout.group_size}; {tasks} "
        f"held-out tasks ({', '.join(h.name for h in held_out)}) x k={args.k} at "
        f"temperature {eval_temperature} (RL rollouts at {base.rollout.temperature}), the same tasks and sampling seeds for "
        "every policy; ± bootstrap SE over tasks.", histories, tables)
    browse = browse_ratios(runs)
    lines += ["## Tool use: browse ratio (visit turns / tool turns) of correct and wrong "
              "episodes", "", "| policy | correct | wrong | episodes correct / wrong |",
              "| --- | ---: | ---: | ---: |"]
    lines += [f"| {name} | {b['browse_ratio_correct']:.3f} | {b['browse_ratio_wrong']:.3f} | "
              f"{b['num_correct']:.0f} / {b['num_wrong']:.0f} |" for name, b in browse.items()]
    by_split = split_tables(runs, list(finals), args.seed)
    lines += ["", "## By held-out split", "", *split_lines(by_split)]
    failures = failure_counts(runs)
    lines += ["", "## Where episodes went wrong", "",
              "Wrong episodes by whether a tool response they read held the gold answer "
              "(a copy or choice error at the end) or none did (the search or the chain "
              "went astray):", "", *failure_lines(failures)]
    outcomes = task_outcomes(runs)
    lines += ["", f"## Tasks by outcome over their k={args.k} samples", "",
              "| policy | all solved | none | mixed |", "| --- | ---: | ---: | ---: |"]
    for name, per_task in outcomes["outcomes"].items():
        spread = outcome_spread(per_task)
        lines.append(f"| {name} | {spread['all']} | {spread['none']} | {spread['mixed']} |")
    if sft_history:
        lines += ["", f"The sft arm: {len(sft_history)} SFT steps on fresh oracle episodes "
                  f"({args.sft_config}), loss {sft_history[0]['loss']:.3f} -> "
                  f"{sft_history[-1]['loss']:.3f}."]
    lines += ["", "time: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()), ""]
    text = "\n".join(lines)
    (output / "results.md").write_text(text)
    (output / "results.json").write_text(json.dumps({
        "seed": args.seed, "steps": base.run.steps, "lr": base.learner.lr, "k": args.k,
        "config": args.config, "overrides": args.set,
        "temperature": base.rollout.temperature, "eval_temperature": eval_temperature,
        "tasks": tasks, "tables": {t: {m: d.as_dict() for m, d in table.items()}
                                   for t, table in tables.items()},
        "history": histories, "sft_history": sft_history, "seconds": seconds,
        "by_split": {split: {arm: d.as_dict() for arm, d in row.items()}
                     for split, row in by_split.items()},
        "per_task": outcomes, "failure_modes": failures},
        indent=2, default=str))
    print("\n" + text)
    for arm in finals:
        gain = tables[f"{arm} vs start"]
        print(f"RESULT pass1_{arm}={gain['pass@1'].b:.3f}")
        print(f"RESULT {arm}_format_valid_gain_z={gain['format_valid_rate'].z:.2f}")
        print(f"RESULT {arm}_pass1_gain_z={gain['pass@1'].z:.2f}")
    print(f"RESULT pass1_start={next(iter(tables.values()))['pass@1'].a:.3f}")
    if "igpo" in finals:
        print(f"RESULT format_valid_gain_z={tables['igpo vs start']['format_valid_rate'].z:.2f}")
        print(f"RESULT pass1_gain_z={tables['igpo vs start']['pass@1'].z:.2f}")
        headline = tables["igpo vs start"]
        print(f"RESULT worst_metric_z={min(d.z for d in headline.values()):.2f}")
        if "placebo" in finals:
            print(f"RESULT placebo_gap_z="
                  f"{tables['igpo vs placebo']['format_valid_rate'].z:.2f}")
            print(f"RESULT placebo_gap_pass1_z={tables['igpo vs placebo']['pass@1'].z:.2f}")
        for other in ("grpo", SFT_ARM):
            if other in finals:
                for metric in ("pass@1", "format_valid_rate"):
                    print(f"RESULT igpo_vs_{other}_{metric.replace('@', '')}_z="
                          f"{tables[f'igpo vs {other}'][metric].z:.2f}")
    for name in ("start", "igpo"):
        for which in ("correct", "wrong"):
            if name in browse:
                print(f"RESULT browse_ratio_{which}_{name}="
                      f"{browse[name][f'browse_ratio_{which}']:.3f}")
    print(f"RESULT wall_s={seconds['total']:.0f}")
    return 0


def sft_threads(rl_threads: int, jobs: int, rl_arms: int) -> int | None:
    """The sft arm's torch threads: those an RL arm had when the arms trained side by side
    (its budget is the IGPO arm's wall time, so it gets what IGPO had), else the SFT
    config's own."""
    from trainers.backends import threads_per_process

    if jobs <= 1 or rl_arms <= 1:
        return None
    return threads_per_process(rl_threads, min(jobs, rl_arms))


def check_eval_temperature(value: float | None, rollout_temperature: float) -> float:
    """The evaluation temperature: the rollouts' unless given; refused unless finite and > 0."""
    if value is None:
        return rollout_temperature
    if not math.isfinite(value) or value <= 0:
        raise SystemExit(f"--eval-temperature must be a finite number > 0, got {value}")
    return value


def check_held_out_world(world: int | None, rl_world: int, validation_world: int,
                         info: dict[str, Any] | None) -> int:
    """The first held-out set's world: the RL world unless given; refused when it is an SFT
    world of the start or the validation world (the two sets would be one)."""
    if world is None:
        return rl_world
    sft_worlds = set((info or {}).get("sft_world_seeds", []))
    if world in sft_worlds:
        raise SystemExit(f"--held-out-world {world} is one of the start's SFT worlds "
                         f"{sorted(sft_worlds)}: pick another")
    if world == validation_world:
        raise SystemExit(f"--held-out-world {world} is the validation world too: pick "
                         "another for one of them")
    return world


def parse_trained(pairs: list[str], arms: list[str]) -> dict[str, str]:
    """--trained ARM=DIR or ARM@STEP=DIR pairs (an arm's checkpoint at a step, e.g. igpo@16)
    as {name: policy directory}, refused with the reason when an arm is unknown, a step not
    a whole number, a name given twice or also trained here, or its directory is missing."""
    known = (*ARMS, SFT_ARM)
    for pair in pairs:
        arm, at, step = pair.partition("=")[0].partition("@")
        if arm not in known or (at and not step.isdigit()):
            raise SystemExit(f"--trained takes ARM=DIR or ARM@STEP=DIR with ARM one of {known} "
                             f"and STEP a whole number, got {pair!r}")
    return parse_named_dirs(pairs, "--trained", label="ARM",
                            taken={arm: "in --arms" for arm in arms}, saved_policy=True)


def check_sft_arm(args: argparse.Namespace, rl_world: int, igpo_trained_here: bool,
                  held_out_world: int | None = None) -> None:
    """Refuse an sft arm that would train on a world RL or the evaluation plays, or that has
    no time budget (IGPO trained elsewhere and no --sft-seconds), before anything runs."""
    if args.sft_seconds is None and not igpo_trained_here:
        raise SystemExit("the sft arm gets the IGPO arm's wall time, but IGPO is not trained "
                         "in this run: give --sft-seconds")
    if args.sft_seconds is not None and not args.sft_seconds > 0:
        raise SystemExit(f"--sft-seconds must be > 0, got {args.sft_seconds}")
    check_sft_worlds(args.sft_config, "the sft arm", rl_world, args.validation_world,
                     held_out_world)


def check_sft_worlds(sft_config: str, what: str, rl_world: int, validation_world: int,
                     held_out_world: int | None = None) -> None:
    """Refuse SFT data (the sft arm's, or the SFT loss mixed into RL: learner.sft_config)
    from a world RL or the evaluation plays."""
    from trainers.sft.config import load_config

    worlds = set(load_config(sft_config).oracle_worlds())
    played = {validation_world, rl_world if held_out_world is None else held_out_world}
    clash = worlds & ({rl_world} | played)
    if clash:
        raise SystemExit(f"{sft_config}: {what}'s worlds {sorted(worlds)} include "
                         f"{sorted(clash)}, which RL (world {rl_world}) or the evaluation "
                         f"(worlds {sorted(played)}) plays: pick others")


def browse_ratios(runs: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per played policy: the browse ratio of its correct and wrong episodes and how many
    of each (trainers.evaluation.metrics.trajectory_stats)."""
    from trainers.evaluation.metrics import trajectory_stats

    keys = ("browse_ratio_correct", "browse_ratio_wrong", "num_correct", "num_wrong")
    return {name: {key: trajectory_stats([t for g in run.per_task for t in g])[key]
                   for key in keys} for name, run in runs.items()}


if __name__ == "__main__":
    raise SystemExit(main())
