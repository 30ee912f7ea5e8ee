"""Processes or threads: how the learning and fit checks should use a small machine's cores.

    python benchmarks/parallel_checks.py                 # 2 RL steps per arm, 32 tasks x k 2
    python benchmarks/parallel_checks.py --steps 1 --tasks 16 --jobs 2

The checks (benchmarks/learning_check.py, benchmarks/fit_check.py) train two RL arms from one
start and then play every policy on the same held-out tasks. With `--jobs N` they train the
arms side by side, one process each with policy.threads // N torch threads, and deal the
tasks out to N processes (trainers.evaluation.paired.paired_evaluate); with `--jobs 1`, one
process does it all with policy.threads threads. The policy is small (hidden size 128), so
a matrix product is too short for two intra-op threads to halve it, while two processes each
keep a core busy. Both ways give the same runs and episodes: checked here on every step's
metrics and every token id.

The learning check's config (benchmarks/configs/learning_check_igpo.yaml), here:
1. IGPO and its placebo for --steps steps, one after the other (the baseline), then side by
   side (the candidate);
2. the packaged warm start plays the first --tasks tasks of world 0's test split, k samples
   each, in one process (the baseline), then dealt out to --jobs processes.
Prints each run's seconds and

    RESULT arms_speedup=<float>   one after the other / side by side, seconds
    RESULT eval_speedup=<float>   one process / --jobs processes, seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "configs" / "learning_check_igpo.yaml"
STEP_KEYS = ("accuracy", "format_error_rate", "kl", "policy_loss", "grad_norm")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="RL steps per arm")
    parser.add_argument("--tasks", type=int, default=32, help="tasks of world 0's test split")
    parser.add_argument("--k", type=int, default=2, help="samples per task")
    parser.add_argument("--jobs", type=int, default=2, help="processes of the candidate")
    parser.add_argument("--seed", type=int, default=0, help="the runs' and evaluation's seed")
    args = parser.parse_args(argv)
    if min(args.steps, args.tasks, args.k) < 1 or args.jobs < 2:
        raise SystemExit("--steps, --tasks and --k must be >= 1 and --jobs >= 2")

    sys.path.insert(0, str(HERE))  # rl_checks, the checks' shared code
    from rl_checks import train_arms

    from trainers.evaluation.paired import HeldOut, paired_evaluate
    from trainers.rl.config import load_rl_config

    config = load_rl_config(str(CONFIG))
    config.run = dataclasses.replace(config.run, steps=args.steps)
    config.eval = dataclasses.replace(config.eval, before=False, after=False)
    seconds: dict[str, float] = {}
    steps: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, jobs in (("arms one after the other", 1), ("arms side by side", args.jobs)):
            started = time.perf_counter()
            _, _, histories = train_arms(config, ["igpo", "placebo"], args.seed,
                                         Path(scratch) / name.replace(" ", "_"), jobs=jobs)
            seconds[name] = time.perf_counter() - started
            steps[name] = {arm: [[step[key] for key in STEP_KEYS] for step in history]
                           for arm, history in histories.items()}
            print(f"{name}: {seconds[name]:.1f} s", flush=True)
    if steps["arms one after the other"] != steps["arms side by side"]:
        raise SystemExit("the arms trained differently side by side: the speeds are not "
                         "comparable")

    held_out = [HeldOut("world 0 test", config.env.kwargs(), "test", args.tasks)]
    played = {}
    for name, jobs in (("evaluation in one process", 1),
                       (f"evaluation in {args.jobs} processes", args.jobs)):
        started = time.perf_counter()
        result = paired_evaluate({"start": config.policy.path}, held_out, k=args.k,
                                 seed=args.seed, temperature=config.rollout.temperature,
                                 threads=config.policy.threads, log=None, groups_per_call=16,
                                 jobs=jobs)
        seconds[name] = time.perf_counter() - started
        played[name] = [[t.input_ids for t in group] for group in result["start"].per_task]
        print(f"{name}: {args.tasks} tasks x {args.k}: {seconds[name]:.1f} s", flush=True)
    one, many = played.values()
    if one != many:
        raise SystemExit("the two evaluations played different episodes: the speeds are not "
                         "comparable")
    names = list(seconds)
    print(f"RESULT arms_speedup={seconds[names[0]] / seconds[names[1]]:.3f}")
    print(f"RESULT eval_speedup={seconds[names[2]] / seconds[names[3]]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
