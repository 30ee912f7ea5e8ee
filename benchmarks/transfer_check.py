"""Do trained policies beat their start on held-out tasks? Paired, sampled, no training.

    python benchmarks/transfer_check.py igpo=runs/fit/seed1/igpo/final \
        placebo=runs/fit/seed1/placebo/final          # the fit check's policies, held out

Every policy named NAME=DIR and the start (--start, default the config's policy.path) play
the same test-split tasks of the config's world (--num-tasks, 0 = all) k times at the
config's rollout temperature (or --temperature) under the same sampling seeds (trainers.evaluation.paired), with the
config's env settings; each policy is compared with the start (and with `placebo`, when one
is named so), with task-clustered paired SEs. Use it to ask whether what RL fitted on its
training questions (benchmarks/fit_check.py) carries over to questions it never saw.
Prints the tables and `RESULT <name>_<metric>_gain_z=` for each policy and headline metric.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "benchmarks" / "configs" / "fit_check_igpo.yaml"


def parse_policies(pairs: list[str]) -> dict[str, str]:
    """The positional NAME=DIR pairs: unique names, not 'start', saved policies."""
    from rl_checks import parse_named_dirs

    return parse_named_dirs(pairs, "policies", taken={"start": "the start's name"},
                            saved_policy=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policies", nargs="+", metavar="NAME=DIR", help="trained policies")
    parser.add_argument("--start", default=None, help="the start policy (default: the "
                                                      "config's policy.path)")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG),
                        help="RL config whose env settings and world the tasks come from")
    parser.add_argument("--k", type=int, default=2, help="samples per task and policy")
    parser.add_argument("--num-tasks", type=int, default=0, help="test tasks (0 = all)")
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed")
    parser.add_argument("--groups-per-call", type=int, default=8,
                        help="tasks played at once (shared engine calls)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature (default: the config's rollout.temperature)")
    args = parser.parse_args(argv)
    policies = parse_policies(args.policies)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    from trainers.evaluation.paired import HeldOut, compare, comparison_lines, paired_evaluate
    from trainers.rl.config import load_rl_config

    base = load_rl_config(args.config)
    start = args.start or base.policy.path
    temperature = base.rollout.temperature if args.temperature is None else args.temperature
    print(f"{', '.join(['start', *policies])} at temperature {temperature}, k={args.k}")
    held_out = [HeldOut(f"world {base.env.world_seed} test", base.env.kwargs(), "test",
                        args.num_tasks)]
    runs = paired_evaluate({"start": start, **policies}, held_out, k=args.k, seed=args.seed,
                           temperature=temperature, max_turn_tokens=base.rollout.max_turn_tokens,
                           max_context_tokens=base.rollout.max_context_tokens,
                           threads=base.policy.threads, groups_per_call=args.groups_per_call)
    results = []
    for name in policies:
        table = compare(runs["start"], runs[name], seed=args.seed)
        print(f"\n## {name} vs start ({start})\n")
        print("\n".join(comparison_lines(table, "start", name)))
        results += [f"RESULT {name}_{metric.replace('@', '')}_gain_z={d.z:.2f}"
                    for metric, d in table.items()]
        if "placebo" in policies and name != "placebo":
            gap = compare(runs["placebo"], runs[name], seed=args.seed)
            print(f"\n## {name} vs placebo\n")
            print("\n".join(comparison_lines(gap, "placebo", name)))
    print("\n" + "\n".join(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
