"""RLlib's PPO (new API stack) on DeepResearch-v0 with a tiny from-scratch policy, on CPU.

    RAY_AUTH_MODE=disabled python examples/rllib_igpo.py --iterations 2

Builds the generated world, a tokenizer trained on its text and a tiny Qwen3-shaped model
(trainers.modeling.models), saves them as a policy directory, then trains with
`trainers.integrations.rllib.ppo_config` for `--iterations` RLlib iterations on
`ray.init(num_cpus=2)`. Prints one line per iteration and, at the end,
`RESULT rllib_iterations=N` with the last iteration's episode metrics: mean return, mean
episode length (turns), format-valid rate (valid turns / turns), answer rate, seconds per
iteration. The policy is untrained, so expect malformed turns and returns near
-format_penalty per turn: this shows the path works, not that RLlib learns the task
(docs/rllib.md). Despite the file name, the algorithm is RLlib's PPO on the environment's
rewards; IGPO's information-gain rewards need `venus-gym rl` (docs/rllib.md says why).
Needs `pip install -e .[train,rllib]`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any


def build_policy(directory: Path, env_kwargs: dict[str, Any], *, vocab_size: int, hidden: int,
                 layers: int, seed: int) -> Path:
    """Save a tokenizer trained on the world's text and a random tiny model to `directory`."""
    from envs.deep_research import DeepResearchEnv
    from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm

    env = DeepResearchEnv(**env_kwargs)
    texts = [env.system_prompt] + [f"{p.title}\n{p.text}" for p in env.world.corpus]
    texts += [task.question for task in env.world.tasks]
    env.close()
    tokenizer = build_chatml_tokenizer(texts, vocab_size=vocab_size)
    model = build_tiny_causal_lm(tokenizer, hidden=hidden, layers=layers, seed=seed)
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
    return directory


def episode_metrics(result: dict[str, Any]) -> dict[str, float]:
    runners = result.get("env_runners", {})
    names = {"episode_return_mean": "mean_return", "episode_len_mean": "episode_length",
             "format_valid_rate": "format_valid_rate", "answered": "answer_rate",
             "answer_score": "answer_score", "num_episodes": "episodes"}
    out = {short: float(runners[key]) for key, short in names.items() if key in runners}
    learner = result.get("learners", {}).get("default_policy", {})
    out.update({k: float(learner[k]) for k in ("policy_loss", "vf_loss") if k in learner})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=2, help="RLlib training iterations")
    parser.add_argument("--world-size", type=int, default=100, help="pages of the world")
    parser.add_argument("--max-turns", type=int, default=3, help="env turn budget")
    parser.add_argument("--turn-tokens", type=int, default=24, help="ids per turn at most")
    parser.add_argument("--batch-turns", type=int, default=16,
                        help="turns per training batch (train_batch_size_per_learner)")
    parser.add_argument("--num-envs", type=int, default=2, help="sub-envs of the env runner")
    parser.add_argument("--hidden", type=int, default=64, help="tiny model hidden size")
    parser.add_argument("--layers", type=int, default=2, help="tiny model layers")
    parser.add_argument("--vocab", type=int, default=600, help="tokenizer vocabulary bound")
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate")
    parser.add_argument("--seed", type=int, default=0, help="model and sampling seed")
    parser.add_argument("--policy", default="", help="an existing policy directory to train "
                        "instead of a new tiny model")
    args = parser.parse_args(argv)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from trainers.integrations.rllib import ppo_config

    # The env's context budget (forced final answer) sits below the rollout's hard cap, so
    # the forced final turn fits (docs/rl.md).
    env_kwargs = {"world_size": args.world_size, "world_seed": 1, "max_turns": args.max_turns,
                  "max_context_tokens": 1500, "tool_timeout_s": 10.0}
    with tempfile.TemporaryDirectory(prefix="rllib-policy-") as scratch:
        policy = Path(args.policy) if args.policy else build_policy(
            Path(scratch), env_kwargs, vocab_size=args.vocab, hidden=args.hidden,
            layers=args.layers, seed=args.seed)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            config = ppo_config(str(policy), env=env_kwargs, max_turn_tokens=args.turn_tokens,
                                seed=args.seed, num_envs=args.num_envs,
                                train_batch_turns=args.batch_turns,
                                minibatch_turns=max(1, args.batch_turns // 2), lr=args.lr)
            started = time.perf_counter()
            algo = config.build_algo()
            print(f"built the algorithm in {time.perf_counter() - started:.1f}s", flush=True)
            metrics: dict[str, float] = {}
            seconds = []
            for iteration in range(1, args.iterations + 1):
                started = time.perf_counter()
                result = algo.train()
                seconds.append(time.perf_counter() - started)
                metrics = episode_metrics(result)
                shown = " ".join(f"{k}={v:.3f}" for k, v in metrics.items())
                print(f"iteration {iteration}: {seconds[-1]:.1f}s {shown}", flush=True)
            algo.stop()
        finally:
            ray.shutdown()
    shown = " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
    print(f"RESULT rllib_iterations={args.iterations} {shown} "
          f"seconds_per_iteration={sum(seconds) / len(seconds):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
