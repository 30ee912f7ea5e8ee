"""Environment speed on a 50,000-page embedded world, against rank-bm25 in the same run.

    python benchmarks/env_speed.py [--pages 50000] [--queries 2000] [--episodes 300]

Prints, in order:
    RESULT search_qps=<float>        our local index, one query at a time, top-10 + snippets
    RESULT baseline_qps=<float>      rank-bm25 (BM25Okapi) over the same corpus and queries
    RESULT env_steps_per_s=<float>   DeepResearch-v0 driven by the oracle agent
    RESULT search_speedup=<float>    search_qps / baseline_qps

Measurements run pinned to one CPU core (where the OS allows) after the world and both
indexes are built. Targets (issue 2): search_speedup >= 100, env_steps_per_s >= 1,000.
"""

from __future__ import annotations

import argparse
import os
import re
import time

import gymnasium as gym
import numpy as np

import envs  # noqa: F401  (registers the environments)
from venus_gym.tools import LocalSearchIndex
from venus_gym.worlds import load_world
from venus_gym.worlds.oracle import OracleAgent

_TOKEN = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def make_queries(world, n: int, seed: int) -> list[str]:
    """What agents search for: entity names on gold paths, plus raw questions."""
    rng = np.random.default_rng(seed)
    pool = [hop["entity"] for t in world.tasks for hop in t.gold_path]
    pool += [t.question for t in world.tasks]
    return [pool[i] for i in rng.integers(len(pool), size=n)]


def time_queries(search, queries: list[str], min_seconds: float = 2.0) -> float:
    """Queries per second of `search(q)` over the list, repeated until min_seconds passed."""
    done, t0 = 0, time.perf_counter()
    while True:
        for q in queries:
            search(q)
        done += len(queries)
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            return done / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=50_000)
    ap.add_argument("--queries", type=int, default=2000, help="queries for our index")
    ap.add_argument("--baseline-queries", type=int, default=40,
                    help="queries for rank-bm25 (a subset: it is slow)")
    ap.add_argument("--episodes", type=int, default=300, help="oracle episodes")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from rank_bm25 import BM25Okapi

    t0 = time.perf_counter()
    world = load_world("synthetic", n_pages=args.pages, seed=args.seed)
    t_world = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = LocalSearchIndex(world.corpus)
    t_index = time.perf_counter() - t0
    t0 = time.perf_counter()
    baseline = BM25Okapi([tokenize(p.title + " " + p.text) for p in world.corpus])
    t_baseline = time.perf_counter() - t0
    print(f"# world: {len(world.corpus)} pages, {len(world.tasks)} tasks in {t_world:.1f} s; "
          f"index {t_index:.1f} s; rank-bm25 index {t_baseline:.1f} s")

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        print(f"# pinned to CPU {sorted(os.sched_getaffinity(0))}")

    queries = make_queries(world, args.queries, args.seed)
    ours = time_queries(lambda q: index.search(q, 10), queries)
    print(f"RESULT search_qps={ours:.1f}")

    def baseline_search(q: str):
        scores = baseline.get_scores(tokenize(q))
        return np.argsort(-scores)[:10]

    base = time_queries(baseline_search, queries[: args.baseline_queries], min_seconds=5.0)
    print(f"RESULT baseline_qps={base:.2f}")

    env = gym.make("DeepResearch-v0", world=world)
    tasks = env.unwrapped.tasks
    steps, t0 = 0, time.perf_counter()
    solved, hops = 0, []
    for ep in range(args.episodes):
        task = tasks[(ep * len(tasks)) // args.episodes]  # spread over all hop counts
        obs, _ = env.reset(seed=ep, options={"task_id": task.id})
        agent = OracleAgent(task, rng_seed=ep)
        done = False
        while not done:
            obs, reward, term, trunc, info = env.step(agent.act(obs))
            steps += 1
            done = term or trunc
        solved += info.get("score", 0.0) == 1.0
        hops.append(task.hops)
    elapsed = time.perf_counter() - t0
    print(f"# oracle solved {solved}/{args.episodes} episodes in {steps} steps "
          f"(hop counts {sorted(set(hops))})")
    print(f"RESULT env_steps_per_s={steps / elapsed:.1f}")
    print(f"RESULT search_speedup={ours / base:.1f}")


if __name__ == "__main__":
    main()
