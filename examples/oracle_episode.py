"""Run the oracle agent through DeepResearch-v0 and print one episode turn by turn.

    python examples/oracle_episode.py --hops 3 --detour-prob 0.5

The oracle follows the task's gold path (search the entity, visit its page, read the
fact, move on) and answers only what the environment showed it; `--detour-prob` adds
dead ends and backtracking, as used for long SFT trajectories.
"""

import argparse

import gymnasium as gym

import envs  # noqa: F401  (registers the environments)
from venus_gym.worlds.oracle import OracleAgent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hops", type=int, default=3, choices=[1, 2, 3, 4])
    ap.add_argument("--detour-prob", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    env = gym.make("DeepResearch-v0", hops=(args.hops,), render_mode="ansi")
    obs, info = env.reset(seed=args.seed)
    agent = OracleAgent(env.unwrapped.task, rng_seed=args.seed, detour_prob=args.detour_prob)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, info = env.step(agent.act(obs))
        total += reward
        done = terminated or truncated
    print(env.render())
    print(f"\nturns: {info['turn']}  reward: {total:+.2f}  "
          f"gold: {env.unwrapped.task.answers[0]!r}")


if __name__ == "__main__":
    main()
