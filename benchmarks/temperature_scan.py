"""Which sampling temperature should RL roll out (and evaluate) a policy at?

    python benchmarks/temperature_scan.py --policy warm-start --temperatures 1.0 0.8 0.6 --k 4

Plays the policy on held-out tasks (test splits of --worlds, with the env settings its
warm_start.json records) k times per task at each temperature, with the same tasks and
sampling seeds, and prints per temperature: format-valid turn rate, pass@1 and answer rate
with task-clustered SEs, and `mixed_share`: the share of tasks whose k samples hold both a
correct and a wrong answer. RL with group-normalised outcomes learns only from mixed groups
(a group all right or all wrong has zero outcome advantage), so the rollout temperature
trades the start's accuracy (lower is better) against mixed groups (sampling must still
vary). The learner scores logits / the rollout temperature, so any temperature keeps the
PPO ratio exact (docs/engines.md).

Prints `RESULT T<t>_<metric>=` lines and a markdown table.
"""

from __future__ import annotations

import argparse
import time

from trainers.evaluation.paired import HEADLINE, METRICS, paired_evaluate
from trainers.evaluation.stats import bootstrap_se
from trainers.modeling.warm_start import policy_env, policy_record
from trainers.sft.warm_start_package import (
    EVAL_CONTEXT_TOKENS,
    ROLLOUT_CONTEXT_TOKENS,
    held_out_sets,
)


def mixed_share(groups: list) -> float:
    """Share of tasks whose samples hold both a correct and a wrong outcome."""
    mixed = [len({(t.outcome or 0) >= 0.5 for t in g}) == 2 for g in groups if len(g) > 1]
    return sum(mixed) / len(mixed) if mixed else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="warm-start")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[1.0, 0.8, 0.6])
    parser.add_argument("--worlds", nargs="+", type=int, default=[0])
    parser.add_argument("--k", type=int, default=4, help="samples per task (>= 2)")
    parser.add_argument("--num-tasks", type=int, default=0, help="tasks per world (0 = all)")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--max-turn-tokens", type=int, default=320)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--groups-per-call", type=int, default=8)
    args = parser.parse_args(argv)
    if args.k < 2:
        parser.error("--k must be >= 2 (mixed_share needs several samples per task)")
    record = policy_record(args.policy)
    env = {**policy_env(args.policy), "max_turns": args.max_turns,
           "max_context_tokens": EVAL_CONTEXT_TOKENS}
    if record.get("world_size"):
        env["world_size"] = record["world_size"]
    held_out = held_out_sets(env, args.worlds)
    for held in held_out:
        held.num_tasks = args.num_tasks
    rows = ["| temperature | format-valid | pass@1 | answer rate | mixed tasks | seconds |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for temperature in args.temperatures:
        started = time.perf_counter()
        run = paired_evaluate({"policy": args.policy}, held_out, k=args.k, seed=args.seed,
                              temperature=temperature, max_turn_tokens=args.max_turn_tokens,
                              max_context_tokens=ROLLOUT_CONTEXT_TOKENS, log=None,
                              groups_per_call=args.groups_per_call)["policy"]
        seconds = time.perf_counter() - started
        groups = run.per_task
        cells = []
        for metric in ("format_valid_rate", "pass@1", "answer_rate"):
            value, se = METRICS[metric](groups), bootstrap_se(groups, METRICS[metric])
            cells.append(f"{value:.3f} ± {se:.3f}")
            print(f"RESULT T{temperature:g}_{metric.replace('@', '')}={value:.4f}")
        mixed = mixed_share(groups)
        print(f"RESULT T{temperature:g}_mixed_share={mixed:.3f}", flush=True)
        rows.append(f"| {temperature:g} | " + " | ".join(cells) +
                    f" | {mixed:.2f} | {seconds:.0f} |")
    print(f"\n{args.policy}: {len(groups)} tasks ({', '.join(h.name for h in held_out)}) x "
          f"k={args.k}, seed {args.seed}; ± task-clustered bootstrap SE "
          f"(headline metrics: {', '.join(HEADLINE)})\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
