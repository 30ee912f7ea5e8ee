"""Processes or threads: how the learning and fit checks should use a small machine's cores.

    python benchmarks/parallel_checks.py                 # 2 RL steps per arm, 32 tasks x k 2
    python benchmarks/parallel_checks.py --steps 1 --tasks 16 --jobs 2

The checks (benchmarks/learning_check.py, benchmarks/fit_check.py) train two RL arms from one
start and then play every policy on the same held-out tasks. With `--jobs N` they train the
arms side by side, one process each with policy.threads // N torch threads, and deal the
tasks out to N processes (trainers.evaluation.paired.paired_evaluate); with `--jobs 1`, one
process does it all with policy.threads threads. The policy is small (hidden size 128), so
a matrix product is too short for two intra-op threads to halve it, while two processes each
keep a core busy. Both ways play the same episodes as long as no sampled token flips: the
learner's sums are added in another order at one thread than at two, so its loss, KL and
gradient norm differ in the third or fourth significant digit. Checked here: every step's
sampled outcomes (accuracy, format-error rate) must agree exactly, the learner's numbers are
reported as their largest relative difference, and the evaluation's episodes are compared
token for token (the count of identical ones is printed).

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
SAMPLED_KEYS = ("accuracy", "format_error_rate")  # set by the sampled episodes alone
LEARNER_KEYS = ("kl", "grad_norm", "entropy")      # the learner's sums: rounding may differ


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
    steps: dict[str, dict[str, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, jobs in (("arms one after the other", 1), ("arms side by side", args.jobs)):
            started = time.perf_counter()
            _, _, histories = train_arms(config, ["igpo", "placebo"], args.seed,
                                         Path(scratch) / name.replace(" ", "_"), jobs=jobs)
            seconds[name] = time.perf_counter() - started
            steps[name] = histories
            print(f"{name}: {seconds[name]:.1f} s", flush=True)
    one_by_one, side_by_side = steps.values()
    for arm in one_by_one:
        pairs = list(zip(one_by_one[arm], side_by_side[arm]))
        if any(a[key] != b[key] for a, b in pairs for key in SAMPLED_KEYS):
            raise SystemExit(f"the {arm} arm sampled other episodes side by side: the speeds "
                             "are not comparable")
        drift = max(abs(a[key] - b[key]) / max(abs(a[key]), 1e-12)
                    for a, b in pairs for key in LEARNER_KEYS)
        print(f"{arm}: the same sampled outcomes every step; the learner's "
              f"{'/'.join(LEARNER_KEYS)} differ by at most {drift:.1e} (relative)", flush=True)

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
    same = sum(a == b for group_a, group_b in zip(one, many) for a, b in zip(group_a, group_b))
    print(f"episodes identical token for token: {same} of {args.tasks * args.k}", flush=True)
    if same < 0.9 * args.tasks * args.k:
        raise SystemExit("the two evaluations played mostly different episodes: the speeds "
                         "are not comparable")
    names = list(seconds)
    print(f"RESULT arms_speedup={seconds[names[0]] / seconds[names[1]]:.3f}")
    print(f"RESULT eval_speedup={seconds[names[2]] / seconds[names[3]]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
