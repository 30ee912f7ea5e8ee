"""Does RL learn from its rewards? IGPO vs the start and vs a placebo, on paired held-out tasks.

    python benchmarks/learning_check.py --seed 0          # ~37 min on 2 idle cores (its time: line splits it)
    python benchmarks/learning_check.py --seed 1 --steps 10 --k 2 --output runs/lc1

From the packaged warm start (`warm-start`, trainers/warm_start/README.md, or --policy):

1. IGPO for --steps steps with benchmarks/configs/learning_check_igpo.yaml (run.seed = --seed);
2. the placebo: the same config and seed with algorithm.options.placebo on (each
   trajectory's advantages times a random sign: the same step sizes, clipping and KL, no
   signal; docs/algorithms.md);
3. the start, the IGPO policy and the placebo policy each play the same held-out tasks with
   the same sampling seeds (trainers.evaluation.paired): test-split tasks of the RL world and of
   a validation world (--validation-world) that neither RL nor the warm start's SFT used
   (--num-tasks of each; 0 = all), --k samples per task at temperature 1.0;
4. paired differences with task-clustered bootstrap SEs.

Prints the three policies' numbers, the paired tables, and

    RESULT format_valid_gain_z=   (IGPO - start) / paired SE, format-valid turn rate
    RESULT placebo_gap_z=         (IGPO - placebo) / paired SE, format-valid turn rate
    RESULT pass1_start=  RESULT pass1_igpo=  RESULT pass1_placebo=
    RESULT pass1_gain_z=          (IGPO - start) / paired SE, pass@1

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
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "benchmarks" / "configs" / "learning_check_igpo.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0,
                        help="RL run seed (both runs) and the evaluation's sampling seed")
    parser.add_argument("--steps", type=int, default=None,
                        help="RL steps per run (default: the config's run.steps)")
    parser.add_argument("--k", type=int, default=2, help="samples per held-out task")
    parser.add_argument("--num-tasks", type=int, default=12,
                        help="tasks per held-out split, from its start (0 = all 46 + 53: "
                             "~4x the evaluation time; one policy plays a task's 2 samples "
                             "in ~15 s on 2 cores)")
    parser.add_argument("--validation-world", type=int, default=45,
                        help="a world seed neither RL nor the warm start's SFT used")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--policy", default=None,
                        help="the starting policy (default: the config's policy.path, "
                             "warm-start)")
    parser.add_argument("--output", default="runs/learning_check")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    from trainers.evaluation.paired import HeldOut, compare, comparison_lines, paired_evaluate
    from trainers.modeling.warm_start import warm_start_info
    from trainers.rl.config import load_rl_config
    from trainers.rl.driver import train

    base = load_rl_config(args.config)
    if args.policy:
        base.policy.path = args.policy
    if args.steps:
        base.run = dataclasses.replace(base.run, steps=args.steps)
    base.run = dataclasses.replace(base.run, seed=args.seed)
    base.eval = dataclasses.replace(base.eval, before=False, after=False)
    info = warm_start_info(base.policy.path)
    used = {base.env.world_seed} | set((info or {}).get("sft_world_seeds", []))
    if args.validation_world in used:
        raise SystemExit(f"--validation-world {args.validation_world} was used in training "
                         f"(RL world {base.env.world_seed}, SFT worlds "
                         f"{sorted(used - {base.env.world_seed})}): pick another")
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    print(f"start: {base.policy.path}; IGPO and placebo: {base.run.steps} steps x "
          f"{base.rollout.queries_per_step} queries x G={base.rollout.group_size}, lr "
          f"{base.learner.lr}, seed {args.seed}", flush=True)

    seconds: dict[str, float] = {}
    finals = {}
    for name, placebo in (("igpo", False), ("placebo", True)):
        config = dataclasses.replace(base)
        options = dict(base.algorithm.options)
        if placebo:
            options.update(placebo=True, placebo_seed=args.seed)
        config.algorithm = dataclasses.replace(base.algorithm, options=options)
        config.run = dataclasses.replace(base.run, output_dir=str(output / name))
        started = time.perf_counter()
        result = train(config)
        seconds[name] = time.perf_counter() - started
        rewards = [round(h["reward"], 3) for h in result.history]
        print(f"{name}: {seconds[name]:.0f} s, training reward per step {rewards}",
              flush=True)
        finals[name] = str(output / name / "final")

    env = base.env.kwargs()
    held_out = [HeldOut(f"world {base.env.world_seed} test", env, "test", args.num_tasks),
                HeldOut(f"world {args.validation_world} test",
                        {**env, "world_seed": args.validation_world}, "test", args.num_tasks)]
    started = time.perf_counter()
    runs = paired_evaluate({"start": base.policy.path, **finals}, held_out, k=args.k,
                           seed=args.seed, temperature=1.0,
                           max_turn_tokens=base.rollout.max_turn_tokens,
                           max_context_tokens=base.rollout.max_context_tokens,
                           threads=base.policy.threads)
    seconds["eval"] = time.perf_counter() - started
    gain = compare(runs["start"], runs["igpo"], seed=args.seed)
    gap = compare(runs["placebo"], runs["igpo"], seed=args.seed)
    placebo_gain = compare(runs["start"], runs["placebo"], seed=args.seed)

    tasks = len(runs["start"].per_task)
    lines = [f"# Learning check, seed {args.seed}", "",
             f"Start `{base.policy.path}`; {base.run.steps} RL steps per run; {tasks} held-out "
             f"tasks ({', '.join(h.name for h in held_out)}) x k={args.k} at temperature 1.0, "
             "the same tasks and sampling seeds for every policy; ± bootstrap SE over tasks.",
             "", "## IGPO vs start", "", *comparison_lines(gain, "start", "IGPO"),
             "", "## IGPO vs placebo", "", *comparison_lines(gap, "placebo", "IGPO"),
             "", "## Placebo vs start", "", *comparison_lines(placebo_gain, "start", "placebo"),
             "", "time: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()), ""]
    text = "\n".join(lines)
    (output / "results.md").write_text(text)
    (output / "results.json").write_text(json.dumps({
        "seed": args.seed, "steps": base.run.steps, "k": args.k, "tasks": tasks,
        "igpo_vs_start": {m: d.as_dict() for m, d in gain.items()},
        "igpo_vs_placebo": {m: d.as_dict() for m, d in gap.items()},
        "placebo_vs_start": {m: d.as_dict() for m, d in placebo_gain.items()},
        "seconds": seconds}, indent=2))
    print("\n" + text)
    print(f"RESULT format_valid_gain_z={gain['format_valid_rate'].z:.2f}")
    print(f"RESULT placebo_gap_z={gap['format_valid_rate'].z:.2f}")
    print(f"RESULT pass1_start={gain['pass@1'].a:.3f}")
    print(f"RESULT pass1_igpo={gain['pass@1'].b:.3f}")
    print(f"RESULT pass1_placebo={gap['pass@1'].a:.3f}")
    print(f"RESULT pass1_gain_z={gain['pass@1'].z:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
