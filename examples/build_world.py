"""Generate an embedded research world, save it as inspectable JSONL, and use it by path.

    python examples/build_world.py --pages 10000 --seed 7 --out runs/world-10k

Writes corpus.jsonl (one page per line), tasks.jsonl (one question per line, with its
gold path) and world.json, then opens the saved world in DeepResearch-v0.
"""

import argparse
import time
from collections import Counter

import gymnasium as gym

import envs  # noqa: F401  (registers the environments)
from venus_gym.worlds import load_world


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="runs/world-10k")
    args = ap.parse_args()

    t0 = time.perf_counter()
    world = load_world("synthetic", n_pages=args.pages, seed=args.seed)
    world.save(args.out)
    print(f"{len(world.corpus)} pages, {len(world.tasks)} tasks saved to {args.out} "
          f"in {time.perf_counter() - t0:.1f} s")
    print("hop counts:", dict(sorted(Counter(t.hops for t in world.tasks).items())))
    task = world.tasks[-1]
    print(f"example {task.hops}-hop question: {task.question}  ->  {task.answers[0]}")

    env = gym.make("DeepResearch-v0", world=args.out)
    question, info = env.reset(seed=0)
    print(f"env over the saved world: task {info['task_id']}: {question}")


if __name__ == "__main__":
    main()
