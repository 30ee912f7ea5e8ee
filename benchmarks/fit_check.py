"""Can RL fit at all? IGPO and its placebo on a fixed pool of training questions, played back.

    python benchmarks/fit_check.py --seed 0          # ~40 min on 2 idle cores
    python benchmarks/fit_check.py --seed 1 --lr 1e-3 --steps 12 --output runs/fit1

From the packaged warm start, with benchmarks/configs/fit_check_igpo.yaml (run.seed = --seed):

1. IGPO on a fixed pool of --pool training questions of world 0 (run.train_tasks: the
   first --pool tasks of the train split; every step draws its queries from the pool);
2. the placebo: the same config and seed with random-sign advantages (docs/algorithms.md);
3. the start, the IGPO policy and the placebo policy each play the same --pool questions
   --k times under the same sampling seeds (trainers.evaluation.paired), temperature 1.0.

This is the rung below the held-out check: the policies are evaluated on the questions they
trained on, so a gain is fitting, not generalisation. If the optimizer cannot raise pass@1
here, no held-out check can pass.

Prints the training curves (accuracy on the pool's questions per step), the paired tables,
and

    RESULT fit_gain_z=            (IGPO - start) / paired SE, pass@1 on the pool
    RESULT fit_placebo_gap_z=     (IGPO - placebo) / paired SE, pass@1 on the pool
    RESULT fit_pass1_start= / fit_pass1_igpo= / fit_pass1_placebo=
    RESULT fit_format_valid_gain_z=   (IGPO - start) / paired SE, format-valid turn rate

and writes results.json / results.md under --output. Every baseline (the start, the
placebo) is measured in the same run on the same tasks and seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

from rl_checks import add_jobs_argument, evaluate_arms, report_lines, resolve_jobs, train_arms

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "benchmarks" / "configs" / "fit_check_igpo.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0,
                        help="RL run seed (both arms) and the evaluation's sampling seed")
    parser.add_argument("--pool", type=int, default=16, help="training questions in the pool")
    parser.add_argument("--k", type=int, default=8, help="samples per question when played")
    parser.add_argument("--steps", type=int, default=None, help="RL steps (config: run.steps)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (config: learner.lr)")
    parser.add_argument("--arms", nargs="+", default=["igpo", "placebo"],
                        help="igpo, placebo, grpo")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--groups-per-call", type=int, default=8,
                        help="questions played at once in the evaluation (shared engine calls)")
    parser.add_argument("--output", default=None, help="default runs/fit_check/seed<S>")
    add_jobs_argument(parser)
    args = parser.parse_args(argv)
    jobs = resolve_jobs(args.jobs)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started_all = time.perf_counter()

    from trainers.evaluation.paired import HeldOut
    from trainers.rl.config import load_rl_config

    base = load_rl_config(args.config)
    base.run = dataclasses.replace(base.run, train_tasks=args.pool,
                                   steps=args.steps or base.run.steps)
    if args.lr is not None:
        base.learner = dataclasses.replace(base.learner, lr=args.lr)
    base.eval = dataclasses.replace(base.eval, before=False, after=False)
    output = Path(args.output or f"runs/fit_check/seed{args.seed}")
    output.mkdir(parents=True, exist_ok=True)
    print(f"start {base.policy.path}; {', '.join(args.arms)}: {base.run.steps} steps x "
          f"{base.rollout.queries_per_step} queries x G={base.rollout.group_size} from a pool "
          f"of {args.pool} train questions of world {base.env.world_seed}, lr {base.learner.lr}, "
          f"{base.learner.ppo_epochs} epochs x {base.learner.mini_batches} mini-batches, "
          f"seed {args.seed}", flush=True)
    finals, seconds, histories = train_arms(base, args.arms, args.seed, output,
                                           jobs=jobs)

    pool = [HeldOut(f"world {base.env.world_seed} train pool", base.env.kwargs(), "train",
                    args.pool)]
    runs, tables = evaluate_arms(base, finals, pool, k=args.k, seed=args.seed,
                                 temperature=1.0, groups_per_call=args.groups_per_call,
                                 seconds=seconds, jobs=jobs)
    seconds["total"] = time.perf_counter() - started_all
    lines = report_lines(
        f"Fit check, seed {args.seed}",
        f"Start `{base.policy.path}`; {base.run.steps} RL steps per arm on a pool of "
        f"{args.pool} train questions of world {base.env.world_seed}; the same questions "
        f"x k={args.k} at temperature 1.0 under the same sampling seeds for every policy; "
        "± bootstrap SE over questions.", histories, tables)
    lines += ["time: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()), ""]
    text = "\n".join(lines)
    (output / "results.md").write_text(text)
    (output / "results.json").write_text(json.dumps({
        "seed": args.seed, "steps": base.run.steps, "lr": base.learner.lr, "k": args.k,
        "pool": args.pool, "tables": {t: {m: d.as_dict() for m, d in table.items()}
                                      for t, table in tables.items()},
        "history": histories, "seconds": seconds}, indent=2, default=str))
    print("\n" + text)
    if "igpo" in finals:
        gain = tables["igpo vs start"]
        print(f"RESULT fit_gain_z={gain['pass@1'].z:.2f}")
        if "placebo" in finals:
            print(f"RESULT fit_placebo_gap_z={tables['igpo vs placebo']['pass@1'].z:.2f}")
            print(f"RESULT fit_pass1_placebo={tables['igpo vs placebo']['pass@1'].a:.3f}")
        print(f"RESULT fit_pass1_start={gain['pass@1'].a:.3f}")
        print(f"RESULT fit_pass1_igpo={gain['pass@1'].b:.3f}")
        print(f"RESULT fit_format_valid_gain_z={gain['format_valid_rate'].z:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
