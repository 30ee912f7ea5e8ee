"""How many held-out tasks the paired evaluation should play at once on this machine.

    python benchmarks/eval_batching.py                       # 16 tasks x k 2, 8 vs 16 at once
    python benchmarks/eval_batching.py --tasks 24 --baseline 8 --candidate 24

The learning check's evaluation (trainers.evaluation.paired.paired_evaluate) plays
`groups_per_call` tasks at once, their turns sharing engine calls; the episodes are the same
either way (each task keeps its own sampling seed; checked here on every token id). A wider
call amortises the per-step overhead over more rows, but every row waits for the call's
longest turn and pads to its longest context. The packaged warm start plays the first
--tasks tasks of world 0's test split, k samples each at the learning check's temperature,
once with --baseline tasks a call and once with --candidate (the baseline first, both in
this process). Prints each run's seconds and

    RESULT eval_batching_speedup=<float>   baseline seconds / candidate seconds
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parent / "configs" / "learning_check_igpo.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=16, help="tasks of world 0's test split")
    parser.add_argument("--k", type=int, default=2, help="samples per task")
    parser.add_argument("--baseline", type=int, default=8, help="tasks a call, the baseline")
    parser.add_argument("--candidate", type=int, default=16, help="tasks a call, the candidate")
    parser.add_argument("--seed", type=int, default=0, help="the evaluation's sampling seed")
    args = parser.parse_args(argv)
    if min(args.tasks, args.k, args.baseline, args.candidate) < 1:
        raise SystemExit("--tasks, --k, --baseline and --candidate must be >= 1")

    from trainers.evaluation.paired import HeldOut, paired_evaluate
    from trainers.rl.config import load_rl_config

    config = load_rl_config(str(CONFIG))
    held_out = [HeldOut("world 0 test", config.env.kwargs(), "test", args.tasks)]
    seconds, played = {}, {}
    for name, width in (("baseline", args.baseline), ("candidate", args.candidate)):
        started = time.perf_counter()
        result = paired_evaluate({"start": config.policy.path}, held_out, k=args.k,
                                 seed=args.seed, temperature=config.rollout.temperature,
                                 threads=config.policy.threads, log=None,
                                 groups_per_call=width)
        seconds[name] = time.perf_counter() - started
        played[name] = [[t.input_ids for t in group] for group in result["start"].per_task]
        print(f"{name}: {width} tasks a call, {args.tasks} tasks x {args.k}: "
              f"{seconds[name]:.1f} s", flush=True)
    if played["baseline"] != played["candidate"]:
        raise SystemExit("the two runs played different episodes: the speeds are not comparable")
    print(f"RESULT eval_batching_speedup={seconds['baseline'] / seconds['candidate']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
