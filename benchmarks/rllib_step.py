"""RLlib's PPO iteration (trainers.integrations.rllib) against the project's own IGPO step,
same tiny policy, same world and budgets, in one process on the CPU.

    RAY_AUTH_MODE=disabled python benchmarks/rllib_step.py --steps 3

Baseline: `trainers.rl.driver.train` in-process (rollout workers 0, one learner), IGPO,
`--episodes` episodes per step (2 queries x G); its step time is rollout_s + learner_s from
metrics.jsonl (the held-out evaluation is left out). Measured: RLlib iterations with one
local env runner (2 sub-envs) and one local learner, `train_batch_size_per_learner` set so an
iteration plays about as many turns as a project step; its time is `algo.train()`'s wall
time. Both policies are random, so most turns are malformed and IG probes are few: this
times the machinery (generation, env, learner passes), not learning. Each side's first
step/iteration is dropped (warm-up). Prints RESULT lines: seconds per step / iteration,
turns per second and the ratio rllib / own of turns per second.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENV = {"world_size": 100, "world_seed": 1, "max_turns": 3, "max_context_tokens": 1500}


def own_steps(policy: str, output: Path, steps: int, group: int, turn_tokens: int,
              context: int) -> list[tuple[float, float]]:
    """(seconds, turns) per step of the project's in-process IGPO loop."""
    from trainers.rl.config import RLConfig
    from trainers.rl.driver import train

    config = RLConfig()
    config.policy.path, config.policy.threads = policy, 1
    config.env = dataclasses.replace(config.env, **ENV)
    config.rollout = dataclasses.replace(config.rollout, group_size=group, queries_per_step=2,
                                         max_turn_tokens=turn_tokens, max_context_tokens=context)
    config.learner = dataclasses.replace(config.learner, lr=1e-4, micro_batch_size=group)
    config.eval = dataclasses.replace(config.eval, num_tasks=1, before=False,
                                      max_turn_tokens=turn_tokens)
    config.run = dataclasses.replace(config.run, steps=steps, output_dir=str(output),
                                     progress_bar=False, tensorboard="off", save_every=steps,
                                     sample_trajectories=0)
    result = train(config)
    return [(h["rollout_s"] + h["learner_s"], h["mean_turns"] * 2 * group)
            for h in result.history]


def rllib_iterations(policy: str, iterations: int, batch_turns: int, turn_tokens: int,
                     context: int) -> list[tuple[float, float]]:
    """(seconds, turns) per RLlib PPO iteration."""
    from trainers.integrations.rllib import ppo_config

    config = ppo_config(policy, env={**ENV, "tool_timeout_s": 10.0},
                        max_turn_tokens=turn_tokens, max_context_tokens=context, seed=0,
                        num_envs=2, train_batch_turns=batch_turns,
                        minibatch_turns=batch_turns // 2, lr=1e-4)
    algo = config.build_algo()
    out = []
    try:
        for _ in range(iterations):
            started = time.perf_counter()
            result = algo.train()
            out.append((time.perf_counter() - started,
                        float(result["env_runners"]["num_env_steps_sampled"])))
    finally:
        algo.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="steps / iterations per side")
    parser.add_argument("--group", type=int, default=2, help="G of the project's step")
    parser.add_argument("--batch-turns", type=int, default=16, help="RLlib turns per batch")
    parser.add_argument("--turn-tokens", type=int, default=24, help="ids per turn at most")
    parser.add_argument("--context", type=int, default=2048, help="context budget (ids)")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from trainers.data.oracle_data import world_texts
    from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm

    with tempfile.TemporaryDirectory(prefix="rllib-bench-") as scratch:
        policy = Path(scratch) / "policy"
        tokenizer = build_chatml_tokenizer(world_texts(ENV), vocab_size=600)
        build_tiny_causal_lm(tokenizer, hidden=64, layers=2, seed=0).save_pretrained(policy)
        tokenizer.save_pretrained(policy)
        own = own_steps(str(policy), Path(scratch) / "own", args.steps + 1, args.group,
                        args.turn_tokens, args.context)[1:]
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            rllib = rllib_iterations(str(policy), args.steps + 1, args.batch_turns,
                                     args.turn_tokens, args.context)[1:]
        finally:
            ray.shutdown()
    own_s = statistics.mean(s for s, _ in own)
    rllib_s = statistics.mean(s for s, _ in rllib)
    own_tps = sum(t for _, t in own) / sum(s for s, _ in own)
    rllib_tps = sum(t for _, t in rllib) / sum(s for s, _ in rllib)
    print(f"RESULT own_step_s={own_s:.2f}")
    print(f"RESULT own_turns_per_step={statistics.mean(t for _, t in own):.1f}")
    print(f"RESULT rllib_iteration_s={rllib_s:.2f}")
    print(f"RESULT rllib_turns_per_iteration={statistics.mean(t for _, t in rllib):.1f}")
    print(f"RESULT own_turns_per_s={own_tps:.2f}")
    print(f"RESULT rllib_turns_per_s={rllib_tps:.2f}")
    print(f"RESULT rllib_vs_own_turns_per_s={rllib_tps / own_tps:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
